"""Random search in a spec: the same runs for the same seed, every draw in range, bad sections named."""

import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.base import schema
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.spec import search
from tinygpt.launch.spec import sweep as spec_mod

SEARCH = {"method": "random", "trials": 12, "seed": 7,
          "params": {"lr": {"loguniform": [1.0e-4, 3.0e-3]}, "n_layer": {"choice": [1, 2]},
                     "dropout": {"uniform": [0.0, 0.3]}, "n_head": {"choice": [1, 2, 4]}, "seed": {"int": [1, 5]}}}
TRAIN = {"max_steps": 50, "dataset": "pydoc", "min_lr": 1.0e-5, "n_embd": 32, "block_size": 16}


def load(tmp_path: Path, **spec) -> spec_mod.Sweep:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "train": TRAIN, **spec}))
    return spec_mod.load(path, tmp_path)


def test_the_same_seed_gives_the_same_runs_and_another_seed_others(tmp_path):
    first, again = load(tmp_path, search=SEARCH), load(tmp_path, search=SEARCH)
    assert [(r.name, r.config) for r in first.runs] == [(r.name, r.config) for r in again.runs]
    other = load(tmp_path, search={**SEARCH, "seed": 8})
    assert [r.name for r in other.runs] != [r.name for r in first.runs]
    assert len(first.runs) == 12 and len({r.name for r in first.runs}) == 12
    run = first.runs[3]
    assert run.name.startswith("trial-03_") and f"n_layer-{run.config.model.n_layer}" in run.name
    assert run.config.optim.lr == run.point["lr"] and f"lr-{run.point['lr']!r}" in run.name
    assert run.config.optim.max_steps == 50  # the fixed train keys hold for every trial


def test_search_combines_with_explicit_runs_but_not_with_a_grid(tmp_path):
    sweep = load(tmp_path, search={**SEARCH, "trials": 2}, runs=[{"name": "baseline", "lr": 1.0e-3}])
    assert [r.name.split("_")[0] for r in sweep.runs] == ["trial-0", "trial-1", "baseline"]
    with pytest.raises(LaunchError, match="a spec has a grid or a search, not both"):
        load(tmp_path, search=SEARCH, grid={"lr": [1.0e-3, 2.0e-3]})


@pytest.mark.parametrize("section, message", [
    ({**SEARCH, "method": "grid"}, "search.method: expected one of random or optuna, got 'grid'"),
    ({**SEARCH, "trials": 0}, "search.trials: must be from 1 to 100,000, got 0"),
    ({**SEARCH, "seed": "x"}, "search.seed: expected a whole number, got 'x'"),
    ({**SEARCH, "params": {}}, "search.params: expected at least 1 item(s) (trainer keys and their distributions"),
    ({**SEARCH, "params": {"lr": [1, 2]}}, "search.params.lr: expected one of choice, uniform, loguniform, int"),
    ({**SEARCH, "params": {"lr": {"loguniform": [0, 1]}}},
     "search.params.lr: loguniform: expected two numbers 0 < low"),
    ({**SEARCH, "params": {"n_layer": {"int": [1.5, 3]}}}, "search.params.n_layer: int: expected two whole numbers"),
    ({**SEARCH, "params": {"lr": {"uniform": [3, 1]}}}, "search.params.lr: uniform: expected two numbers [low, high]"),
    ({**SEARCH, "params": {"n_layers": {"choice": [1]}}}, "search.params: unknown key `n_layers` (did you mean"),
    ({**SEARCH, "budgets": 3}, "unknown key `search.budgets` (did you mean `budget_s`?); valid keys of `search` are"),
])
def test_bad_search_sections_are_named(tmp_path, section, message):
    with pytest.raises(LaunchError) as err:
        load(tmp_path, search=section)
    assert message in str(err.value)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(-(2**40), 2**40), trials=st.integers(1, 30),
       low=st.floats(1e-6, 1.0), span=st.floats(1.0, 1e3), ints=st.tuples(st.integers(-5, 5), st.integers(0, 9)))
def test_every_draw_is_in_its_range_and_the_same_for_the_same_seed(seed, trials, low, span, ints):
    raw = {"trials": trials, "seed": seed, "params": {
        "a": {"loguniform": [low, low * span]}, "b": {"uniform": [-low, low * span]},
        "c": {"int": [ints[0], ints[0] + ints[1]]}, "d": {"choice": ["x", 3, None]}}}
    drawn = search.points(schema.validate(search.Search, raw).settings())
    assert len(drawn) == trials and drawn == search.points(schema.validate(search.Search, raw).settings())
    for point in drawn:
        assert low * (1 - 1e-3) <= point["a"] <= low * span * (1 + 1e-3) and math.isfinite(point["b"])
        assert -low * (1 + 1e-3) <= point["b"] <= low * span * (1 + 1e-3)
        assert ints[0] <= point["c"] <= ints[0] + ints[1] and isinstance(point["c"], int)
        assert point["d"] in ("x", 3, None)


def test_a_random_search_runs_locally(tmp_path, tiny_corpus):
    import subprocess
    import sys

    from tests.support.paths import ROOT
    from tests.support.processes import python_env

    spec = tmp_path / "rs.yaml"
    spec.write_text(yaml.safe_dump({"name": "rs", "train": {
        "data_file": str(tiny_corpus), "n_layer": 1, "n_embd": 32, "block_size": 16, "batch_size": 4, "max_steps": 6,
        "eval_interval": 3, "sample_tokens": 0, "eval_windows": 8, "threads": 1, "min_lr": 1.0e-6},
        "search": {"trials": 2, "seed": 1, "params": {"lr": {"loguniform": [1.0e-4, 1.0e-3]},
                                                     "n_head": {"choice": [1, 2]}}}}))
    with tempfile.TemporaryDirectory() as work:
        out = subprocess.run([sys.executable, str(ROOT / "launch.py"), str(spec), "--local", "--workdir", work],
                             capture_output=True, text=True, env=python_env(), cwd=ROOT, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert len(list((Path(work) / "runs" / "rs").glob("trial-*/checkpoints/*.pt"))) >= 2


def test_an_optuna_launch_checks_every_value_and_every_pair_of_values():
    dists = {"n_head": ("int", [1, 8]), "n_embd": ("choice", [24, 32]), "lr": ("loguniform", [1e-4, 1e-2])}
    few = search.points_to_check({"dists": dists})
    assert len(few) == 8 * 2 * 2 and {(p["n_head"], p["n_embd"]) for p in few} == {
        (h, e) for h in range(1, 9) for e in (24, 32)}
    # Too many combinations for all of them: every pair of values of every two keys, the others at their first
    many = {**dists, "n_layer": ("int", [1, 40]), "block_size": ("int", [8, 200])}
    points = search.points_to_check({"dists": many})
    values = {k: search.values_to_check(*d) for k, d in many.items()}
    assert math.prod(len(v) for v in values.values()) > search.POINTS_CHECKED and len(points) < 10_000
    for a in many:
        for b in many:
            if a != b:
                assert {(p[a], p[b]) for p in points} == {(x, y) for x in values[a] for y in values[b]}, (a, b)
    # A range too wide to walk is checked at its ends
    assert search.values_to_check("int", [1, 10_000]) == [1, 10_000]
