"""The corpora of a sweep: each distinct one (dataset, data file, data folder) once, prepared on the login node
before anything is submitted, so that array tasks only read it (and a corpus that fails stops the launch).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tinygpt.launch.spec.sweep import Run, Sweep


CORPUS_KEYS = ("dataset", "data_file", "data_dir")


def first_runs(sweep: Sweep) -> list[Run]:
    """The first run of each distinct corpus (dataset, data file, data folder) of the sweep."""
    first: dict[tuple, Run] = {}
    for run in sweep.runs:  # (by the inputs, not by each run's whole config: a sweep may have 100,000 runs)
        first.setdefault(tuple(repr(run.own.get(k, run.shared.get(k))) for k in CORPUS_KEYS), run)
    return list(first.values())


def prepare_data(sweep: Sweep) -> tuple[list[str], list[str]]:
    """Prepare each distinct corpus once on this node, so array tasks only read: (the prepared folders, the
    problems of the corpora that could not be prepared, one message each)."""
    from tinygpt.data import DataError, prepare_from_config

    done, problems = [], []
    for run in first_runs(sweep):
        data = run.config.data
        try:
            prepared = prepare_from_config(data.dataset, data.data_file, data.data_dir,
                                           warn=lambda m: print(f"warning: {m}", file=sys.stderr))
        except DataError as err:
            problems.append(f"run `{run.name}`: {err}")
            continue
        done.append(str(prepared.path))
    return done, problems
