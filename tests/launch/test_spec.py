"""The launcher on the login node: specs, profiles, rendered scripts, dry runs. No Slurm needed."""

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import sbatch_rules
from tests.support.paths import ROOT
from tests.support.processes import launch, python_env
from tests.support.sweeps import check_golden, hand_made_manifest, sweep_dirs
from tests.support.tiny import tiny_yaml
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.spec import profiles, resources
from tinygpt.launch.spec import sweep as spec_mod
from tinygpt.launch.spec.resources import Minutes
from tinygpt.launch.submit.plan import build
from tinygpt.launch.submit.sbatch import ScriptParams, render


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_grid_expands_to_named_runs(tmp_path):
    path = write(tmp_path, "name: s\ntrain: {max_steps: 10}\ngrid:\n  n_layer: [2, 4]\n  model.n_embd: [64, 128]\n")
    sweep = spec_mod.load(path, tmp_path)
    assert [r.name for r in sweep.runs] == ["n_layer-2_n_embd-64", "n_layer-2_n_embd-128", "n_layer-4_n_embd-64",
                                            "n_layer-4_n_embd-128"]
    cfg = sweep.runs[3].config  # the trainer's own config, final: what the job will read
    assert cfg.model.n_embd == 128 and cfg.optim.max_steps == 10
    assert cfg.run.out_dir == str(tmp_path.resolve() / "runs" / "s" / "n_layer-4_n_embd-128")
    assert cfg.data.data_dir == str(tmp_path.resolve() / "data")
    assert sweep.varying == ["n_layer", "n_embd"]


def test_explicit_runs_and_single_job(tmp_path):
    path = write(tmp_path, "name: s\nruns:\n  - {name: a, n_head: 1}\n  - {block_size: 16}\n")
    assert [r.name for r in spec_mod.load(path).runs] == ["a", "block_size-16"]
    single = write(tmp_path, "name: one\ntrain: {n_layer: 2}\n", "one.yaml")
    assert [r.name for r in spec_mod.load(single).runs] == ["base"]


def test_every_problem_in_a_spec_is_reported_at_once(tmp_path):
    path = write(tmp_path, """
name: bad
clster: local
train: {lr: -1, n_embed: 64, out_dir: /tmp/x}
grid:
  dropout: [0.5, 1.5]
resources: {gpus_per_node: 2, time: "99:00:00:00", nodes: 0}
""")
    with pytest.raises(LaunchError) as err:
        spec_mod.load(path)
    text = "\n".join(err.value.problems)
    assert "unknown key `clster` (did you mean `cluster`?)" in text
    assert "unknown key `n_embed` (did you mean `n_embd`?)" in text
    assert "`out_dir` is set by the launcher" in text
    assert "lr: must be in (0, 1]" in text
    assert "run `dropout-1.5`: dropout: must be in [0, 1), got 1.5" in text
    assert "resources.gpus_per_node: 2 GPUs asked, but the nodes of cluster profile `local` have no GPUs" in text
    assert "resources.time" in text and "resources.nodes" in text
    assert len(err.value.problems) >= 8


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: s\ngrid: {}\n", "grid: is empty"),
        ("name: s\ngrid: {n_layer: []}\n", "grid.n_layer: the list of values is empty"),
        ("name: s\nruns:\n  - {name: x, n_layer: 1}\n  - {name: x, n_layer: 2}\n", "run name `x` is used twice"),
        ("name: s\ngrid: {data_file: [a/t.txt, b/t.txt]}\n", "is used twice"),
        ("name: ../../etc\n", "cannot be used as a file or job name"),
        ("name: \"a'; echo foo\"\n", "cannot be used as a file or job name"),
        ("name: s\nruns:\n  - {name: \"$(reboot)\"}\n", "cannot be used as a file or job name"),
        ("name: s\nruns:\n  - {name: a/b}\n", "cannot be used as a file or job name"),
        ("name: s\ncluster: nosuch\n", "unknown cluster profile `nosuch`; available: "),
        ("name: s\ncluster: locl\n", "(did you mean `local`?)"),
        ("name: s\nresources: {partition: gpu}\n", "unknown partition `gpu`"),
        ("name: s\ncluster: a100-example\nresources: {gpus_per_node: 8}\n", "a node of cluster profile"),
        ("name: s\ncluster: a100-example\nresources: {time: '3-00:00:00'}\n", "over the maximum 2-00:00:00"),
        ("name: s\ncluster: a100-example\nresources: {nodes: 17}\n", "at most 16"),
        ("name: s\ntrain: {data_file: /nonexistent/book.txt}\n", "data_file: /nonexistent/book.txt does not exist"),
        ("name: s\nbackend: slurmx\n", "backend: expected one of sbatch or submitit, got 'slurmx'"),
        ("name: s\ntrain: {n_embd: 30, n_head: 4}\n", "n_embd: 30 is not divisible by n_head 4"),
        ("name: s\narray_parallelism: 0\n", "array_parallelism: must be >= 1, got 0"),
        ("name: s\ntrain: [1, 2]\n", "train: expected a mapping"),
        ("name: s\nmodel: [1, 2\n", "at line 2, column 8"),
    ],
)
def test_bad_specs_are_clear_errors(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(LaunchError) as err:
        spec_mod.load(path)
    assert message in str(err.value)


def test_empty_data_file_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    path = write(tmp_path, f"name: s\ntrain: {{data_file: {tmp_path / 'empty.txt'}}}\n")
    with pytest.raises(LaunchError, match="is empty"):
        spec_mod.load(path)


@pytest.mark.parametrize("path", sorted((ROOT / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_spec_loads_and_renders(path, tmp_path):
    sweep = spec_mod.load(path, tmp_path)
    plan = build(sweep)
    assert plan.scripts and all(p.exists() for p, *_ in plan.scripts)
    manifest = json.loads(plan.manifest_path.read_text())
    assert [r["name"] for r in manifest["runs"]] == [r.name for r in sweep.runs]
    for script, *_ in plan.scripts:
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_a_task_reads_its_own_line_of_the_manifest_else_the_whole_file(tmp_path):
    from tinygpt.launch import manifest as manifest_mod

    plan = build(spec_mod.load(write(tmp_path, "name: s\ngrid: {seed: [1, 2, 3]}\n"), tmp_path))
    path, text = plan.manifest_path, plan.manifest_path.read_text()
    whole = manifest_mod.load(path)
    for i in range(3):
        head, run = manifest_mod.load_run(path, i)
        assert run == whole.runs[i] and (head.base, head.name) == (whole.base, whole.name)
    path.write_text(json.dumps(json.loads(text), indent=2))  # (laid out otherwise, by a tool: read whole)
    assert manifest_mod.load_run(path, 2)[1] == whole.runs[2]
    path.write_text(text.replace('"index": 1,', '"index": "1",'))  # its own line damaged: the whole file's check
    with pytest.raises(manifest_mod.LaunchError, match=r"the manifest is damaged \(runs\[1\]\.index"):
        manifest_mod.load_run(path, 1)
    path.write_text(text)
    for beyond in (3, -1):
        with pytest.raises(IndexError):
            manifest_mod.load_run(path, beyond)


def test_submissions_are_appended_and_the_manifest_is_written_once(tmp_path):
    """Each submission is a line appended beside the manifest, which is not written again (a 100,000-run sweep's
    100 array parts would rewrite it 100 times); readers see both. A relaunch carries the lines into its new
    manifest and removes them; a crash between the two leaves each twice, read once."""
    from tinygpt.launch import manifest as manifest_mod

    spec = write(tmp_path, "name: s\ngrid: {seed: [1, 2, 3]}\n")
    plan = build(spec_mod.load(spec, tmp_path))
    path, text = plan.manifest_path, plan.manifest_path.read_bytes()
    manifest_mod.record_submission(path, "sbatch", "11", [0, 1], array="0-1", offset=0)
    manifest_mod.record_submission(path, "sbatch", "12", [2], array="0", offset=2)
    record = sweep_dirs(tmp_path, "s").submissions
    assert path.read_bytes() == text and len(record.read_text().splitlines()) == 2
    assert manifest_mod.load(path).task_job_ids() == {0: "11_0", 1: "11_1", 2: "12_0"}
    lines = record.read_text()

    build(spec_mod.load(spec, tmp_path))  # relaunched (a dry run): the new manifest has them itself
    assert not record.exists() and [s["job_id"] for s in json.loads(path.read_text())["submissions"]] == ["11", "12"]
    record.write_text(lines)  # (as a crash just before the removal leaves it)
    assert [s.job_id for s in manifest_mod.load(path).submissions] == ["11", "12"]


def test_a_submission_cut_short_is_named_and_the_next_one_is_kept_whole(tmp_path):
    """A line a crash cut short is refused with its file, line and what to do (a reader never guesses at a job
    id); the next submission still gets a whole line of its own. A relaunch sets a record it could not carry
    over aside, never deleting it."""
    from tinygpt.launch import manifest as manifest_mod

    spec = write(tmp_path, "name: s\ngrid: {seed: [1, 2]}\n")
    path = build(spec_mod.load(spec, tmp_path)).manifest_path
    record = sweep_dirs(tmp_path, "s").submissions
    manifest_mod.record_submission(path, "sbatch", "11", [0], array="0", offset=0)
    with open(record, "a") as fh:
        fh.write('{"backend": "sbatch", "job_id": "1')  # (the crash)
    with pytest.raises(manifest_mod.LaunchError) as err:
        manifest_mod.load(path)
    assert f"{record}: the submissions record is damaged (line 2 is not a record:" in str(err.value)
    assert f"move it aside (mv {record} {record}.corrupt) and launch the spec again" in str(err.value)
    manifest_mod.record_submission(path, "sbatch", "13", [1], array="0", offset=1)
    assert json.loads(record.read_text().splitlines()[2])["job_id"] == "13"

    record.write_text(record.read_text().splitlines()[0].replace('"11"', "11") + "\n")
    with pytest.raises(manifest_mod.LaunchError, match=r"damaged \(line 1: job_id: expected a single value"):
        manifest_mod.load(path)
    with pytest.raises(LaunchError):  # a relaunch reads the old manifest first: nothing is written
        build(spec_mod.load(spec, tmp_path))
    path.unlink()  # (as the message says, once no job of it is live) ... and launched again
    build(spec_mod.load(spec, tmp_path))
    assert not record.exists() and record.with_name(record.name + ".corrupt").read_text().startswith('{"backend"')


def test_the_manifest_leaves_out_the_run_dirs_it_can_tell(tmp_path):
    """A run's out_dir is written only where it is not runs/<sweep>/<run>; reading fills it in, writing leaves it
    out again, and one elsewhere is kept."""
    from tinygpt.launch import manifest as manifest_mod

    plan = build(spec_mod.load(write(tmp_path, "name: s\ngrid: {seed: [1, 2]}\n"), tmp_path))
    assert all("out_dir" not in run for run in json.loads(plan.manifest_path.read_text())["runs"])
    manifest = manifest_mod.load(plan.manifest_path)
    assert [r.out_dir for r in manifest.runs] == [str(tmp_path / "runs" / "s" / f"seed-{i}") for i in (1, 2)]
    runs = [run.model_dump() for run in manifest.runs]
    runs[1]["out_dir"] = "/elsewhere/seed-2"
    manifest_mod.create(plan.manifest_path, manifest_mod.ManifestHead.model_validate(
        manifest.model_dump(exclude={"runs"}, exclude_unset=True)), runs)
    assert [run.get("out_dir") for run in json.loads(plan.manifest_path.read_text())["runs"]] == [
        None, "/elsewhere/seed-2"]
    assert manifest_mod.load(plan.manifest_path).runs[1].out_dir == "/elsewhere/seed-2"


def test_exercises_spec_holds_the_notebooks_exercises():
    runs = spec_mod.load(ROOT / "jobs" / "exercises.yaml").runs
    assert [r.name for r in runs] == ["base", "no-mask", "one-head", "block-16", "block-128", "no-pos-emb",
                                      "twice-bigger"]
    assert [r.config.model.causal for r in runs] == [True, False, True, True, True, True, True]


@pytest.mark.parametrize("path", sorted((ROOT / "hpc_lab" / "clusters").glob("*.yaml")), ids=lambda p: p.name)
def test_every_cluster_profile_loads(path):
    profile = profiles.from_file(path)
    assert profile.name == path.stem
    assert profile.default_partition in profile.partitions


def test_time_and_memory_parsing():
    assert [Minutes.parse(t) for t in ("30", "01:30:00", "2-00:00:00", "1-12", "00:00:30", 45)] == [
        30, 90, 2880, 2160, 1, 45]
    assert Minutes.parse("INFINITE") is None and Minutes.parse(None) is None
    assert str(Minutes(2880 + 61)) == f"{Minutes(2880 + 61)}" == "2-01:01:00" and str(Minutes(90)) == "01:30:00"
    assert isinstance(Minutes(90).times(1.5), Minutes) and Minutes(90).times(1.01) == 91  # (up to a whole minute)
    assert resources.parse_mem_mb("4G") == 4096 and resources.parse_mem_mb("500M") == 500
    for bad in ("soon", -1, True):
        with pytest.raises(ValueError):
            Minutes.parse(bad)
    assert Minutes.limit("soon") is None and Minutes.limit("1-00:00:00") == 1440
    # (what a spec's time becomes: Minutes, however pydantic's int check would have it)
    assert isinstance(spec_mod.ResourcesRequest(time="01:30:00").time, Minutes)


def test_one_size_parser_for_what_users_write_and_what_slurm_prints():
    """A bare number is megabytes, as for sbatch --mem, wherever a size is read."""
    assert resources.size_mb("2048") == resources.size_mb(2048) == resources.size_mb("2G") == 2048
    assert resources.size_mb("306484K") == pytest.approx(306484 / 1024) and resources.size_mb("1.5g") == 1536
    with pytest.raises(ValueError):
        resources.size_mb("lots")


def hostile_params(tmp_path: Path, **kw) -> ScriptParams:
    profile = profiles.Profile(
        name="hostile", account="acct with space", qos="a\"=0\"", partitions={"p'; echo foo": {}},
        default_partition="p'; echo foo", node={"gpus": 4, "gpu_type": "a100"}, gpu_request="gres",
        modules=["cuda/12.1", "a'; echo foo"], env={"EVIL": "$(reboot)", "QUOTE": "it's \"quoted\""},
        setup=["source /opt/venv/bin/activate"],
        container={"runtime": "apptainer", "image": "/images/my image.sif", "args": "--nv --bind '/a b'"},
        signal="USR2", signal_lead_s=90,
    )
    resources = spec_mod.Resources(nodes=2, gpus_per_node=4, tasks_per_node=4, cpus_per_task=8, mem_mb=4096,
                                   time=Minutes(90), named={"partition": "p'; echo foo", "qos": "a\"=0\"",
                                                            "account": "acct with space",
                                                            "constraint": "`touch /tmp/pwned`", "exclude": "node[3-4]"},
                                   sbatch_extra={"reservation": "maint $(reboot)", "exclusive": None},
                                   srun_args=("--cpu-bind=cores", "--label; rm -rf ~"))
    params = dict(job_name="sweep", array="0-3%2", offset=0, manifest="/w/jobs/sweep $(reboot)/manifest.json",
                  script_path="/w/jobs/sweep/sweep.sbatch", log_dir="/w/logs/it's here", workdir="/w/a\"b",
                  python="/opt/py thon/bin/python", pythonpath="/repo", resources=resources, profile=profile)
    params.update(kw)
    return ScriptParams(**params)


def test_render_hostile_values_golden(tmp_path):
    text = render(hostile_params(tmp_path))
    check_golden("hostile.sbatch", text)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_render_packed_golden(tmp_path):
    params = hostile_params(tmp_path, pack=2, runs=5, array="0-2")
    text = render(dataclasses.replace(params, resources=dataclasses.replace(params.resources, nodes=1,
                                                                            tasks_per_node=1)))
    check_golden("packed.sbatch", text)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_every_sbatch_value_round_trips_through_sbatch_and_the_shell(tmp_path):
    params = hostile_params(tmp_path)
    text = render(params)
    options = sbatch_rules.options(text)  # as sbatch's own parser reads the #SBATCH lines
    assert all(sbatch_rules.options(text, release) == options for release in sbatch_rules.RELEASES)
    assert options["partition"] == "p'; echo foo"
    assert options["qos"] == 'a"=0"'
    assert options["account"] == "acct with space"
    assert options["constraint"] == "`touch /tmp/pwned`"
    assert options["output"] == "/w/logs/it's here/%A_%a.out"
    assert options["gres"] == "gpu:a100:4"
    assert options["signal"] == "USR2@90" and "requeue" in options
    assert options["reservation"] == "maint $(reboot)" and options["exclusive"] is None
    assert options["exclude"] == "node[3-4]"
    srun_line = next(line for line in text.splitlines() if line.startswith("step srun "))
    assert shlex.split(srun_line)[3:6] == ["--cpus-per-task=8", "--cpu-bind=cores", "--label; rm -rf ~"]
    # The setup section, run for real in a shell, exports values verbatim and executes nothing.
    setup = text.split("# Setup\n")[1].split("\n# Command")[0]
    setup = "\n".join(line for line in setup.splitlines() if not line.startswith(("module ", "source ")))
    out = subprocess.run(["bash", "-c", setup + '\nprintf "%s\\n" "$EVIL" "$QUOTE" "$MANIFEST" "$PYTHON"'],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.splitlines() == ["$(reboot)", "it's \"quoted\"", "/w/jobs/sweep $(reboot)/manifest.json",
                                       "/opt/py thon/bin/python"]


def hostile_plan(tmp_path: Path):
    """The hostile profile and resources as a launched sweep of four runs, for the submitit backend."""
    from tinygpt.launch.submit.plan import Plan

    p = hostile_params(tmp_path)
    profile = p.profile.model_copy(update={"python": p.python})  # (the sbatch script takes it as a parameter)
    runs = [spec_mod.Run(i, f"r{i}", {}, {}, {}, f"/w/runs/sweep/r{i}", 1600) for i in range(4)]
    sweep = spec_mod.Sweep("sweep", Path("/w/sweep.yaml"), profile, "submitit", p.resources, 2, Path(p.workdir),
                           runs)
    return Plan(sweep, Path(p.workdir), Path("/w/jobs/sweep"), Path(p.log_dir), Path(p.manifest), [])


def sbatch_lines(text: str) -> dict[str, str | None]:
    """{option: value as a shell would read it} of a script's #SBATCH lines."""
    options = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --"):].partition("=")
            options[key] = shlex.split(value)[0] if value else None
    return options


def test_render_submitit_hostile_golden(tmp_path):
    from tinygpt.launch.submit.backends import Submitit

    text = Submitit().script(hostile_plan(tmp_path), pythonpath="/repo")
    check_golden("hostile-submitit.sbatch", text)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert "module load 'a'\"'\"'; echo foo'" in text  # quoted like the sbatch backend's
    assert "apptainer exec --nv --bind '/a b' '/images/my image.sif' '/opt/py thon/bin/python' -u" in text
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR2" in text


def test_both_backends_ask_slurm_for_the_same_options(tmp_path):
    """One mapping from resources and profile to Slurm options serves both backends."""
    from tinygpt.launch.submit.backends import Submitit
    from tinygpt.launch.submit.slurm_options import sbatch_options

    plan = hostile_plan(tmp_path)
    ours = sbatch_rules.options(render(hostile_params(tmp_path)))  # as sbatch reads them
    # As the shell reads submitit's lines: the same options, quoted for a shell, which sbatch reads otherwise
    # (so a spec refuses such values for that backend: tests/launch/test_directives.py).
    theirs = sbatch_lines(Submitit().script(plan, pythonpath="/repo"))
    shared = sbatch_options(plan.sweep.resources, plan.sweep.profile, plan.workdir)
    assert shared.keys() >= {"partition", "qos", "account", "constraint", "gres", "mem", "signal", "requeue",
                             "exclude", "reservation", "exclusive"}
    for key, value in shared.items():
        assert ours[key] == theirs[key] == value, key
    assert ours["signal"] == "USR2@90" and theirs["array"] == "0-3%2" == ours["array"]
    srun = next(line for line in Submitit().script(plan, pythonpath="/repo").splitlines()
                if line.startswith("srun "))
    assert "--cpu-bind=cores '--label; rm -rf ~'" in srun


@pytest.mark.parametrize("text, message", [
    ("resources: {sbatch_options: {array: 0-3}}", "resources.sbatch_options.array: `--array` is set by the launcher"),
    ("resources: {sbatch_options: {output: x.log}}", "`--output` is set by the launcher"),
    ("resources: {sbatch_options: {dependency: 'afterok:1'}}", "`--dependency` is set by the launcher"),
    ("resources: {sbatch_options: {time: '01:00:00'}}", "`--time` has its own key; use resources.time"),
    ("resources: {sbatch_options: {p: debug}}", "'p' is not a long sbatch option name"),
    ("resources: {sbatch_options: {mail_type: [END]}}", "resources.sbatch_options.mail_type: expected one value"),
    ("resources: {sbatch_options: {comment: \"a\\nb\"}}", "holds a line break"),
    ("resources: {sbatch_options: [reservation]}", "resources.sbatch_options: expected a mapping"),
    ("resources: {srun_args: {a: 1}}", "resources.srun_args: expected a list of arguments"),
])
def test_passed_through_options_are_checked(tmp_path, text, message):
    with pytest.raises(LaunchError) as err:
        spec_mod.load(write(tmp_path, f"name: s\n{text}\n"), tmp_path)
    assert message in str(err.value)


def test_passed_through_options_reach_both_backends(tmp_path):
    from tinygpt.launch.submit.backends import Submitit

    prof = tmp_path / "site.yaml"
    prof.write_text("name: site\npartitions: {debug: {}}\nsbatch_options: {reservation: site-wide, mail-type: END}\n"
                    "srun_args: [--cpu-bind=cores]\n")
    spec = write(tmp_path, f"name: s\ncluster: {prof}\nresources: {{exclude: 'node2', constraint: fast, "
                           f"sbatch_options: {{mail_type: FAIL, exclusive: true}}, srun_args: --label}}\n")
    sweep = spec_mod.load(spec, tmp_path)
    assert sweep.resources.sbatch_extra == {"reservation": "site-wide", "mail-type": "FAIL", "exclusive": None}
    assert sweep.resources.srun_args == ("--cpu-bind=cores", "--label")
    plan = build(sweep)
    text = plan.scripts[0][0].read_text()
    for line in ("#SBATCH --exclude=node2", "#SBATCH --constraint=fast", "#SBATCH --reservation=site-wide",
                 "#SBATCH --mail-type=FAIL", "#SBATCH --exclusive\n"):
        assert line in text
    assert "srun --kill-on-bad-exit=1 --cpus-per-task=1 --cpu-bind=cores --label " in text
    params = Submitit.executor_parameters(plan)
    assert params["srun_args"] == ["--cpus-per-task=1", "--cpu-bind=cores", "--label"]
    assert params["additional_parameters"]["exclusive"] is True
    assert params["additional_parameters"]["mail_type"] == "FAIL"


def test_render_local_profile_golden():
    profile = profiles.load("local")
    resources = spec_mod.Resources(1, 0, 1, 1, None, 30, {"partition": "debug"})
    params = ScriptParams(job_name="width-depth", array="0-3%4", offset=0, manifest="/w/jobs/width-depth/manifest.json",
                          script_path="/w/jobs/width-depth/width-depth.sbatch", log_dir="/w/logs/width-depth",
                          workdir="/w", python="/w/.venv/bin/python", pythonpath="/repo", resources=resources,
                          profile=profile)
    text = render(params)
    check_golden("local.sbatch", text)
    assert "#SBATCH --gres" not in text and "#SBATCH --gpus-per-node" not in text
    assert "srun --kill-on-bad-exit=1" in text and "SLURM_ARRAY_TASK_ID" in text


def test_rendering_is_pure():
    profile = profiles.load("a100-example")
    resources = spec_mod.Resources(2, 4, 4, 16, None, 60, {"partition": "gpu", "account": "my-project"})
    params = ScriptParams("s", "0-1", 0, "/m", "/s", "/l", "/w", "/p", "/r", resources, profile)
    assert render(params) == render(params)
    assert "#SBATCH --gres=gpu:a100:4" in render(params)


def test_long_sweeps_are_split_below_max_array_size(tmp_path):
    prof = tmp_path / "small.yaml"
    prof.write_text("name: small\npartitions: {debug: {}}\nnode: {cpus: 4}\nmax_array_size: 4\n")
    path = write(tmp_path, "name: big\ngrid: {seed: [1, 2, 3, 4, 5, 6, 7]}\n")
    plan = build(spec_mod.load(path, tmp_path, cluster=str(prof)))
    assert [(a, off, idx) for _, a, off, idx in plan.scripts] == [("0-2", 0, [0, 1, 2]), ("0-2", 3, [3, 4, 5]),
                                                                  ("0-0", 6, [6])]
    assert "RUN_INDEX=$(( 3 + ${SLURM_ARRAY_TASK_ID:-0} ))" in plan.scripts[1][0].read_text()


def test_manifest_lookup_on_the_node(tmp_path):
    path = write(tmp_path, "name: s\ngrid: {n_layer: [1, 2]}\n")
    plan = build(spec_mod.load(path, tmp_path))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "tinygpt.launch.manifest", "config", str(plan.manifest_path), "1"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("configs/n_layer-2.yaml")
    from tinygpt.base import config

    cfg = config.resolve(["--config", out.stdout.strip()])
    assert cfg.model.n_layer == 2 and cfg.run.out_dir == str(tmp_path.resolve() / "runs" / "s" / "n_layer-2")
    bad = subprocess.run([sys.executable, "-m", "tinygpt.launch.manifest", "config", str(plan.manifest_path), "7"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "cannot find run 7" in bad.stderr


def test_a_sweep_keeps_what_its_runs_share_once(tmp_path):
    """The manifest holds the shared trainer inputs once and each run's own; a run's config file is written
    from them when its task starts, and is the config the spec validated."""
    from tinygpt.base import config
    from tinygpt.launch import manifest as manifest_mod
    from tinygpt.launch.node import run_config

    path = write(tmp_path, "name: s\ntrain: {max_steps: 30, n_embd: 64}\n"
                           "grid: {n_layer: [1, 2], lr: [1.0e-3, 2.0e-3]}\n"
                           "runs:\n  - {name: solo, n_layer: 3, dropout: 0.1}\n")
    sweep = spec_mod.load(path, tmp_path)
    plan = build(sweep)
    manifest = manifest_mod.load(plan.manifest_path)
    assert manifest.base["max_steps"] == 30 and manifest.base["n_embd"] == 64 and "lr" not in manifest.base
    assert [r.own for r in manifest.runs] == [
        {"n_layer": 1, "lr": 0.001}, {"n_layer": 1, "lr": 0.002}, {"n_layer": 2, "lr": 0.001},
        {"n_layer": 2, "lr": 0.002}, {"n_layer": 3, "dropout": 0.1}]
    assert not (plan.jobs_dir / "configs").exists()  # nothing per run until a task starts
    for run in sweep.runs:
        written = run_config.config_file(*manifest_mod.load_run(plan.manifest_path, run.index))
        assert config.resolve(["--config", str(written)]) == run.config
    # As a task's batch script asks for it, and as the scripts of sweeps launched before run_config.py did
    for module in (["tinygpt.launch.node.run_config"], ["tinygpt.launch.manifest", "config"]):
        out = subprocess.run([sys.executable, "-m", *module, str(plan.manifest_path), "4"], capture_output=True,
                             text=True, cwd=ROOT, env=python_env())
        assert (out.returncode, out.stdout) == (0, f"{written}\n"), out.stderr
    on_disk = json.loads(plan.manifest_path.read_text())
    plan.manifest_path.write_text(json.dumps({**on_disk, "format": 1}))  # from a version that never shipped
    with pytest.raises(manifest_mod.LaunchError, match="manifest format 1, this version reads 2; launch the spec"):
        manifest_mod.load(plan.manifest_path)


def test_a_manifest_whose_runs_name_their_own_inputs_overrides_still_reads(tmp_path):
    """Manifests written before a run's own trainer inputs were called `own` on disk call them `overrides`: the
    commands (status, logs, resubmit) and a task's config file read them the same."""
    from tinygpt.base import config
    from tinygpt.launch import manifest as manifest_mod
    from tinygpt.launch.node import run_config

    path = write(tmp_path, "name: s\ntrain: {max_steps: 30}\ngrid: {n_layer: [1, 2]}\n")
    plan = build(spec_mod.load(path, tmp_path))
    text = plan.manifest_path.read_text()
    assert text.count('"own": {') == 2
    plan.manifest_path.write_text(text.replace('"own": {', '"overrides": {'))
    assert [r.own for r in manifest_mod.load(plan.manifest_path).runs] == [{"n_layer": 1}, {"n_layer": 2}]
    head, run = manifest_mod.load_run(plan.manifest_path, 1)
    written = run_config.config_file(head, run)
    assert run.own == {"n_layer": 2} and config.resolve(["--config", str(written)]).model.n_layer == 2


def test_cli_dry_run_prints_the_plan_and_errors_have_no_traceback(tmp_path):
    spec = write(tmp_path, "name: s\ngrid: {n_layer: [1, 2]}\nresources: {time: '00:10:00'}\n")
    out = launch(str(spec), "--dry-run", "--workdir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "n_layer-1" in out.stdout and "dry run: nothing submitted" in out.stdout and "00:10:00" in out.stdout
    # Piped, the plan reads as plain lines: its heading whole on one line, no box drawing.
    heading = next(line for line in out.stdout.splitlines() if line.startswith("s: "))
    assert re.fullmatch(r"s: 2 run\(s\), backend sbatch, cluster \S+", heading), out.stdout
    assert not set("┏┃│└") & set(out.stdout), out.stdout
    manifest = json.loads(sweep_dirs(tmp_path, "s").manifest.read_text())
    assert manifest["submissions"] == []
    bad = write(tmp_path, "name: s\ntrain: {n_layers: 2}\n", "bad.yaml")
    out = launch(str(bad), "--dry-run", "--workdir", str(tmp_path / "w2"))
    assert out.returncode == 1 and "did you mean `n_layer`" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "w2" / "jobs").exists()  # nothing written for a bad spec
    missing = launch(str(tmp_path / "nope.yaml"), "--dry-run")
    assert missing.returncode == 1 and "no such file" in missing.stderr
    help_out = launch("--help")
    assert help_out.returncode == 0 and "--dry-run" in help_out.stdout


def test_launcher_never_imports_torch():
    """Every module of the launcher, found on disk in every wing, imported: torch is not among what they import."""
    code = ("import importlib, pkgutil, sys; sys.argv = ['launch.py', '--help']\n"
            "import launch, tinygpt.base.config, tinygpt.launch as package\n"
            "names = [m.name for m in pkgutil.walk_packages(package.__path__, 'tinygpt.launch.')]\n"
            "for name in names: importlib.import_module(name)\n"
            "print(len(names)); sys.exit(1 if 'torch' in sys.modules else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True)
    assert out.returncode == 0 and int(out.stdout) > 45, out.stderr


def test_the_commands_parser_is_built_from_light_modules():
    """What every command builds first, before it can hear a Ctrl-C as its own: neither pydantic nor rich, which
    take most of a command's start (the validators and tables are imported by the command that uses them)."""
    code = ("import sys; from tinygpt.launch.commands import cli; cli.parser()\n"
            "print(sorted(m for m in ('pydantic', 'rich', 'torch', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_local_backend_runs_every_run_through_the_trainer(tmp_path, tiny_corpus):
    spec = write(tmp_path, f"""
name: loc
train: {{data_file: {tiny_corpus}, {tiny_yaml(max_steps=10, eval_interval=5)}}}
grid: {{lr: [1.0e-3, 3.0e-3]}}
""")
    out = launch(str(spec), "--local", "--workdir", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("lr-0.001", "lr-0.003"):
        metrics = (tmp_path / "runs" / "loc" / name / "metrics.jsonl").read_text()
        assert '"event": "finished"' in metrics
    status = launch("status", str(spec), "--workdir", str(tmp_path), columns=120)
    assert status.returncode == 0 and status.stdout.count("FINISHED") == 2, status.stdout
    assert "hidden to fit 120 columns: run dir" in status.stdout
    assert f"run dirs: {tmp_path / 'runs' / 'loc'}/<run>" in status.stdout
    # Piped with no COLUMNS: no screen to fit, so every column, the run dirs in full.
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run([sys.executable, str(ROOT / "launch.py"), "status", str(spec), "--workdir", str(tmp_path)],
                           capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert piped.returncode == 0 and "hidden" not in piped.stdout, piped.stdout
    assert "run dir" in piped.stdout and str(tmp_path / "runs" / "loc" / "lr-0.003") in piped.stdout


def status_rows(n: int = 3):
    from tinygpt.launch.read.run_states import Row

    names = ["n_layer-4_n_embd-128_lr-0.001", "n_layer-6_n_embd-384_lr-0.0003", "base"][:n]
    return [Row(i, name, f"4242_{i}", "RUNNING", "sacct", 0, 150, 2000, 2.1234, 2.2345, 12345.0, 3600.0,
                f"/home/alice/tinygpt-hpc/runs/width-depth/{name}") for i, name in enumerate(names)]


def test_status_shows_earlier_lives_of_resubmitted_runs():
    from rich.console import Console

    from tinygpt.launch.read.run_states import submission_history
    from tinygpt.launch.status.table import fitted

    manifest = hand_made_manifest(Path("/nonexistent"), 3, [
        {"job_id": "40", "indices": [0, 1, 2]},
        {"job_id": "41", "indices": [1, 2], "previous": {"1": {"job_id": "40_1", "state": "TIMEOUT", "nodes": "node1"},
                                                         "2": {"job_id": "40_2", "state": "FAILED", "nodes": ""}}},
        {"job_id": "42", "indices": [2], "previous": {"2": {"job_id": "41_2", "state": "NODE_FAIL", "nodes": "node2"}}},
    ])
    history = submission_history(manifest)
    assert history == {1: ("40_1 TIMEOUT on node1",), 2: ("40_2 FAILED", "41_2 NODE_FAIL on node2")}
    rows = [dataclasses.replace(r, history=history.get(r.index, ())) for r in status_rows()]
    console = Console(width=250, record=True)
    console.print(fitted(rows, "sweep", 250))
    text = console.export_text()
    assert "before" in text and "40_2 FAILED > 41_2 NODE_FAIL on node2" in text, text


@pytest.mark.parametrize("width, hidden", [
    (250, []),
    (160, ["run dir"]),
    (120, ["run dir", "from"]),
    (80, ["run dir", "from", "restarts", "tok/s", "train", "job"]),
])
def test_status_table_hides_the_least_needed_columns_to_fit_the_terminal(width, hidden):
    from rich.console import Console

    from tinygpt.launch.status.table import COLUMNS, fitted

    console = Console(width=width, record=True)
    console.print(fitted(status_rows(), "sweep width-depth", width))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width, text
    header = next(line for line in lines if line.startswith("┃"))
    shown = [cell.strip() for cell in header.strip("┃").split("┃")]
    # (no resubmission, no retry policy)
    assert shown == [col for col, _ in COLUMNS if col not in hidden and col not in ("before", "round")], text
    for name in ("n_layer-4_n_embd-128_lr-0.001", "n_layer-6_n_embd-384_lr-0.0003"):
        assert any(name in line for line in lines), f"the run name {name} is cut or wrapped:\n{text}"
    if hidden:
        assert f"hidden to fit {width} columns: {', '.join(hidden)}" in " ".join(text.split())
        assert "run dirs: /home/alice/tinygpt-hpc/runs/width-depth/<run>" in text
    else:
        assert "hidden" not in text


def test_pending_array_ids_are_expanded():
    from tinygpt.launch.slurm.slurm_cli import expand_array_id

    assert expand_array_id("30_[0-3]") == ["30_0", "30_1", "30_2", "30_3"]
    assert expand_array_id("30_[1,4-5%2]") == ["30_1", "30_4", "30_5"]
    assert expand_array_id("30_2") == ["30_2"] and expand_array_id("31") == ["31"]


def test_a_profile_sets_tracking_defaults_that_a_spec_and_set_override(tmp_path):
    prof = tmp_path / "offline-site.yaml"
    prof.write_text("name: offline-site\npartitions: {debug: {}}\nloggers: [wandb]\nwandb_mode: offline\n"
                    "wandb_project: shakespeare\n")
    plain = write(tmp_path, "name: s\ntrain: {max_steps: 5}\n", "plain.yaml")
    track = spec_mod.load(plain, tmp_path, cluster=str(prof)).runs[0].config.track
    assert (track.loggers, track.wandb_mode, track.wandb_project) == (["wandb"], "offline", "shakespeare")
    own = write(tmp_path, "name: s\ntrain: {wandb_mode: online, loggers: [tensorboard, wandb]}\n", "own.yaml")
    track = spec_mod.load(own, tmp_path, cluster=str(prof)).runs[0].config.track
    assert (track.loggers, track.wandb_mode) == (["tensorboard", "wandb"], "online")
    forced = spec_mod.load(own, tmp_path, cluster=str(prof), set_values={"loggers": "none"}).runs[0].config
    assert forced.track.loggers == [] and forced.run.sweep == "s"
    prof.write_text("name: offline-site\npartitions: {debug: {}}\nloggers: [tb]\n")
    with pytest.raises(LaunchError, match=r"loggers\[0\]: expected one of tensorboard or wandb, got 'tb'"):
        profiles.from_file(prof)


@pytest.mark.parametrize("text, message", [
    ("node: {gpu: 4}", "unknown key `node.gpu` (did you mean `gpus`?); valid keys of `node` are"),
    ("container: {image: /x.sif, arg: --nv}", "unknown key `container.arg` (did you mean `args`?)"),
    ("partitions: {debug: {max_tme: 10}}", "unknown key `partitions.debug.max_tme` (did you mean `max_time`?)"),
])
def test_unknown_keys_inside_a_profile_are_named(tmp_path, text, message):
    prof = tmp_path / "site.yaml"
    prof.write_text(f"name: site\n{text}\n")
    with pytest.raises(LaunchError) as err:
        profiles.from_file(prof)
    assert message in str(err.value)


def test_a_sweep_with_jobs_on_slurm_is_left_alone_where_squeue_cannot_answer(tmp_path, monkeypatch):
    """The live-sweep guard fails closed: no squeue on PATH (or one that errors) means nothing is written."""
    from tests.support.processes import run_cli
    from tinygpt.launch import manifest as manifest_mod

    spec = write(tmp_path, "name: s\ntrain: {max_steps: 30}\nresources: {time: '00:10:00'}\n")
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path)])[0] == 0
    manifest = sweep_dirs(tmp_path, "s").manifest
    manifest_mod.record_submission(manifest, "sbatch", "4242", [0], array="0", offset=0)
    before = {p: p.read_bytes() for p in (tmp_path / "jobs").rglob("*") if p.is_file()}
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    code, err = run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path)])
    assert code == 1 and "sweep `s` has jobs on Slurm, and squeue could not say whether they are still live" in err
    assert {p: p.read_bytes() for p in (tmp_path / "jobs").rglob("*") if p.is_file()} == before


def test_one_command_at_a_time_writes_a_sweep(tmp_path, monkeypatch):
    """While a command holds a sweep (here: this test, through the launcher's own lock), another launch, dry
    run or --local run of it waits, then refuses naming the holder, and writes nothing; afterwards it goes."""
    import os

    from tests.support.processes import run_cli
    from tinygpt.launch import manifest as manifest_mod

    monkeypatch.setattr(manifest_mod, "LOCK_WAIT_S", 0.3)
    spec = write(tmp_path, "name: s\ntrain: {max_steps: 30}\nresources: {time: '00:10:00'}\n")
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path)])[0] == 0
    jobs = sweep_dirs(tmp_path, "s").jobs
    before = {p: p.read_bytes() for p in jobs.rglob("*") if p.is_file() and p.name != ".lock"}
    with manifest_mod.sweep_lock(jobs):
        for extra in (["--dry-run"], ["--local"]):
            code, err = run_cli([str(spec), *extra, "--workdir", str(tmp_path)])
            assert code == 1 and f"sweep `s` is being changed by another launch.py command (pid {os.getpid()} " in err
            assert "nothing was written" in err
        assert {p: p.read_bytes() for p in jobs.rglob("*") if p.is_file() and p.name != ".lock"} == before
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path)])[0] == 0


def test_every_backend_a_spec_may_name_has_an_implementation():
    from tinygpt.launch.submit import backends

    assert set(spec_mod.BACKENDS) == set(backends.BACKENDS)
    assert {b.name for b in backends.BACKENDS.values()} == set(spec_mod.BACKENDS)


def test_a_backend_says_what_it_cannot_do_and_a_launch_asks_it_not_which_it_is(tmp_path, tiny_corpus):
    """--local only chooses the Local backend; what it refuses (a dry run, --hold, a resubmission) it says, with
    the reason, all at once and before anything is written."""
    from tests.support.processes import run_cli
    from tinygpt.launch.submit import backends

    assert [(b.name, b.to_slurm, b.holds) for b in (*backends.BACKENDS.values(), backends.Local())] == [
        ("sbatch", True, True), ("submitit", True, False), ("local", False, False)]
    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\nbackend: submitit\ntrain: {{data_file: {tiny_corpus}, {tiny_yaml()}}}\n")
    code, err = run_cli([str(spec), "--local", "--dry-run", "--hold", "--workdir", str(tmp_path / "w")])
    assert code == 1 and "--local and --dry-run: choose one" in err and backends.HOLD_ONLY in err, err
    code, err = run_cli([str(spec), "--dry-run", "--hold", "--workdir", str(tmp_path / "w")])
    assert code == 1 and backends.HOLD_ONLY in err and "choose one" not in err, err
    assert not (tmp_path / "w").exists()
    assert run_cli([str(spec), "--dry-run", "--hold", "--chain", "--workdir", str(tmp_path / "w")])[0] == 0
    with pytest.raises(LaunchError, match=r"ran here \(--local\), with no Slurm job to send again"):
        backends.Local().resubmit(None, [0], {}, {}, dry_run=False)


def test_a_job_accounting_still_calls_running_takes_the_state_the_controller_saw_it_end_in(monkeypatch):
    """Accounting hears of a job's end a moment after the controller: a `status` or `resubmit` in that moment
    reads the controller's state (a lag no real cluster shows on demand, hence the stand-ins)."""
    from tinygpt.launch.read import run_states
    from tinygpt.launch.slurm import slurm_cli

    asked = []

    def sacct_states(jobs, since):
        return {"7_0": slurm_cli.JobState("7_0", "RUNNING", 0, "sacct"),
                "7_1": slurm_cli.JobState("7_1", "COMPLETED", 0, "sacct"),
                "8": slurm_cli.JobState("8", "RUNNING", 0, "sacct"),
                "10": slurm_cli.JobState("10", "PENDING", 0, "sacct")}

    def squeue_states(jobs):
        asked.append(jobs)
        return {"7_0": slurm_cli.JobState("7_0", "FAILED", None, "squeue"),
                "7_1": slurm_cli.JobState("7_1", "COMPLETED", None, "squeue"),
                "8": slurm_cli.JobState("8", "RUNNING", None, "squeue"),
                "9": slurm_cli.JobState("9", "PENDING", None, "squeue", "Priority"),
                "10": slurm_cli.JobState("10", "PENDING", None, "squeue", "Resources", "", "2026-12-02T03:00:00")}

    monkeypatch.setattr(slurm_cli, "sacct_states", sacct_states)
    monkeypatch.setattr(slurm_cli, "squeue_states", squeue_states)
    found, unheard = run_states.job_states(["7_0", "7_1", "8", "9", "10"], None)
    assert {job: (s.state, s.source) for job, s in found.items()} == {
        "7_0": ("FAILED", "squeue"), "7_1": ("COMPLETED", "sacct"), "8": ("RUNNING", "sacct"),
        "9": ("PENDING", "squeue"), "10": ("PENDING", "sacct")}
    assert found["10"].starts == "2026-12-02T03:00:00"  # (the controller's estimate, on accounting's record)
    assert asked == [["10", "7", "8", "9"]]  # once, by job, for those accounting does not show ended
    assert unheard == []  # (no Slurm here: nobody to be silent)


def test_a_local_sweep_says_which_runs_failed_and_has_no_job_to_cancel_or_resubmit(tmp_path, tiny_corpus):
    spec = write(tmp_path, f"name: here\ntrain: {{data_file: {tiny_corpus}, {tiny_yaml(max_steps=5)}}}\n"
                           f"runs:\n  - {{name: ok}}\n  - {{name: bad, resume: {tiny_corpus}}}\n")
    out = launch(str(spec), "--local", "--workdir", str(tmp_path))
    assert out.returncode == 1 and "1/2 run(s) finished" in out.stdout, out.stdout + out.stderr
    assert "error: 1 of 2 run(s) failed here; each one's output is above" in out.stderr
    assert "Traceback" not in out.stderr
    cancelled = launch("cancel", str(spec), "--workdir", str(tmp_path))
    assert cancelled.returncode == 0 and "nothing to cancel" in cancelled.stdout
    again = launch("resubmit", str(spec), "--workdir", str(tmp_path))
    assert again.returncode == 1 and "runs of --local are run again with --local" in again.stderr


def test_a_profile_is_found_in_the_named_folders_then_the_users_then_the_checkouts(tmp_path, monkeypatch, capsys):
    """layout.profile_dirs, in the README's order; a name found twice is said with both paths, the first taken."""
    named, user = tmp_path / "named", tmp_path / "config" / "tinygpt-hpc" / "clusters"
    for folder, cpus in ((named, 7), (user, 5)):
        folder.mkdir(parents=True)
        (folder / "local.yaml").write_text(f"name: local\nnode: {{cpus: {cpus}}}\n")
    (user / "mine.yaml").write_text("name: mine\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("TINYGPT_CLUSTERS", str(named))
    assert profiles.load("local").node.cpus == 7
    assert f"is {named / 'local.yaml'}, found first; also {user / 'local.yaml'}, " in capsys.readouterr().err
    monkeypatch.delenv("TINYGPT_CLUSTERS")
    assert profiles.load("local").node.cpus == 5 and profiles.load("mine").path == str(user / "mine.yaml")
    (user / "local.yaml").unlink()
    assert profiles.load("local").path == str(ROOT / "hpc_lab" / "clusters" / "local.yaml")
    with pytest.raises(LaunchError) as err:
        profiles.load("nowhere")
    assert f"(files in {user}, {ROOT / 'hpc_lab' / 'clusters'})" in str(err.value) and "mine" in str(err.value)


def test_where_a_profile_is_found_is_said_once_and_nothing_is_passed_over_without_a_word(tmp_path, monkeypatch,
                                                                                        capsys):
    """The folders of $TINYGPT_CLUSTERS come first: a NAME.yaml there that is a broken link or a folder is refused
    (not passed over for the checkout's file of that name); a file whose name `--cluster` cannot take is not
    offered; a name found in two folders is said once; `auto` with two profiles of one cluster is refused."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setenv("TINYGPT_CLUSTERS", f"{first}:{second}")
    (first / "local.yaml").symlink_to(first / "nowhere.yaml")
    (second / "lab.yaml").mkdir()
    (second / "my lab.yaml").write_text("name: x\n")
    for name, said in [("local", f"{first / 'local.yaml'} is a link to nothing"), ("lab", "is not a file")]:
        with pytest.raises(LaunchError, match=re.escape(said)):
            profiles.load(name)
    assert "my lab" not in profiles.available()
    (first / "local.yaml").unlink()
    (second / "lab.yaml").rmdir()
    shutil.copy(ROOT / "hpc_lab" / "clusters" / "local.yaml", first / "local.yaml")
    profiles.load("local")
    profiles.load("local")
    assert capsys.readouterr().err.count("found first") == 1
    (second / "twin.yaml").write_text("cluster_name: local\n")
    monkeypatch.setattr("tinygpt.launch.slurm.slurm_cli.cluster_name", lambda: "local")
    with pytest.raises(LaunchError, match="`auto` finds 2 profiles with cluster_name `local`"):
        profiles.load("auto")
