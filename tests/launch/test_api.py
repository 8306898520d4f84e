"""The library (`tinygpt.launch.api`) without a cluster: a spec built in Python, typed answers, and the commands'
errors with the commands' messages. (On the cluster: tests/cluster/test_notebook.py.)"""

import subprocess
import sys

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import run_cli
from tests.support.tiny import tiny_train
from tinygpt.launch import api, errors
from tinygpt.launch import manifest as manifest_mod


def spec(corpus, **extra) -> dict:
    return {"name": "lib", "train": {**tiny_train(max_steps=20), "data_file": str(corpus)},
            "grid": {"lr": [0.001, 0.003]}, **extra}


def test_a_spec_built_in_python_is_written_planned_and_followed_as_the_command_would(tmp_path, tiny_corpus):
    workdir = tmp_path / "w"
    sweep = api.launch(spec(tiny_corpus), workdir, dry_run=True, set={"max_steps": 7, "activation_checkpointing": True})
    assert (workdir / "lib.yaml").exists() and sweep.path == workdir / "jobs" / "lib" / "manifest.json"
    assert sweep.runs == ["lr-0.001", "lr-0.003"]
    # (as `--set max_steps=7 --set activation_checkpointing=true` records them: the trainer reads the words)
    assert (sweep.manifest.base["max_steps"], sweep.manifest.base["activation_checkpointing"]) == ("7", "true")
    status = sweep.status()
    assert status.counts == {"NOT_STARTED": 2} and [r.name for r in status.runs] == sweep.runs
    assert sweep.metrics() == {"lr-0.001": [], "lr-0.003": []}
    with pytest.raises(api.WaitTimeout, match=r"not ended after 0 s: lr-0.001 \(NOT_STARTED\), lr-0.003"):
        sweep.wait(timeout=0)
    with pytest.raises(api.LaunchError, match="runs: nope not in sweep `lib`; its runs: lr-0.001, lr-0.003"):
        sweep.metrics(["nope"])
    assert sweep.logs("lr-0.001") == []  # (never submitted)
    with pytest.raises(api.LaunchError, match="RUN: no run `nope` in sweep lib"):
        sweep.logs("nope")
    with pytest.raises(api.LaunchError, match="sweep `lib`: no report was written"):
        sweep.report()
    with pytest.raises(api.LaunchError, match=r"--run: lr-0.001 never went to Slurm \(it waits for a wave, or"):
        sweep.cancel(["lr-0.001"])
    (listed,) = api.list_sweeps(workdir)
    assert (listed.sweep, listed.runs, listed.states, listed.problem) == ("lib", 2, {"NOT_STARTED": 2}, None)
    again = api.launch(spec(tiny_corpus), workdir, dry_run=True)  # (the same mapping: its file is the same)
    assert again.runs == sweep.runs and api.open_sweep(workdir / "lib.yaml", workdir).path == sweep.path
    assert sweep.reload().submissions == []  # (the manifest `again` wrote, read)
    manifest_mod.record_submission(sweep.path, "sbatch", "100", [0, 1], array="0", pack=2)  # (one task, both runs)
    assert [s.job_id for s in sweep.reload().submissions] == ["100"]  # (appended beside the manifest, as a wave is)
    with pytest.raises(api.LaunchError, match="--run: packed in one task with lr-0.003, which would be cancelled"):
        sweep.cancel(["0"])
    status, said = run_cli(["cancel", str(workdir / "lib.yaml"), "--workdir", str(workdir), "--run", "nope"])
    assert status == 1 and said.startswith("error: RUN: no run `nope` in sweep lib")  # (nothing asked of Slurm)


def test_the_librarys_refusals_are_the_commands_and_write_nothing(tmp_path, tiny_corpus):
    workdir = tmp_path / "w"
    with pytest.raises(api.LaunchError, match=r"name: a spec given as a mapping needs its `name`"):
        api.launch({"train": {}}, workdir, dry_run=True)
    (workdir / "lib.yaml").parent.mkdir()
    (workdir / "lib.yaml").write_text("name: lib\n")
    with pytest.raises(api.LaunchError, match=r"lib.yaml holds another spec; give this one another `name`"):
        api.launch(spec(tiny_corpus), workdir, dry_run=True)
    assert (workdir / "lib.yaml").read_text() == "name: lib\n" and not (workdir / "jobs").exists()

    bad = spec(tiny_corpus, name="bad")
    bad["train"]["n_layers"] = 2
    with pytest.raises(api.LaunchError) as refused:
        api.launch(bad, workdir, dry_run=True)
    assert sorted(p.name for p in workdir.iterdir()) == ["lib.yaml"]  # (the refused spec's file went with it)
    assert api.check(bad, workdir, cluster="local").ok is False
    assert sorted(p.name for p in workdir.iterdir()) == ["lib.yaml"]  # (a check writes nothing either)
    (workdir / "bad.yaml").write_text(yaml.safe_dump(bad))  # (the same file, written by hand for the command)
    status, said = run_cli([str(workdir / "bad.yaml"), "--dry-run", "--workdir", str(workdir)])
    assert status == refused.value.exit_status == 1 and said == f"error: {refused.value}\n"
    assert "did you mean `n_layer`" in said and not (workdir / "jobs").exists()
    assert (api.SlurmAway.exit_status, api.LoginAway.exit_status) == (errors.TRY_AGAIN, 75)
    assert all(issubclass(getattr(api, name), api.LaunchError) for name in api.__all__ if name.endswith(
        ("Error", "Away", "Busy", "Timeout", "Refused")))


def test_the_librarys_public_surface_is_typed():
    """mypy, strict, over the library's module (what it imports is read, not judged): its public surface says the
    types of everything it takes and answers."""
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
                          "tinygpt/launch/api.py"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
