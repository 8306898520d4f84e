"""What reaches sbatch is exactly what the spec says: `#SBATCH` values encoded for sbatch's own parser, option
names matched the way sbatch matches them, and srun arguments that cannot replace the command."""

import json
import shlex
import subprocess

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support import sbatch_rules, slurm
from tests.support.processes import run_cli
from tinygpt.launch.slurm import directives
from tinygpt.launch.spec import passthrough, profiles
from tinygpt.launch.spec import sweep as spec_mod
from tinygpt.launch.submit.sbatch import ScriptParams, render

# Every character a YAML value can hold but the two no #SBATCH line can carry: backslashes, quotes of both
# kinds, `#`, `=`, spaces, every other control character, non-ASCII.
WRITABLE = st.text(st.characters(blacklist_characters="\n\x00", blacklist_categories=("Cs",)), min_size=1,
                   max_size=40).filter(lambda v: directives.problem(v) is None)
HOSTILE = st.one_of(WRITABLE, st.sampled_from(['\\', '\\"', "a\\' \" --job-name=pwned --hold #", "'#'", '""',
                                              "x # y", "a=b=c", "\t\r\v\f", "ü \u2028 \x85 é"]))
INJECTION = '\\\' " --job-name=pwned --output=/tmp/x/stolen_%j.out --hold #'


@given(value=HOSTILE)
@example(value=INJECTION)
def test_any_writable_value_arrives_whole_as_one_argument(value):
    for release in sbatch_rules.RELEASES:
        assert sbatch_rules.arguments(directives.line("comment", value)[len("#SBATCH"):], release) == \
            [f"--comment={value}"]


@pytest.mark.parametrize("value", ["two\nlines", "nul\x00", "x" * (directives.MAX_BYTES + 1), "my HetJob"])
def test_values_no_directive_can_carry_are_refused(value):
    assert directives.problem(value)
    with pytest.raises(ValueError):
        directives.line("comment", value)


@given(value=HOSTILE)
@example(value="it's $(here) # \"x\"")
def test_the_submitit_backend_s_shell_quoting_reaches_sbatch_whole_unless_it_holds_a_backslash(value):
    """submitit writes `#SBATCH --key=<shlex.quote(value)>`; sbatch reads single quotes as quotes too."""
    line = f" --comment={shlex.quote(value)}"
    if directives.problem(value, "submitit") is None:
        assert all(sbatch_rules.arguments(line, r) == [f"--comment={value}"] for r in sbatch_rules.RELEASES)
    else:  # refused: sbatch would have read it otherwise, or stopped
        assert "\\" in value and "backend: sbatch" in directives.problem(value, "submitit")


def script_with(extra: dict, **named) -> str:
    profile = profiles.load("local")
    r = spec_mod.Resources(1, 0, 1, 1, 512, 30, {"partition": "debug", **named}, sbatch_extra=extra)
    return render(ScriptParams(job_name="s", array="0-1", offset=0, manifest="/w/jobs/s/manifest.json",
                               script_path="/w/jobs/s/s.sbatch", log_dir="/w/logs/s", workdir="/w",
                               python="/p", pythonpath="/r", resources=r, profile=profile))


@given(comment=HOSTILE, reservation=HOSTILE, exclude=HOSTILE, constraint=HOSTILE, account=HOSTILE, qos=HOSTILE)
@example(comment=INJECTION, reservation="#", exclude='"', constraint="\\", account="a b", qos="'")
def test_a_rendered_script_gives_sbatch_exactly_its_options(comment, reservation, exclude, constraint, account, qos):
    text = script_with({"comment": comment, "reservation": reservation, "exclusive": None},
                       exclude=exclude, constraint=constraint, account=account, qos=qos)
    got = sbatch_rules.options(text)
    assert all(sbatch_rules.options(text, release) == got for release in sbatch_rules.RELEASES)
    assert {k: got[k] for k in ("comment", "reservation", "exclude", "constraint", "account", "qos")} == {
        "comment": comment, "reservation": reservation, "exclude": exclude, "constraint": constraint,
        "account": account, "qos": qos}
    assert got["exclusive"] is None and got["job-name"] == "s" and got["output"] == "/w/logs/s/%A_%a.out"
    assert "hold" not in got and set(got) == {"array", "chdir", "comment", "constraint", "cpus-per-task",
                                              "exclude", "exclusive", "job-name", "mem", "nodes", "ntasks-per-node",
                                              "open-mode", "output", "partition", "qos", "account", "requeue",
                                              "reservation", "signal", "time"}


def refused(raw: dict) -> list[str]:
    problems: list[str] = []
    passthrough.sbatch_options(raw, "resources.sbatch_options", problems)
    return problems


@pytest.mark.parametrize("key, owner", [("hol", "--hold"), ("depend", "--dependency"), ("qo", "--qos"),
                                        ("accou", "--account"), ("gpus-per-nod", "--gpus-per-node"),
                                        ("job_nam", "--job-name"), ("ntasks", "--ntasks")])
def test_a_prefix_of_an_option_the_launcher_owns_is_refused_like_the_option(key, owner):
    problems = refused({key: "x"})
    assert len(problems) == 1 and owner in problems[0] and f"resources.sbatch_options.{key}" in problems[0]
    if key.replace("_", "-") != owner[2:]:
        assert f"sbatch reads `--{key.replace('_', '-')}` as `{owner}`" in problems[0]


def test_two_keys_for_one_option_are_an_error_and_full_names_of_other_options_pass():
    assert "`mail-type` and `mail_type` are the same option" in refused({"mail-type": "END", "mail_type": "BEGIN"})[0]
    problems: list[str] = []
    assert passthrough.sbatch_options({"reservation": "r", "mail_type": "END", "exclusive": True, "wckey": "w"},
                                      "x", problems) == {"reservation": "r", "mail-type": "END", "exclusive": None,
                                                         "wckey": "w"}
    assert problems == []


def test_srun_args_cannot_replace_the_command():
    problems: list[str] = []
    assert passthrough.srun_args(["hostname"], "resources.srun_args", problems) == ()
    assert "'hostname' is not an option" in problems[0] and "resources.srun_args" in problems[0]
    assert passthrough.srun_args(["--label", "--cpu-bind=cores"], "x", []) == ("--label", "--cpu-bind=cores")


def launch_dry(spec, workdir) -> tuple[int, str]:
    return run_cli([str(spec), "--dry-run", "--workdir", str(workdir)])


@pytest.mark.parametrize("where, text", [
    ("resources: {exclude: \"node1\\nnode2\"}\n", "resources.exclude"),
    ("resources: {constraint: \"a\\n#SBATCH --hold\"}\n", "resources.constraint"),
    ("resources: {sbatch_options: {comment: \"x\\ny\"}}\n", "resources.sbatch_options.comment"),
    ("resources: {sbatch_options: {comment: \"a hetjob\"}}\n", "resources.sbatch_options.comment"),
    ("backend: submitit\nresources: {sbatch_options: {comment: 'a\\b'}}\n", "sbatch_options.comment"),
])
def test_a_value_no_directive_can_carry_fails_the_launch_naming_its_field(tmp_path, where, text):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\ntrain: {n_layer: 1}\n" + where)
    code, err = launch_dry(spec, tmp_path / "w")
    assert code == 1 and text in err and "Traceback" not in err, err
    assert not (tmp_path / "w").exists()  # nothing written


def test_a_workdir_with_a_line_break_is_refused(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "s", "train": {"n_layer": 1}}))
    code, err = launch_dry(spec, tmp_path / "a\nb")
    assert code == 1 and "--workdir" in err, err
    assert not (tmp_path / "a\nb").exists()


# Raw #SBATCH text (not the launcher's encoding): quotes, escapes and comments, and the escaped space that
# Slurm 24.05 began to keep.
RAW_COMMENTS = ["a\\ b", '"a b"', "'a b'", "a\\\\b", '"x#y"', "x\\#y", "x # y", '"say \\"hi\\""', "it\\'s", "x\\ \\ y",
                '\\"q', "it'\"'\"'s"]


@pytest.mark.slurm
@pytest.mark.slurm_release
@pytest.mark.shares_cluster
def test_the_model_of_sbatchs_parser_reads_raw_lines_as_this_clusters_sbatch_does(tmp_path):
    """support/sbatch_rules.py, the oracle of the property tests above, held against the real sbatch: each raw line
    is submitted held, and the comment Slurm stored (squeue's %k) is the model's, for this cluster's release."""
    release = tuple(int(n) for n in slurm.slurm_release().split(".")[:2])
    script = tmp_path / "raw.sh"
    for raw in RAW_COMMENTS:
        script.write_text(f"#!/bin/bash\n#SBATCH --comment={raw}\ntrue\n")
        out = subprocess.run(["sbatch", "--hold", "--parsable", "-J", "raw-line", "-o", "/dev/null", str(script)],
                             capture_output=True, text=True, timeout=60)
        try:
            args = sbatch_rules.arguments(f" --comment={raw}", release)
        except sbatch_rules.Fatal:
            assert out.returncode != 0 and "Unmatched" in out.stderr, (raw, out)
            continue
        if len(args) > 1:  # a second argument that is no option: sbatch refuses the script
            assert out.returncode != 0 and "Invalid directive" in out.stderr, (raw, args, out)
            continue
        assert out.returncode == 0, (raw, out.stderr)
        job = out.stdout.strip().split(";")[0]
        try:
            stored = subprocess.run(["squeue", "-h", "-j", job, "-o", "%k"], capture_output=True, text=True,
                                    timeout=60).stdout.rstrip("\n")
        finally:
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
        assert [f"--comment={stored}"] == args, (raw, release)
