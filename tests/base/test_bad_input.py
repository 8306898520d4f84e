"""Every kind of bad input gets one clear message naming the field and the fix: no traceback, nothing
submitted, nothing lost. Each case below is a row of docs/errors.md, which is generated from the
messages these tests see (regenerate with TINYGPT_REGEN_DOCS=1 python -m pytest tests/base/test_bad_input.py).
"""

import contextlib
import io
import os
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tinygpt import sample, train
from tinygpt.launch.commands import cli

DOC = ROOT / "docs" / "errors.md"

# (id, where, input, expected excerpt). `train` inputs are trainer flags; `spec` inputs are a spec file's text.
CASES = [
    ("unknown-flag", "train", "--n-layers 4", "unknown option --n-layers (did you mean `n_layer`?)"),
    ("unknown-key", "spec", "name: s\ntrain: {n_embed: 64}\n", "unknown key `n_embed` (did you mean `n_embd`?)"),
    ("wrong-type", "train", "--batch-size twelve", "batch_size: expected a whole number, got 'twelve'"),
    ("wrong-type-bool", "train", "--bias maybe", "bias: expected true or false"),
    ("negative-lr", "train", "--lr -0.001", "lr: must be in (0, 1], got -0.001"),
    ("dropout-1", "train", "--dropout 1.0", "dropout: must be in [0, 1), got 1.0"),
    ("unknown-optimizer", "spec", "name: s\ntrain: {optimizer: muom}\n",
     "optimizer: expected one of adamw or muon, got 'muom'"),
    ("heads-divide", "train", "--n-embd 100 --n-head 3", "n_embd: 100 is not divisible by n_head 3"),
    ("min-lr-above-lr", "train", "--lr 1e-4 --min-lr 1e-3", "min_lr: 0.001 is above lr 0.0001"),
    ("block-too-long", "train", "--data-file {tiny} --block-size 2000", "block_size: the val split"),
    ("missing-data", "train", "--data-file {tmp}/nope.txt", "data_file: {tmp}/nope.txt does not exist"),
    ("empty-data", "train", "--data-file {empty}", "data_file: {empty} is empty"),
    ("not-utf8", "train", "--data-file {latin1}", "is not UTF-8 text"),
    ("resume-missing", "train", "--resume {tmp}/nope.pt", "resume: checkpoint {tmp}/nope.pt does not exist"),
    ("yaml-syntax", "spec", "name: s\ntrain: {n_layer: 2\ngrid: {}\n", "YAML syntax error"),
    ("unknown-profile", "spec", "name: s\ncluster: a100\n", "unknown cluster profile `a100`"),
    ("too-many-gpus", "spec", "name: s\ncluster: a100-example\nresources: {gpus_per_node: 8}\n",
     "resources.gpus_per_node: 8 GPUs asked, but a node of cluster profile `a100-example` has 4"),
    ("gpus-on-a-cpu-cluster", "spec", "name: s\nresources: {gpus_per_node: 1}\n",
     "resources.gpus_per_node: 1 GPUs asked, but the nodes of cluster profile `local` have no GPUs"),
    ("mem-zero", "spec", "name: s\nresources: {mem: '0'}\n",
     "Slurm reads a memory request of 0 as all of each node's memory"),
    ("time-over-max", "spec", "name: s\ncluster: a100-example\nresources: {time: '7-00:00:00'}\n",
     "resources.time: 7-00:00:00 is over the maximum 2-00:00:00 of partition `gpu`"),
    ("unknown-partition", "spec", "name: s\nresources: {partition: gpu}\n", "unknown partition `gpu`"),
    ("placement-way", "spec", "name: s\nplacement: {soonest: [{partition: debug}, {partition: gpu}]}\n",
     "placement.soonest[1].partition: unknown partition `gpu`"),
    ("placement-one-way", "spec", "name: s\nplacement: {soonest: [{partition: debug}]}\n",
     "placement.soonest: expected at least 2 item(s)"),
    ("empty-grid", "spec", "name: s\ngrid: {}\n", "grid: is empty"),
    ("duplicate-run-name", "spec", "name: s\nruns:\n  - {name: a, lr: 0.001}\n  - {name: a, lr: 0.002}\n",
     "run name `a` is used twice"),
    ("path-escape", "spec", "name: ../../etc\n", "'../../etc' cannot be used as a file or job name"),
    ("shell-escape", "spec", "name: s\nruns:\n  - {name: \"x; rm -rf ~\"}\n", "cannot be used as a file or job name"),
    ("out-dir-in-spec", "spec", "name: s\ntrain: {out_dir: /tmp/elsewhere}\n", "`out_dir` is set by the launcher"),
    ("missing-data-spec", "spec", "name: s\ntrain: {data_file: {tmp}/nope.txt}\n",
     "data_file: {tmp}/nope.txt does not exist"),
    ("data-not-a-file", "train", "--data-file /dev/zero", "data_file: /dev/zero is not a regular file"),
    ("empty-spec", "spec", "", "the spec is empty"),
    ("partition-not-mapping", "spec", "name: s\ncluster: {partition_str}\n",
     "partitions.gpu: expected a mapping of keys to values, got 'fast'"),
    ("max-nodes-not-number", "spec", "name: s\ncluster: {max_nodes_str}\n",
     "partitions.gpu.max_nodes: expected a whole number, got 'four'"),
    ("container-args-quote", "spec", "name: s\ncluster: {container_quote}\n",
     "container.args: \"--bind '/a\" cannot be split into words (No closing quotation); balance its quotes"),
    ("profile-node-key", "spec", "name: s\ncluster: {node_key}\n",
     "unknown key `node.gpu` (did you mean `gpus`?); valid keys of `node` are"),
    ("data-dir-unwritable", "spec", "name: s\ntrain: {data_file: {tiny}, data_dir: /proc/nope}\n",
     "data_dir: cannot write the prepared data under '/proc/nope'"),
    ("sbatch-option-prefix", "spec", "name: s\nresources: {sbatch_options: {hol: true}}\n",
     "sbatch reads `--hol` as `--hold`"),
    ("sbatch-option-twice", "spec", "name: s\nresources: {sbatch_options: {mail-type: END, mail_type: BEGIN}}\n",
     "`mail-type` and `mail_type` are the same option"),
    ("sbatch-value-line-break", "spec", "name: s\nresources: {exclude: \"node1\\n#SBATCH --hold\"}\n",
     "resources.exclude: 'node1\\n#SBATCH --hold' (for --exclude) holds a line break"),
    ("submitit-value-backslash", "spec", "name: s\nbackend: submitit\nresources: {constraint: 'a\\b'}\n",
     "holds a backslash, which sbatch takes as an escape"),
    ("srun-args-command", "spec", "name: s\nresources: {srun_args: [hostname]}\n", "'hostname' is not an option"),
    ("snapshot-limit", "spec", "name: s\nsnapshot_max_file_mb: 0\n",
     "snapshot_max_file_mb: must be in (0, 1,000,000,000) (megabytes: the largest tracked file a code snapshot "
     "copies), got 0"),
    ("search-choice-fails", "spec", "name: s\ntrain: {n_embd: 32}\nsearch: {method: optuna, trials: 2, params: "
     "{n_head: {choice: [2, 3, 4]}}}\n", "search.params: a trial may get n_head=3, and then n_embd: 32 is not"),
    ("wandb-project", "spec", "name: s\ntrain: {loggers: [wandb], wandb_project: team/runs}\n",
     "wandb_project: 'team/runs' is not a name W&B takes: 1 to 128 characters, none of / \\ # ? % :"),
    ("seed-range", "train", "--seed 18446744073709551616",
     "seed: must be from 0 to 9,007,199,254,740,991, got 18446744073709551616"),
    ("spec-resume-missing", "spec", "name: s\ntrain: {resume: /nonexistent/step_00000100.pt}\n",
     "resume: /nonexistent/step_00000100.pt does not exist; check the path"),
    ("spec-data-dir", "spec", "name: s\ntrain: {data_dir: /dev/null/data}\n",
     "data_dir: '/dev/null/data' cannot hold the prepared data (/dev/null is not a directory)"),
    ("optuna-seed", "spec", "name: s\nsearch: {method: optuna, trials: 2, workers: 2, seed: -1, params: "
     "{lr: {loguniform: [1.0e-4, 1.0e-2]}}}\n", "search.seed: an Optuna search's seed must be from 0 to 2^32"),
    ("retry-rounds", "spec", "name: s\nretry: {rounds: -1}\n", "retry.rounds: must be from 0 to 100, got -1"),
    ("retry-factor", "spec", "name: s\nretry: {mem_factor: 0}\n", "retry.mem_factor: must be in (1, 100], got 0"),
    ("retry-time-over-partition", "spec",
     "name: s\nresources: {partition: short, time: 10}\nretry: {max_time: '01:00:00'}\n",
     "retry.max_time: 01:00:00 is over the MaxTime 00:30:00 of partition `short`; ask for at most that"),
    ("retry-the-program", "spec", "name: s\nretry: {ends: [time_limit, program]}\n",
     "`program` (a failure of the program itself) is never retried"),
    ("retry-notify-words", "spec", "name: s\nretry: {notify: {command: [curl, '{run_dir}']}}\n",
     "retry.notify.command: command[1]: {run_dir} is not one of {summary}, {sweep}, {headline}"),
    ("retry-mail", "spec", "name: s\nretry: {notify: {mail: 'me; rm -rf ~'}}\n",
     "retry.notify.mail: 'me; rm -rf ~' is not a mail address for sbatch --mail-user"),
    ("sample-top-k", "sample", "--top-k -3", "--top-k: must be >= 0 (0: all characters), got -3"),
    ("sample-temperature", "sample", "--temperature nan", "--temperature: must be a number from 0.01 to 100, got nan"),
    ("sample-device", "sample", "--device banana", "--device: must be cpu, cuda or cuda:N, got 'banana'"),
]

# Cluster profiles for the cases above that need one (a profile is a file of its own).
PROFILES = {
    "partition_str": "name: p\npartitions: {gpu: fast}\n",
    "max_nodes_str": "name: p\npartitions: {gpu: {max_nodes: four}}\n",
    "node_key": "name: p\npartitions: {debug: {}}\nnode: {gpu: 4}\n",
    "container_quote": "name: p\npartitions: {debug: {}}\ncontainer: {image: x.sif, args: \"--bind '/a\"}\n",
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[int, str, dict]]:
    """Run every case once: {case id: (exit status, stderr, file names used)}."""
    from tests.support.tiny import TINY_TEXT

    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "tiny.txt").write_text(TINY_TEXT)
    (tmp / "empty.txt").write_text("")
    (tmp / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    files = {"tmp": str(tmp), "tiny": str(tmp / "tiny.txt"), "empty": str(tmp / "empty.txt"),
             "latin1": str(tmp / "latin1.txt")}
    for key, text in PROFILES.items():
        (tmp / f"{key}.yaml").write_text(text)
        files[key] = str(tmp / f"{key}.yaml")
    results = {}
    old = os.environ.get("TINYGPT_OFFLINE")
    os.environ["TINYGPT_OFFLINE"] = "1"
    try:
        for case_id, where, given, _ in CASES:
            work = tmp / case_id
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                if where == "train":
                    code = train.main([*fill(given, files).split(), "--out-dir", str(work / "run"), "--max-steps",
                                       "5", "--data-dir", str(tmp / "data"), "--threads", "1"])
                    wrote = (work / "run" / "checkpoints").exists()
                elif where == "sample":
                    code = sample.main(["--run", str(work / "run"), *fill(given, files).split()])
                    wrote = (work / "run").exists()
                else:
                    spec = tmp / f"{case_id}.yaml"
                    spec.write_text(fill(given, files))
                    code = cli.main([str(spec), "--workdir", str(work)])
                    wrote = (work / "jobs").exists()
            results[case_id] = (code, err.getvalue(), files, wrote)
    finally:
        if old is None:
            os.environ.pop("TINYGPT_OFFLINE")
    return results


def fill(text: str, files: dict) -> str:
    for key, value in files.items():
        text = text.replace("{" + key + "}", value)
    return text


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_message(case, outcomes):
    case_id, _, _, expected = case
    code, err, files, wrote = outcomes[case_id]
    assert code in (1, 2)
    assert err.startswith("error: ") and "Traceback" not in err
    assert fill(expected, files) in err, err
    assert not wrote  # nothing written or submitted before the error


def render_doc(outcomes) -> str:
    lines = [
        "# Bad input and what it says",
        "",
        "Every row is a test in `tests/base/test_bad_input.py`; the messages are the real ones (temporary paths",
        "shown as `<tmp>`, the repository as `<repo>`, the user's configuration folder as `~/.config`). Regenerate",
        "after changing a message:",
        "`TINYGPT_REGEN_DOCS=1 python -m pytest tests/base/test_bad_input.py`.",
        "",
        "Trainer errors exit with status 2 (configuration) or 1 (data, checkpoints, hardware); launcher",
        "errors exit with status 1 and nothing is written or submitted. No traceback for any of them.",
        "",
        "| case | where | input | message |",
        "| --- | --- | --- | --- |",
    ]
    for case_id, where, given, _ in CASES:
        shown = given.replace("\n", "⏎ ").replace("|", "\\|")
        code, err, files, _ = outcomes[case_id]
        message = err.strip().replace(files["tmp"], "<tmp>").replace(str(ROOT), "<repo>")
        message = message.replace(os.environ["XDG_CONFIG_HOME"], "~/.config")
        shown = fill(shown, {key: f"<tmp>/{key}.yaml" for key in PROFILES})
        message = message.replace(str(Path.cwd()), "<cwd>").replace("\n", "<br>").replace("|", "\\|")
        where_text = {"train": "`python -m tinygpt.train`", "sample": "`python -m tinygpt.sample --run DIR`",
                      "spec": "`python launch.py SPEC`"}[where]
        lines.append(f"| {case_id} | {where_text} | `{shown}` | {message} |")
    return "\n".join(lines) + "\n"


def test_docs_table_lists_every_case_with_its_real_message(outcomes):
    text = render_doc(outcomes)
    if os.environ.get("TINYGPT_REGEN_DOCS") == "1":
        DOC.write_text(text)
    assert DOC.read_text() == text, ("docs/errors.md is out of date; regenerate with "
                                     "TINYGPT_REGEN_DOCS=1 python -m pytest tests/base/test_bad_input.py")


@pytest.mark.parametrize("command", [[], ["check"]], ids=["launch", "check"])
def test_every_local_problem_is_said_before_slurm_is_asked(tmp_path, tiny_corpus, command):
    """A mistake in the spec is the same message on every machine, and nobody waits on a controller to hear it:
    the #SBATCH values and the options are checked here, all at once, then the corpus and data_dir, and Slurm is
    not asked."""
    from tests.support.hermetic import slurm_that_records
    from tests.support.processes import launch

    recording, asked = slurm_that_records(tmp_path)
    spec = tmp_path / "local.yaml"
    spec.write_text(f"name: s\nbackend: submitit\ntrain: {{data_file: {tiny_corpus}, data_dir: /proc/nope}}\n"
                    f"resources: {{exclude: \"node1\\n#SBATCH --hold\"}}\n")
    hold = ["--hold"] if not command else []
    out = launch(*command, str(spec), "--workdir", str(tmp_path / "w"), *hold, env=recording)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"error: {spec}: "), out.stderr
    assert "resources.exclude: 'node1\\n#SBATCH --hold' (for --exclude) holds a line break" in out.stderr
    assert ("--hold: only for submissions with the sbatch backend" in out.stderr) == bool(hold)
    spec.write_text(f"name: s\ntrain: {{data_file: {tiny_corpus}, data_dir: /proc/nope}}\n")
    out = launch(*command, str(spec), "--workdir", str(tmp_path / "w"), env=recording)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"error: {spec}: run `base`: data_dir: cannot write the prepared data under '/proc/nope'" in out.stderr
    assert not asked.exists(), asked.read_text()
    assert not (tmp_path / "w").exists()
