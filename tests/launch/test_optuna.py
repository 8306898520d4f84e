"""Adaptive search with Optuna: workers sharing one journal-file study, pruning, resuming a trial."""

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from selenium.webdriver.common.by import By

from tests.support.browser import browser  # noqa: F401 (a fixture)
from tests.support.paths import ROOT
from tests.support.processes import launch, python_env, wait_until
from tests.support.slurm import manifest_of, run_to_completion, signal_when_training
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import TINY_FLAGS, read_metrics, tiny_train
from tinygpt.base import config
from tinygpt.launch.serve import server as server_mod
from tinygpt.launch.serve.reading import Reader
from tinygpt.training import trainer

TRAIN = {k: v for k, v in tiny_train(eval_interval=5, min_lr=1.0e-6, log_interval=5, ckpt_interval=5).items()
         if k != "n_head"}  # (searched)
PARAMS = {"lr": {"loguniform": [1.0e-4, 1.0e-2]}, "n_head": {"choice": [1, 2, 4]}}


def optuna_spec(tmp_path: Path, corpus: Path, name: str, trials: int, workers: int, max_steps: int) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "train": {**TRAIN, "data_file": str(corpus), "max_steps": max_steps},
        "search": {"method": "optuna", "trials": trials, "workers": workers, "sampler": "tpe", "pruner": "asha",
                   "seed": 1, "params": PARAMS},
        "resources": {"time": "00:10:00"}}))
    return spec


def test_a_true_eval_hook_answer_stops_the_run_saved_as_pruned(tmp_path, tiny_corpus, data_dir):
    seen = []

    def prune_at_ten(step, val_loss, train_s):
        seen.append((step, round(val_loss, 3)))
        assert 0 < train_s < read_metrics(tmp_path / "run")[-1]["elapsed_s"]  # (the evaluation's time left out)
        return step >= 10

    cfg = config.resolve([*TINY_FLAGS, "--data-file", str(tiny_corpus), "--out-dir", str(tmp_path / "run")])
    result = trainer.train(cfg, eval_hook=prune_at_ten)
    assert result.pruned and not result.finished and result.step == 10 and [s for s, _ in seen] == [10]
    last = read_metrics(tmp_path / "run")[-1]
    assert (last["event"], last["step"], round(last["val_loss"], 3)) == ("pruned", 10, seen[0][1])
    assert (tmp_path / "run" / "checkpoints" / "step_00000010.pt").is_file()


def test_bad_optuna_sections_and_resources_are_named(tmp_path, tiny_corpus):
    spec = optuna_spec(tmp_path, tiny_corpus, "bad", 4, 2, 20)
    data = yaml.safe_load(spec.read_text())
    for change, message in [
        ({"pruner": "hyperband"}, "search.pruner: expected one of asha, median or none, got 'hyperband'"),
        ({"workers": 0}, "search.workers: must be from 1 to 1,000, got 0"),
        ({"params": {"lr": {"loguniform": [1.0e-4, 1.0e-2]}, "n_head": {"choice": [3]}}},
         "search.params: a trial may get lr=0.0001, n_head=3, and then n_embd: 32 is not divisible by n_head 3"),
        # Every choice is checked, not only the first and last; every pair of values too (min_lr <= lr)
        ({"params": {"n_head": {"choice": [2, 3, 5, 4]}}},
         "search.params: a trial may get n_head=3, and then n_embd: 32 is not divisible by n_head 3"),
        ({"params": {"n_head": {"int": [1, 8]}, "n_embd": {"choice": [24, 32]}}},
         "search.params: a trial may get n_embd=24, n_head=5, and then n_embd: 24 is not divisible by n_head 5"),
    ]:
        spec.write_text(yaml.safe_dump({**data, "search": {**data["search"], **change}}))
        out = launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "w"))
        assert out.returncode == 1 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    spec.write_text(yaml.safe_dump({**data, "resources": {"tasks_per_node": 2}}))
    out = launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "w"))
    assert out.returncode == 1 and "an Optuna worker trains one trial at a time in one process" in out.stderr


def test_workers_share_one_study_locally_and_the_report_ranks_the_trials_as_the_page_does(tmp_path, tiny_corpus,
                                                                                          browser):  # noqa: F811
    work = tmp_path / "w"
    spec = optuna_spec(tmp_path, tiny_corpus, "local-search", 6, 2, 30)
    out = launch(str(spec), "--local", "--workdir", str(work), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "=== 2 search worker(s) at once" in out.stdout
    status = launch("status", str(spec), "--workdir", str(work)).stdout
    states = [line.split("│")[2].strip() for line in status.splitlines() if line.count("│") == 7]
    assert len(states) == 6 and set(states) <= {"COMPLETE", "PRUNED"} and "COMPLETE" in states, status
    assert {line.split("│")[5].strip() for line in status.splitlines() if line.count("│") == 7} == {"0", "1"}
    assert sorted(p.name for p in (work / "runs" / "local-search").glob("trial-*")) == [f"trial-{i}" for i in range(6)]
    assert launch("report", str(spec), "--workdir", str(work)).returncode == 0
    report = (work / "runs" / "local-search" / "report.md").read_text()
    assert "## Search (Optuna)" in report and "| 1 | " in report
    assert (work / "runs" / "local-search" / "search.png").is_file()

    trials = json.loads(launch("status", str(spec), "--workdir", str(work), "--json").stdout)["trials"]
    assert sorted(t["trial"] for t in trials) == list(range(6)) and {t["worker"] for t in trials} == {0, 1}
    best = min((t for t in trials if t["state"] == "COMPLETE"), key=lambda t: t["value"])
    server = server_mod.Server(Reader(work), idle_s=600)  # (the sweep's page lists them, the best first)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    try:
        browser.get(server.url("/sweep/local-search"))
        rows = lambda: [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")]  # noqa: E731
        wait_until(lambda: len(rows()) == 6, timeout=60, poll=0.2, what=lambda: f"the page's trials: {rows()}")
        assert rows()[0].startswith(f"{best['trial']} COMPLETE {best['value']:.4f}"), rows()
    finally:
        server.shutdown()
        server.server_close()


def test_a_search_with_a_target_scores_the_seconds_to_it_and_stops_each_trial_there(tmp_path, tiny_corpus):
    from tinygpt.launch.read import study

    work, spec = tmp_path / "w", optuna_spec(tmp_path, tiny_corpus, "soonest", 3, 1, 200)
    data = yaml.safe_load(spec.read_text())
    target = {"target": 3.0, "budget_s": 120.0}
    spec.write_text(yaml.safe_dump({**data, "search": {**data["search"], **target, "pruner": "none"}}))
    out = launch(str(spec), "--local", "--workdir", str(work), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = study.trials(manifest_of(work, "soonest"))
    assert [r["state"] for r in rows] == ["COMPLETE"] * 3
    for row in rows:
        records = read_metrics(Path(row["run dir"]))
        curve = [r for r in records if "train_s" in r]  # (its evaluations)
        best = min(r["val_loss"] for r in curve)
        if row["tokens to target"] is None:  # never reached it: budget_s, raised by how far it stayed above
            assert records[-1]["event"] == "finished" and best > 3.0
            assert row["value"] == pytest.approx(120.0 * (1 + best - 3.0))
            continue
        # It stopped at the first evaluation at or below the target, and scores the seconds of training to the
        # crossing: between those of the evaluations either side of it.
        assert curve[-1]["val_loss"] <= 3.0 < min([r["val_loss"] for r in curve[:-1]], default=9), curve
        assert curve[-1]["step"] < 200 and records[-1]["event"] == "pruned"
        low = curve[-2]["train_s"] if len(curve) > 1 else 0.0
        assert low <= row["value"] <= curve[-1]["train_s"] < curve[-1]["elapsed_s"]
        assert 0 < row["tokens to target"] <= curve[-1]["step"] * 4 * 16  # (batch 4 x block 16)
    assert any(row["tokens to target"] for row in rows) and max(row["value"] for row in rows) < 240
    status = launch("status", str(spec), "--workdir", str(work))
    assert "tokens to target" in status.stdout, status.stdout
    spec.write_text(yaml.safe_dump({**data, "search": {**data["search"], "target": 3.0}}))
    refused = launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "w2"))
    assert refused.returncode == 1 and "search.budget_s: a search with a target needs budget_s" in refused.stderr


def test_a_search_with_a_target_prunes_at_equal_seconds_of_training_and_not_before_an_eighth_of_its_budget():
    from tinygpt.launch.manifest import SearchRecord
    from tinygpt.launch.node.search_worker import make_pruner, report_at

    timed = SearchRecord(dists={}, journal="j", trials=4, seed=0, target=1.92, budget_s=50.0)
    plain = SearchRecord(dists={}, journal="j", trials=4, seed=0)
    import optuna

    default = optuna.pruners.SuccessiveHalvingPruner()._min_resource  # ("auto": from the first trial's steps)
    assert make_pruner(timed)._min_resource == 6 and make_pruner(plain)._min_resource == default
    assert make_pruner(timed.model_copy(update={"pruner": "median"}))._n_warmup_steps == 6
    assert (report_at(timed, 400, 12.7), report_at(plain, 400, 12.7)) == (12, 400)


@pytest.mark.slurm
@pytest.mark.shares_cluster
def test_two_workers_on_the_cluster_and_a_preempted_worker_resumes_its_trial(tmp_path, tiny_corpus):
    """The acceptance run: 2 workers, 12 trials, ASHA; worker 0 gets the time-limit signal mid-trial."""
    import optuna

    from tinygpt.launch.read.study import trials

    work = tmp_path / "w"
    spec = optuna_spec(tmp_path, tiny_corpus, "asha", 12, 2, 200)
    data = yaml.safe_load(spec.read_text())
    data["train"].update(eval_interval=100, ckpt_interval=10)  # (no pruning before step 100: the signal lands first)
    spec.write_text(yaml.safe_dump(data))
    out = launch(str(spec), "--workdir", str(work), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = manifest_of(work, "asha")
    ids = manifest.task_job_ids()
    state = work / "runs" / "asha" / "worker-0" / "worker.json"
    from tests.support.slurm import wait_until

    wait_until(state.exists, timeout=120, what="worker 0's first trial")
    number = json.loads(state.read_text())["trial"]
    trial_dir = work / "runs" / "asha" / f"trial-{number:02d}"
    signal_when_training(ids[0], trial_dir / "metrics.jsonl", min_lines=4)  # mid-trial
    assert run_to_completion(ids[0], timeout=400) == ("COMPLETED", 1)
    assert run_to_completion(ids[1], timeout=400)[0] == "COMPLETED"
    rows = trials(manifest_of(work, "asha"))
    states = [r["state"] for r in rows]
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    best = min(r["value"] for r in rows if r["state"] == "COMPLETE")
    print(f"\nacceptance: {len(rows)} trials, {states.count('COMPLETE')} complete, {len(pruned)} pruned "
          f"(at steps {[r['pruned at'] for r in pruned]}), best value {best:.4f}; worker 0 preempted in trial "
          f"{number}")
    assert len(rows) == 12 and set(states) <= {"COMPLETE", "PRUNED"}
    assert {r["worker"] for r in rows} == {0, 1}
    log = (work / "logs" / "asha" / f"{ids[0]}.out").read_text()
    assert f"resuming trial {number}" in log, log[-3000:]
    records = read_metrics(trial_dir)
    starts = [r for r in records if r.get("event") == "start"]
    assert len(starts) == 2 and starts[1]["step"] > 0  # the second life resumed the trial from its checkpoint
    assert records[-1]["event"] in ("finished", "pruned")
    assert next(r for r in rows if r["trial"] == number)["state"] in (optuna.trial.TrialState.COMPLETE.name,
                                                                     optuna.trial.TrialState.PRUNED.name)


def test_a_trial_that_fails_is_marked_failed_even_on_resume_and_a_worker_with_only_failures_ends_non_zero(
        tmp_path, tiny_corpus):
    import optuna

    from tinygpt.launch.manifest import load
    from tinygpt.launch.node.search_worker import open_study
    from tinygpt.launch.read.study import trials

    work = tmp_path / "w"
    spec = optuna_spec(tmp_path, tiny_corpus, "failing", 2, 1, 5)
    assert launch(str(spec), "--dry-run", "--workdir", str(work)).returncode == 0
    path = sweep_dirs(work, "failing").manifest
    manifest = load(path)
    # A trial left RUNNING by an earlier life, drawn from a space that has changed since (a third choice)
    study = open_study(manifest.search, "failing", 0)
    left = study.ask()
    left.suggest_categorical("n_head", [1, 2, 4, 8])
    (work / "runs" / "failing" / "worker-0").mkdir(parents=True)
    (work / "runs" / "failing" / "worker-0" / "worker.json").write_text(json.dumps({"trial": left.number}))
    # ... and every new trial fails too: a width no head count divides, as a hand-edited manifest could say
    edited = json.loads(path.read_text())
    edited["base"]["n_embd"] = 31
    path.write_text(json.dumps(edited))

    def worker() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tinygpt.launch.node.search_worker", str(path), "0"],
                              capture_output=True,
                              text=True, env=python_env(), cwd=ROOT, timeout=300)

    out = worker()
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"resuming trial {left.number}" in out.stdout and "every trial this worker ran failed (2)" in out.stdout
    rows = trials(load(path))
    assert [r["state"] for r in rows] == [optuna.trial.TrialState.FAIL.name] * 2, rows
    assert "dynamic value space" in optuna.load_study(study_name="failing", storage=study._storage).trials[
        left.number].user_attrs["error"]
    again = worker()  # the next life resumes nothing: the study has its trials
    assert again.returncode == 0 and "the study has its 2 trials; done" in again.stdout, again.stdout


def test_a_relaunch_with_another_search_space_is_refused_once_the_study_has_begun(tmp_path, tiny_corpus):
    work = tmp_path / "w"
    spec = optuna_spec(tmp_path, tiny_corpus, "space", 2, 1, 5)
    assert launch(str(spec), "--dry-run", "--workdir", str(work)).returncode == 0
    journal = sweep_dirs(work, "space").journal
    journal.write_text("")  # (a study has begun: its journal exists)
    data = yaml.safe_load(spec.read_text())
    data["search"]["params"]["n_head"] = {"choice": [1, 2]}
    spec.write_text(yaml.safe_dump(data))
    before = sweep_dirs(work, "space").manifest.read_text()
    out = launch(str(spec), "--dry-run", "--workdir", str(work))
    assert out.returncode == 1 and "not those of the Optuna study sweep `space` has begun" in out.stderr, out.stderr
    assert "Give the spec a new `name`" in out.stderr and "Traceback" not in out.stderr
    assert sweep_dirs(work, "space").manifest.read_text() == before
    data["search"]["trials"] = 4  # more trials of the same space is fine
    data["search"]["params"]["n_head"] = PARAMS["n_head"]
    spec.write_text(yaml.safe_dump(data))
    assert launch(str(spec), "--dry-run", "--workdir", str(work)).returncode == 0


HOLD_AND_WAIT = """
import sys, time
from tinygpt.launch.node import study_journal
path, which = sys.argv[1], sys.argv[2]
if which == "journal":  # the lock every append to the journal takes
    held = study_journal.TolerantJournal(path)._lock
    held.acquire()
else:  # the one a worker holds from counting the trials to asking for one
    held = study_journal.asking(path)
    held.__enter__()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("which", ["journal", "asking"])
def test_a_worker_killed_while_it_holds_a_lock_delays_the_study_by_the_grace_period_only(tmp_path, which,
                                                                                          monkeypatch):
    """The locks are files made with O_EXCL (no flock, which some cluster filesystems do not honour): a process
    SIGKILLed while it holds one leaves the file behind, and the next worker takes it over once it has seen it
    untouched for the grace period (shortened here, 30 s in use), then asks for its trial as usual."""
    import signal

    import optuna

    from tinygpt.launch.manifest import SearchRecord
    from tinygpt.launch.node import search_worker, study_journal

    journal = str(tmp_path / "study.journal")
    study = optuna.create_study(study_name="s", storage=study_journal.storage(journal))
    study.tell(study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 0.5)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT, journal, which], stdout=subprocess.PIPE,
                              text=True, env=python_env())
    try:
        assert holder.stdout.readline() == "held\n"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    lock_file = Path(journal + {"journal": ".lock", "asking": ".asking.lock"}[which])
    assert lock_file.exists()  # left behind by the dead holder
    monkeypatch.setattr(study_journal, "LOCK_GRACE_S", 3)
    said: list[logging.LogRecord] = []
    listener = logging.Handler()
    listener.emit = said.append  # (Optuna's loggers do not propagate to the root logger that caplog reads)
    logging.getLogger("optuna").addHandler(listener)
    try:
        again = optuna.load_study(study_name="s", storage=study_journal.storage(journal))
        search = SearchRecord(dists={"x": ["uniform", [0, 1]]}, journal=journal, trials=3, seed=0)
        trial, resumed = search_worker.next_trial(again, search, tmp_path / "worker.json", 0)
    finally:
        logging.getLogger("optuna").removeHandler(listener)
    assert trial is not None and not resumed and trial.number == 1
    assert any("Forcibly releasing the lock file" in r.getMessage() for r in said), [r.getMessage() for r in said]
    assert not lock_file.exists()  # released after use, as always
    reread = optuna.load_study(study_name="s", storage=study_journal.storage(journal))
    assert [t.number for t in reread.trials] == [0, 1]
