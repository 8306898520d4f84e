"""A spec launched again on the real local cluster (act/relaunch.py): the runs of the sweep that are finished,
live or failed are shown and left alone, only the new ones are submitted (their own array, their own script), a
run the spec now defines otherwise is refused or, with --fresh, started anew beside its old directory, and a run
that left the spec is named with how to stop it. The programs are one shell line each: cheap, and not Python."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.support import finished_sweep
from tests.support.paths import ROOT
from tests.support.processes import launch, wait_until
from tests.support.slurm import cancel, manifest_of, unique_name, wait

pytestmark = pytest.mark.slurm

SLEEP_EXIT = ["sh", "-c", "sleep {sleep}; echo ran {run_name}; exit {code}"]


def write(tmp_path: Path, name: str, runs: list[dict], values: dict | None = None) -> Path:
    spec = tmp_path / f"{name}-{len(list(tmp_path.glob('*.yaml')))}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "command": {"argv": SLEEP_EXIT, "project": str(tmp_path),
                                                              "values": {"sleep": 0, "code": 0, **(values or {})}},
                                    "runs": runs, "resources": {"time": "00:05:00"}}))
    return spec


def launched(spec: Path, work: Path, *flags: str):
    out = launch(str(spec), "--workdir", str(work), *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def table(out) -> dict[str, str]:
    """{run: what} from the relaunch's table."""
    rows = [line.split(None, 2) for line in out.stdout.splitlines() if line.startswith("  ") and len(line.split()) > 1]
    return {row[0]: row[1] for row in rows}


def config_of(manifest: Path, index: int) -> dict:
    """What run `index`'s task reads when it starts: the manifest's base under the run's own values."""
    data = json.loads(manifest.read_text())
    run = data["runs"][index]
    return {**data["base"], **run["own"], "name": run["name"], "index": run["index"]}


def ended(work: Path, name: str, *runs: str) -> None:
    manifest = manifest_of(work, name)
    ids = manifest.task_job_ids()
    for run in manifest.runs:
        if run.name in runs:
            wait(ids[run.index], timeout=120)


@pytest.mark.shares_cluster
def test_a_finished_sweep_with_new_points_submits_the_new_ones_alone_and_a_changed_one_only_when_asked(tmp_path):
    name, work = unique_name("again"), tmp_path / "work"
    checked = launch("check", str(write(tmp_path, name, [{"name": "a"}, {"name": "b"}])), "--json", "--workdir",
                     str(work))
    document = json.loads(checked.stdout)
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "check.schema.json").read_text())).validate(
        document)
    assert document["ok"] and any("the spec fits cluster local" in line for line in document["said"]), document
    first = launched(write(tmp_path, name, [{"name": "a"}, {"name": "b"}]), work)
    ended(work, name, "a", "b")
    again = launched(write(tmp_path, name, [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}]), work)
    assert table(again) == {"a": "finished", "b": "finished", "c": "new", "d": "new"}, again.stdout
    manifest = manifest_of(work, name)
    newest = manifest.submissions[-1]
    assert (newest.indices, newest.array, newest.offset) == ([2, 3], "0-1", 2) and newest.script.endswith(
        f"{name}-launch2.sbatch") and "submitted 2 run(s)" in again.stdout, (first.stdout, again.stdout)
    ended(work, name, "c", "d")
    changed = write(tmp_path, name, [{"name": "a"}, {"name": "c", "sleep": 1}])
    refused = launch(str(changed), "--workdir", str(work))
    assert refused.returncode == 1 and "c (finished" in refused.stderr and "--fresh" in refused.stderr, refused
    assert manifest_of(work, name).submissions == manifest_of(work, name).submissions[:3]
    fresh = launched(changed, work, "--fresh")
    assert table(fresh) == {"a": "finished", "c": "changed", "b": "gone", "d": "gone"}, fresh.stdout
    assert [s.indices for s in manifest_of(work, name).submissions][-1] == [2]
    moved = [p.name for p in (work / "runs" / name).iterdir() if p.name.startswith("c.replaced-")]
    assert len(moved) == 1 and (work / "runs" / name / moved[0] / "metrics.jsonl").exists()
    ended(work, name, "c")
    nothing = launched(changed, work)
    assert table(nothing)["c"] == "finished" and "nothing new to submit" in nothing.stdout


@pytest.mark.shares_cluster
def test_a_live_and_failed_sweep_with_a_new_point_submits_it_alone_and_leaves_the_live_task_as_it_was(tmp_path):
    name, work = unique_name("live"), tmp_path / "work"
    launched(write(tmp_path, name, [{"name": "ok"}, {"name": "bad", "code": 3}, {"name": "long", "sleep": 300}]),
             work)
    ended(work, name, "ok", "bad")
    manifest = manifest_of(work, name)
    long_job = manifest.task_job_ids()[2]
    try:
        wait_until(lambda: (work / "runs" / name / "long").exists(), timeout=120, what="the long run started")
        before = config_of(manifest.path, 2)
        again = launched(write(tmp_path, name, [{"name": "ok"}, {"name": "bad", "code": 3},
                                                {"name": "long", "sleep": 300}, {"name": "more"}]), work)
        assert table(again) == {"ok": "finished", "bad": "failed", "long": "running", "more": "new"}, again.stdout
        after = manifest_of(work, name)
        assert config_of(after.path, 2) == before and after.submissions[-1].indices == [3]
        document = json.loads(launch("status", str(manifest.spec), "--json", "--workdir", str(work)).stdout)
        jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "status.schema.json").read_text())).validate(
            document)
        states = {r["name"]: r["state_name"] for r in document["runs"]}
        assert (states["ok"], states["bad"], states["long"]) == ("COMPLETED", "FAILED", "RUNNING"), document
        assert states["more"] in ("PENDING", "RUNNING", "COMPLETED") and document["unheard"] == []
        listed = launch("list", "--workdir", str(work))
        assert f"{name}  " in listed.stdout and "4 run(s): " in listed.stdout and "1 FAILED" in listed.stdout
        dry = launch(str(manifest.spec), "--workdir", str(work), "--dry-run")
        assert "would submit" not in dry.stdout and "nothing new to submit" in dry.stdout
        gone = launch(str(write(tmp_path, name, [{"name": "ok"}])), "--workdir", str(work), "--dry-run")
        assert f"stop it with `scancel {long_job}`" in gone.stdout, gone.stdout
    finally:
        cancel(long_job)


@pytest.mark.shares_cluster
def test_two_specs_with_one_sweep_name_never_train_a_run_twice(tmp_path):
    name, work = unique_name("shared"), tmp_path / "work"
    launched(write(tmp_path, name, [{"name": "x"}, {"name": "y"}]), work)
    ended(work, name, "x", "y")
    other = launched(write(tmp_path, name, [{"name": "y"}, {"name": "z"}]), work)
    assert table(other) == {"y": "finished", "z": "new", "x": "gone"}, other.stdout
    ended(work, name, "z")
    logs = "".join(p.read_text() for p in (work / "logs" / name).glob("*.out"))
    assert (logs.count("ran x"), logs.count("ran y"), logs.count("ran z")) == (1, 1, 1), logs
    spec = write(tmp_path, name, [{"name": "w"}])  # (another program: x, y and z would be resubmitted with it)
    spec.write_text(spec.read_text().replace("echo ran", "echo other"))
    refused = launch(str(spec), "--workdir", str(work))
    assert refused.returncode == 1 and "its runs x, y, z are not in this spec" in refused.stderr, refused.stderr


@pytest.mark.shares_cluster
def test_ten_thousand_finished_runs_and_ten_new_queue_ten_tasks(tmp_path):
    """The runs written finished long ago (sacct no longer knows their job: finished_sweep.forgotten), by a launcher
    that named runs `i=7` (finished_sweep.named_as_before): each is found where it is and none trained again, and
    the new ones are named as the sweep's others. The relaunch's time is bench/relaunch.py's to measure."""
    name, work = unique_name("big"), tmp_path / "work"

    def spec(runs: int) -> Path:
        path = tmp_path / f"{runs}.yaml"
        path.write_text(json.dumps({"name": name, "command": {"argv": ["true", "{i}"], "project": str(tmp_path)},
                                    "grid": {"i": list(range(runs))}, "resources": {"time": "00:05:00"}}))
        return path

    assert launch(str(spec(10_000)), "--dry-run", "--workdir", str(work)).returncode == 0
    finished_sweep.named_as_before(work / "jobs" / name / "manifest.json")
    finished_sweep.forgotten(work / "jobs" / name / "manifest.json")
    again = launch(str(spec(10_010)), "--hold", "--workdir", str(work))
    manifest = manifest_of(work, name)
    newest = manifest.submissions[1:]
    try:
        assert again.returncode == 0 and "relaunch: 10000 finished, 10 new" in again.stdout, again.stdout[-2000:]
        assert [(s.indices, s.array, s.offset) for s in newest] == [(list(range(10_000, 10_010)), "0-9", 10_000)]
        assert [r.name for r in manifest.runs[9_999:10_001]] == ["i=9999", "i=10000"]
        assert manifest.runs[0].out_dir == str(work / "runs" / name / "i=0") and manifest.naming == 1
    finally:
        cancel(*(s.job_id for s in newest))


@pytest.mark.shares_cluster
def test_code_that_changed_makes_a_run_changed_only_where_the_spec_asks(tmp_path):
    """`code_counts: true`: a run last submitted with other project files is changed (refused, saying so, or
    --fresh); without it, the same edit leaves the finished run alone. The spec, in the project, is no code of
    the program: a run added to it leaves the finished one finished."""
    name, work, project = unique_name("code"), tmp_path / "work", tmp_path / "project"
    project.mkdir()
    (project / "prog.sh").write_text("echo first\n")

    def spec(counts: bool, *more: str) -> Path:
        path = project / "sweep.yaml"
        path.write_text(yaml.safe_dump({"name": name, "code_counts": counts, "resources": {"time": "00:05:00"},
                                        "command": {"argv": ["sh", "prog.sh"], "project": str(project)},
                                        **({"runs": [{"name": n} for n in ("base", *more)]} if more else {})}))
        return path

    launched(spec(True), work)
    ended(work, name, "base")
    (project / "prog.sh").write_text("echo second\n")
    assert table(launched(spec(False), work))["base"] == "finished"
    refused = launch(str(spec(True)), "--workdir", str(work))
    assert refused.returncode == 1 and "; other code, as code_counts asks)" in refused.stderr, refused.stderr
    fresh = launched(spec(True), work, "--fresh")
    assert table(fresh)["base"] == "changed" and "submitted 1 run(s)" in fresh.stdout
    ended(work, name, "base")
    logs = "".join(p.read_text() for p in sorted((work / "logs" / name).glob("*.out")))
    assert "first" in logs and "second" in logs, logs  # (the run again, with the project as it is now)
    again = launched(spec(True, "extra"), work, "--hold")
    try:
        assert table(again) == {"base": "finished", "extra": "new"}, again.stdout
    finally:
        cancel(*(s.job_id for s in manifest_of(work, name).submissions[2:]))
