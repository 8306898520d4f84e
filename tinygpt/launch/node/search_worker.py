"""`python -m tinygpt.launch.node.search_worker MANIFEST INDEX`: one Optuna worker of a sweep's adaptive search.

An array task of a sweep whose spec says `search: {method: optuna, ...}` (tinygpt/launch/spec/search.py) runs
this instead of one trainer. Every worker shares one study, kept in a journal file under the sweep's
folder (a file on the shared filesystem: no database server). In a loop, the worker asks the study for a
trial (under a lock, so that the workers never start more than `trials` together; the locks are
tinygpt/launch/node/study_journal.py's), trains it with the real trainer in `runs/<sweep>/trial=NNN/`, reports the
validation loss at every evaluation, and stops the trial there when the pruner says so (recorded as
pruned, with its step).

A preemption or the time limit stops the trainer as always (checkpoint saved, job requeued); the worker
then leaves its trial RUNNING in the study, and `worker.json` in its own run directory names it, so that
the next life of the task resumes that trial from its checkpoint instead of losing it.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tinygpt.base import durable
from tinygpt.job import REQUEUE_EXIT
from tinygpt.launch.layout import pair
from tinygpt.training import preemption

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest, RunRecord, SearchRecord


def open_study(search: SearchRecord, name: str, worker: int):
    import optuna

    from tinygpt.launch.node import study_journal

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = study_journal.storage(search.journal)
    seed = search.seed + worker  # (workers with the same seed would draw the same startup trials)
    sampler = (optuna.samplers.TPESampler(seed=seed) if search.sampler == "tpe"
               else optuna.samplers.RandomSampler(seed=seed))
    pruner = make_pruner(search)
    return optuna.create_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner,
                               direction="minimize", load_if_exists=True)


def make_pruner(search: SearchRecord):
    """The study's pruner. In a search for the recipe that reaches a target soonest, trials are compared at
    equal seconds of training (they report their losses at whole seconds, `report_at`), not at equal steps,
    whose cost differs with batch and width; and none is judged before an eighth of its budget (left to
    themselves, ASHA and the median rule judged at the first evaluation, where the warm-up decides)."""
    import optuna

    if search.pruner == "none":
        return optuna.pruners.NopPruner()
    first = max(1, round(search.budget_s / 8)) if search.target is not None and search.budget_s else None
    if search.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(**({"min_resource": first} if first else {}))
    return optuna.pruners.MedianPruner(**({"n_warmup_steps": first} if first else {}))


def report_at(search: SearchRecord, step: int, train_s: float) -> int:
    """Where on the pruner's axis an evaluation lies: its step, or, in a search with a target, its whole
    seconds of training."""
    return int(train_s) if search.target is not None else step


def suggest(trial, key: str, kind: str, args: list) -> Any:
    if kind == "choice":
        return trial.suggest_categorical(key, args)
    if kind == "int":
        return trial.suggest_int(key, args[0], args[1])
    return trial.suggest_float(key, args[0], args[1], log=kind == "loguniform")


def next_trial(study, search: SearchRecord, state: Path, worker: int):
    """The trial this worker left running in an earlier life, else a new one while the budget lasts."""
    import optuna

    from tinygpt.launch.node.study_journal import asking

    try:
        number = json.loads(state.read_text())["trial"]
    except (OSError, ValueError, KeyError, TypeError):  # (none, or damaged: no trial to resume)
        number = None
    trials = study.get_trials(deepcopy=False)
    left = [t for t in trials if t.number == number and t.state == optuna.trial.TrialState.RUNNING]
    if left:
        return optuna.trial.Trial(study, left[0]._trial_id), True
    with asking(search.journal):
        if len(study.get_trials(deepcopy=False)) >= search.trials:
            return None, False
        trial = study.ask()
        # Named at once, before anything else takes a lock: a worker killed from here on resumes this trial in
        # its next life instead of leaving it RUNNING for ever, counted in the budget and never finished.
        durable.write(state, json.dumps({"trial": trial.number}) + "\n")
    trial.set_user_attr("worker", worker)
    return trial, False


def run_trial(trial, manifest: Manifest, run: RunRecord, say) -> tuple[str, int | None]:
    """Train one trial and tell the study how it ended: (its state, an exit status when the worker must stop
    now, preempted and being requeued, else None). A trial that fails in any way, a resumed one included, is
    told FAIL: one left RUNNING would be resumed, and fail, in every life of the worker."""
    import optuna

    try:
        return _train_trial(trial, manifest, run)
    except Exception as err:  # (a bug's traceback is printed; the study moves on)
        trial.set_user_attr("error", str(err)[:2000])
        trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if not isinstance(err, TrialError):
            traceback.print_exc()
        say(f"trial {trial.number} failed: {err}; marked failed")
        return "FAIL", None


class TrialError(Exception):
    """A trial that cannot train: its point is not a valid config, or the trainer stopped with an error."""


def _train_trial(trial, manifest: Manifest, run: RunRecord) -> tuple[str, int | None]:
    import optuna

    from tinygpt.base import config as config_mod
    from tinygpt.training import trainer

    search = manifest.search
    params = {key: suggest(trial, key, kind, args) for key, (kind, args) in search.dists.items()}
    width = len(str(search.trials - 1))
    out_dir = Path(run.out_dir).parent / pair("trial", f"{trial.number:0{width}d}", manifest.naming)  # (the workers')
    if manifest.command is not None:
        return _command_trial(trial, manifest, {**manifest.base, **run.own, **params}, out_dir)
    try:
        cfg = config_mod.build({**manifest.base, **run.own, **params, "out_dir": str(out_dir)})
    except config_mod.ConfigError as err:
        raise TrialError(f"{params} is not a valid config ({err})") from None
    trial.set_user_attr("run_dir", str(out_dir))

    curve: list[dict] = []  # this life's evaluations: {step, val_loss, train_s}

    def report(step: int, val_loss: float, train_s: float) -> bool:
        curve.append({"step": step, "val_loss": val_loss, "train_s": train_s})
        if ended_by_budget(search, curve):
            return True  # (scored below)
        trial.report(val_loss, report_at(search, step, train_s))
        return trial.should_prune()

    try:
        result = trainer.train(cfg, eval_hook=report)
    except trainer.TrainingError as err:
        raise TrialError(str(err)) from None
    ended = result.finished or (result.pruned and ended_by_budget(search, curve))  # (not by the pruner)
    if ended and search.target is not None and curve:
        value, facts = time_to_target(search, curve, cfg.tokens_per_step())
        for key, fact in facts.items():
            trial.set_user_attr(key, fact)
        trial.study.tell(trial, value)
        return "COMPLETE", None
    if ended:
        trial.study.tell(trial, result.best_val_loss)
        return "COMPLETE", None
    if result.pruned:
        trial.set_user_attr("pruned_at", result.step)
        trial.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return "PRUNED", None
    return "RUNNING", result.exit_code  # stopped by a signal and saved: the trial resumes in the next life


def _command_trial(trial, manifest: Manifest, values: dict[str, Any], out_dir: Path) -> tuple[str, int | None]:
    """A trial of a program of the user's: started as a run is (node/supervise.py), each new value of the search's
    metric reported as the program writes it, stopped when the pruner says so; scored by the metric's last or
    best value. A program that saves and asks for a requeue (75) leaves the trial RUNNING for the next life."""
    import optuna

    from tinygpt.launch.node import supervise
    from tinygpt.training.metrics import of_run, read, series

    search = manifest.search
    trial.set_user_attr("run_dir", str(out_dir))
    seen: list[tuple[int, float]] = []
    lines = [0]  # (the records read so far)

    def watch() -> bool:
        records = read(of_run(out_dir))
        new = series(records[lines[0]:]).get(search.metric, [])
        lines[0] = len(records)
        for step, value in new:
            trial.report(value, step)
        seen.extend(new)
        return bool(new) and trial.should_prune()

    ended = supervise.run_program(manifest, out_dir.name, values, out_dir, watch)
    watch()  # (what it wrote last)
    if ended.code is None:
        trial.set_user_attr("pruned_at", seen[-1][0])
        trial.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return "PRUNED", None
    if ended.code == REQUEUE_EXIT:
        return "RUNNING", supervise.after(ended, manifest, out_dir.name)
    if ended.code != 0 or not seen:
        raise TrialError(f"the program ended with exit status {ended.code}" if ended.code else
                         f"the program wrote no `{search.metric}` to {of_run(out_dir)}")
    trial.study.tell(trial, min(v for _, v in seen) if search.value == "best" else seen[-1][1])
    return "COMPLETE", None


def ended_by_budget(search: SearchRecord, curve: list[dict]) -> bool:
    """The trial is done before max_steps: it reached the search's target, or spent its seconds."""
    last = curve[-1]
    return (search.target is not None and last["val_loss"] <= search.target) or (
        search.budget_s is not None and last["train_s"] >= search.budget_s)


def time_to_target(search: SearchRecord, curve: list[dict], tokens_per_step: int) -> tuple[float, dict]:
    """The trial's score in a search with a target: the seconds of training to it, placed between the
    evaluations around the crossing; one that never reached it scores budget_s, raised by how far it stayed
    above (so that the closer of two such trials ranks first, and both below any that reached it)."""
    from tinygpt.training.metrics import crossing

    found = crossing(curve, search.target)
    best = min(p["val_loss"] for p in curve)
    if found is None:
        return search.budget_s * (1.0 + best - search.target), {"reached": False, "best_val_loss": best}
    return found["train_s"], {"reached": True, "train_s_to_target": round(found["train_s"], 2),
                              "steps_to_target": round(found["step"], 1),
                              "tokens_to_target": round(found["step"] * tokens_per_step)}


def main(argv: list[str]) -> int:
    from tinygpt.launch import manifest as manifest_mod

    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m tinygpt.launch.node.search_worker MANIFEST INDEX", file=sys.stderr)
        return 2
    manifest = manifest_mod.load(Path(argv[0]))
    worker = int(argv[1])
    run = manifest.runs[worker]
    state = Path(run.out_dir) / "worker.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    study = open_study(manifest.search, manifest.name, worker)

    def say(message: str) -> None:
        print(f"search worker {worker}: {message}", flush=True)

    ended: list[str] = []  # the states of the trials this worker ended in this life
    while True:
        if preemption.EARLY_SIGNALS:  # a signal between two trials: stop here (nothing to save)
            signal_name = preemption.EARLY_SIGNALS[0]
            job = preemption.slurm_job_id()
            if signal_name != "TERM" and job:
                ok, message = preemption.requeue(job)
                say(f"SIG{signal_name} between trials; {message}")
                return 0 if ok else REQUEUE_EXIT
            return 0
        trial, resumed = next_trial(study, manifest.search, state, worker)
        if trial is None:
            if ended and ended.count("FAIL") == len(ended):
                say(f"every trial this worker ran failed ({len(ended)}); see the errors above")
                return 1
            say(f"the study has its {manifest.search.trials} trials; done")
            return 0
        say(f"{'resuming' if resumed else 'starting'} trial {trial.number}")
        outcome, stop = run_trial(trial, manifest, run, say)
        if stop is not None:
            return stop
        ended.append(outcome)
        state.unlink(missing_ok=True)


if __name__ == "__main__":
    from tinygpt.train import exit_process
    from tinygpt.training.packing import take_pack_share

    preemption.install_early_recorder()  # (a signal between trials is recorded, not fatal)
    take_pack_share()
    exit_process(main(sys.argv[1:]))
