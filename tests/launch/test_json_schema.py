"""The JSON Schema files that editors check specs and profiles with: written from the loader's own models,
committed, and true of every shipped file."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.support.processes import launch
from tinygpt.launch.commands import json_schema
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.spec import profiles
from tinygpt.launch.spec import sweep as spec_mod

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [("spec", p) for p in sorted((ROOT / "jobs").glob("*.yaml"))] + \
          [("profile", p) for p in sorted((ROOT / "hpc_lab" / "clusters").glob("*.yaml"))]


def validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(json_schema.path(kind).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("kind", json_schema.KINDS)
def test_the_committed_schema_files_are_the_ones_the_models_write(kind):
    assert json_schema.path(kind).read_text() == json_schema.text(kind), (
        f"{json_schema.path(kind)} is stale: run `python launch.py schema --write` and commit it")


def test_launch_py_schema_prints_the_committed_file():
    out = launch("schema", "profile")
    assert out.returncode == 0 and out.stdout == json_schema.path("profile").read_text(), out.stderr


def test_there_are_shipped_specs_and_profiles_to_check():
    assert {kind for kind, _ in SHIPPED} == {"spec", "profile"} and len(SHIPPED) >= 8


@pytest.mark.parametrize("kind, path", SHIPPED, ids=[p.name for _, p in SHIPPED])
def test_every_shipped_file_names_its_schema_and_is_valid_against_it(kind, path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), first
    assert (path.parent / first.partition("$schema=")[2]).resolve() == json_schema.path(kind)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator(kind).iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


# Mistakes the loader refuses, refused by the JSON Schema too: an editor marks them as they are typed.
BAD_SPECS = [
    {"name": "s", "train": {"n_embed": 64}},
    {"name": "s", "train": {"model": {"n_layers": 2}}},
    {"name": "s", "train": {"out_dir": "/tmp/x"}},
    {"name": "s", "grid": {"dropuot": [0.1]}},
    {"name": "s", "runs": [{"name": "a", "lr": "fast"}]},
    {"name": "s", "resources": {"nodes": 0}},
    {"name": "s", "resources": {"time": "soon"}},
    {"name": "s", "backend": "slurmx"},
    {"name": "s", "search": {"trials": 2, "params": {"lr": {"lognormal": [1, 2]}}}},
    {"name": "s", "train": {"precision": "fp8"}},
    {"name": "s", "clster": "local"},
]
BAD_PROFILES = [{"node": {"gpu": 4}}, {"partitions": {"gpu": {"max_tme": 10}}}, {"gpu_request": "gpus"},
                {"signal_lead_s": -1}, {"precision": "fp8"}, {"container": {"image": "/x.sif", "arg": "--nv"}}]


@pytest.mark.parametrize("data", BAD_SPECS, ids=[json.dumps(d)[:60] for d in BAD_SPECS])
def test_a_bad_spec_is_refused_by_the_loader_and_by_the_json_schema(tmp_path, data):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LaunchError):
        spec_mod.load(path, tmp_path)
    assert list(validator("spec").iter_errors(data))


@pytest.mark.parametrize("data", BAD_PROFILES, ids=[json.dumps(d)[:60] for d in BAD_PROFILES])
def test_a_bad_profile_is_refused_by_the_loader_and_by_the_json_schema(tmp_path, data):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"name": "site", **data}))
    with pytest.raises(LaunchError):
        profiles.from_file(path)
    assert list(validator("profile").iter_errors(data))


def test_status_json_follows_its_schema_for_a_run_in_each_state_its_directory_can_say(tmp_path):
    """`status --json` of a sweep whose runs' directories say NOT_STARTED, STARTED (a step), FINISHED and HUNG
    (the cluster's states, test_relaunch.py): one document, valid against schemas/status.schema.json."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "command": {"argv": ["prog"]}, "grid": {"a": [1, 2, 3, 4]}}))
    assert launch(str(spec), "--dry-run", "--workdir", str(tmp_path)).returncode == 0
    said = {"a-2": [{"step": 3, "loss": 0.5}], "a-3": [{"step": 3, "loss": 0.5}, {"event": "finished", "step": 3}],
            "a-4": [{"step": 1}, {"event": "hung", "step": 1, "heartbeat_age_s": 9.0, "time": 0}]}
    for run, lines in said.items():
        (tmp_path / "runs" / "s" / run).mkdir(parents=True)
        (tmp_path / "runs" / "s" / run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = launch("status", str(spec), "--json", "--workdir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    validator("status").validate(document)
    assert [(r["name"], r["state_name"], r["step"]) for r in document["runs"]] == [
        ("a-1", "NOT_STARTED", None), ("a-2", "STARTED", 3), ("a-3", "FINISHED", 3), ("a-4", "HUNG", 1)]
    assert document["program"] == "command" and document["counts"] == {"NOT_STARTED": 1, "STARTED": 1, "FINISHED": 1,
                                                                       "HUNG": 1}


def test_check_json_follows_its_schema_when_the_spec_is_refused(tmp_path):
    """Without a cluster, `check` refuses (Slurm does not answer): its document says so, valid against
    schemas/check.schema.json (the cluster's `ok`: cluster/test_relaunch.py)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "command": {"argv": ["prog"]}}))
    out = launch("check", str(spec), "--json", "--workdir", str(tmp_path))
    document = json.loads(out.stdout)
    validator("check").validate(document)
    assert out.returncode == document["exit_status"] != 0 and not document["ok"] and document["problems"], document
