"""Search in a spec: random points drawn here, or Optuna's adaptive search run by the jobs themselves.

    search:
      method: random
      trials: 32              # this many runs, in the one job array
      seed: 0                 # the same spec and seed give the same runs
      params:
        lr: {loguniform: [1.0e-4, 3.0e-3]}
        n_layer: {choice: [2, 4, 6]}
        dropout: {uniform: [0.0, 0.3]}
        n_head: {int: [1, 8]}  # whole numbers, both ends included

Every other trainer key comes from `train`, as for a grid. A drawn float keeps 4 significant digits, so a
run's name says exactly what it trains with: `trial-07_lr-0.0004813_n_layer-4`. Each point is then checked
like a grid point (the trainer's schema, before anything is written).

`method: optuna` (with `workers: W`, `sampler: tpe|random`, `pruner: asha|median|none`) makes the sweep W
array tasks, each an Optuna worker (tinygpt/launch/node/search_worker.py) on one study in a journal file under the
sweep's folder: it asks for a trial, trains it, reports the validation loss at every evaluation and stops
the trial when the pruner says so. The trial's values are drawn by Optuna from the same `params`; at
launch every value a trial may get is checked, and every combination of two (points_to_check). A search of a
program of the user's (`command:`) names the value of its metrics.jsonl to minimise: `metric: loss` (and `value:
last` or `best`).
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, WithJsonSchema, field_validator

from tinygpt.base import schema
from tinygpt.base.schema import Int, OptFloat, OptInt, OptText

METHODS = ("random", "optuna")
DISTRIBUTIONS = ("choice", "uniform", "loguniform", "int")
OPTUNA_KEYS = ("workers", "sampler", "pruner", "target", "budget_s", "metric", "value")  # method optuna's alone
SAMPLERS = ("tpe", "random")
PRUNERS = ("asha", "median", "none")
MAX_TRIALS = 100_000
MAX_WORKERS = 1000
OPTUNA_EXTRA = 'Optuna is not installed here: pip install -e ".[search]"'


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _distribution(raw: Any) -> tuple[str, list]:
    """{loguniform: [1e-4, 1e-2]} -> ("loguniform", [1e-4, 1e-2]), checked."""
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in DISTRIBUTIONS:
        raise ValueError(f"expected one of {', '.join(DISTRIBUTIONS)}, e.g. {{loguniform: [1.0e-4, 1.0e-2]}} or "
                         f"{{choice: [2, 4]}}; got {raw!r}")
    kind, args = next(iter(raw.items()))
    if kind == "choice":
        if not isinstance(args, list) or not args:
            raise ValueError("choice: expected a non-empty list of values")
        return kind, args
    if isinstance(args, list):  # (a number written as text, 2.0e-3, is that number: schema.load_yaml)
        args = [schema.number_from_text(a) for a in args]
    ok = isinstance(args, list) and len(args) == 2 and all(_number(a) for a in args) and args[0] <= args[1]
    if ok and kind == "int":
        ok = all(isinstance(a, int) for a in args)
    if ok and kind == "loguniform":
        ok = args[0] > 0
    if not ok:
        need = {"uniform": "two numbers [low, high]", "loguniform": "two numbers 0 < low <= high",
                "int": "two whole numbers [low, high]"}[kind]
        raise ValueError(f"{kind}: expected {need}, got {args!r}")
    return kind, args


_RANGE = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
_DISTRIBUTION_SCHEMA = {"oneOf": [
    {"type": "object", "properties": {"choice": {"type": "array", "minItems": 1}}, "required": ["choice"],
     "additionalProperties": False},
    *({"type": "object", "properties": {kind: _RANGE}, "required": [kind], "additionalProperties": False}
      for kind in ("uniform", "loguniform")),
    {"type": "object", "properties": {"int": {**_RANGE, "items": {"type": "integer"}}}, "required": ["int"],
     "additionalProperties": False},
], "description": "one of {choice: [values]}, {uniform: [low, high]}, {loguniform: [low, high]}, {int: [low, high]}"}
Distribution = Annotated[tuple[str, list], BeforeValidator(_distribution), WithJsonSchema(_DISTRIBUTION_SCHEMA)]


class Search(schema.Schema):
    """A spec's `search` section (each check on one field, so that one problem hides no other)."""

    method: Literal[METHODS] = Field("random", description="random: drawn here; optuna: adaptive, run by the jobs")
    trials: Int = Field(ge=1, le=MAX_TRIALS, description="how many trials")
    workers: OptInt = Field(None, ge=1, le=MAX_WORKERS, description="optuna: array tasks asking for trials")
    sampler: Literal[SAMPLERS] | None = Field(None, description="optuna: tpe (default) or random")
    pruner: Literal[PRUNERS] | None = Field(None, description="optuna: asha (default), median or none")
    target: OptFloat = Field(None, gt=0, description=(
        "optuna: a validation loss; a trial stops when it reaches it, and the study minimises the seconds of "
        "training that took (needs budget_s)"))
    budget_s: OptFloat = Field(None, gt=0, description=(
        "optuna: seconds of training (evaluations not counted) after which a trial stops"))
    metric: OptText = Field(None, description=(
        "optuna, for a command: the named value of the runs' metrics.jsonl that the study minimises"))
    value: Literal["last", "best"] | None = Field(None, description=(
        "optuna, for a command: the metric's last value (default) or its best (lowest)"))
    seed: Int = Field(0, description="the same spec and seed give the same trials")
    params: dict[str, Distribution] = Field(min_length=1, description="trainer keys and their distributions",
                                            json_schema_extra={"hint": "trainer keys and their distributions, e.g. "
                                                                       "{lr: {loguniform: [1.0e-4, 1.0e-2]}}"})

    @field_validator("method")
    @classmethod
    def _optuna_installed(cls, method: str) -> str:
        if method == "optuna":
            try:
                import optuna  # noqa: F401
            except ImportError:
                raise ValueError(f"optuna: {OPTUNA_EXTRA}") from None
        return method

    @field_validator(*OPTUNA_KEYS)
    @classmethod
    def _of_optuna(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("method", "optuna") != "optuna":
            raise ValueError("is a key of method optuna; remove it, or set method: optuna")
        return value

    @field_validator("budget_s")
    @classmethod
    def _a_budget_for_a_target(cls, budget: float | None, info: ValidationInfo) -> float | None:
        if budget is None and info.data.get("target") is not None:
            raise ValueError("a search with a target needs budget_s, the seconds after which a trial that has not "
                             "reached it stops (and scores budget_s and more)")
        return budget

    @field_validator("seed")
    @classmethod
    def _in_numpys_range(cls, seed: int, info: ValidationInfo) -> int:
        workers = info.data.get("workers") or 1
        if info.data.get("method") == "optuna" and not 0 <= seed <= 2**32 - workers:
            # (worker w's sampler is seeded seed + w, in numpy's range)
            raise ValueError(f"an Optuna search's seed must be from 0 to 2^32 - workers ({2**32 - workers:,}), "
                             f"got {seed}")
        return seed

    def settings(self) -> dict[str, Any]:
        """What the launcher and the workers keep of it: {method, trials, seed, dists[, workers, sampler,
        pruner, target, budget_s]}."""
        extra = {"workers": self.workers or 1, "sampler": self.sampler or "tpe", "pruner": self.pruner or "asha",
                 **{k: getattr(self, k) for k in ("target", "budget_s", "metric", "value")
                    if getattr(self, k) is not None}} \
            if self.method == "optuna" else {}
        return {"method": self.method, "trials": self.trials, "seed": self.seed, "dists": dict(self.params), **extra}


def _draw(rng: random.Random, kind: str, args: list) -> Any:
    if kind == "choice":
        return args[rng.randrange(len(args))]
    if kind == "int":
        return rng.randint(args[0], args[1])
    low, high = args
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if kind == "loguniform" else rng.uniform(low, high)
    return float(f"{value:.4g}")


def points(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The point of each trial of a random search, in trial order."""
    rng = random.Random(settings["seed"])
    return [{key: _draw(rng, *dist) for key, dist in settings["dists"].items()} for _ in range(settings["trials"])]


INT_VALUES_CHECKED = 256  # an `int` range up to this wide is checked value by value (divisibility needs it)
POINTS_CHECKED = 5_000  # every combination up to this many, else every pair of values (each check ~0.1 ms)


def values_to_check(kind: str, args: list) -> list:
    """The values of one parameter that a launch check covers: every choice, every whole number of a range
    (up to INT_VALUES_CHECKED, else its ends), the ends of a float range."""
    if kind == "choice":
        return list(args)
    if kind == "int" and args[1] - args[0] < INT_VALUES_CHECKED:
        return list(range(args[0], args[1] + 1))
    return [args[0], args[1]]


def points_to_check(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Points that cover what an Optuna search may ask: every combination of the parameters' values when
    there are few, else every pair of values of every two parameters (the others at their first value),
    which covers every constraint between two keys (heads divide the width, min_lr <= lr)."""
    values = {key: values_to_check(*dist) for key, dist in settings["dists"].items()}
    if math.prod(len(v) for v in values.values()) <= POINTS_CHECKED:
        return [dict(zip(values, combo)) for combo in itertools.product(*values.values())]
    first = {key: v[0] for key, v in values.items()}
    points = {}
    for a, b in itertools.combinations(values, 2):
        for x, y in itertools.product(values[a], values[b]):
            point = {**first, a: x, b: y}
            points[tuple(point.items())] = point
    return list(points.values())


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
