"""Every file we read may be damaged, even one we wrote: property tests that damage each of them (a value
of the wrong type at any level, a file cut short, garbage lines, garbage bytes) and run every command and a
resume over them. No traceback, and nothing that was valid is lost: a damaged record is skipped with a
warning, a damaged file that cannot be used is named with what to do.

The cases are drawn the same way on every run (conftest's "repeatable" profile); TINYGPT_FUZZ_EXAMPLES=N
with `--hypothesis-profile hunt` draws N fresh ones."""

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.processes import run_cli
from tests.support.sweeps import sweep_dirs
from tests.support.tiny import tiny_train
from tinygpt.base import config
from tinygpt.launch.manifest import Manifest, record_submission
from tinygpt.training import checkpoint, metrics, trainer

# (no shrinking: each case runs every command, and the failing case is printed as drawn)
SETTINGS = settings(max_examples=int(os.environ.get("TINYGPT_FUZZ_EXAMPLES", "12")), deadline=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate],
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

TRAIN = tiny_train(max_steps=10, eval_interval=5, ckpt_interval=5, log_interval=5, sample_tokens=20, progress="plain")

# Values of every JSON type, including the ones no reader expects where they appear
WRONG = st.one_of(st.none(), st.booleans(), st.integers(-2, 2**40), st.floats(allow_nan=False),
                  st.text(max_size=6), st.lists(st.integers(0, 3), max_size=2),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
GARBAGE_LINE = st.one_of(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
                         WRONG.map(lambda v: json.dumps(v).encode()))


def paths_in(doc, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON document: each key of each object, each item of each list."""
    found = [prefix] if prefix else []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        found += paths_in(value, (*prefix, key))
    return found


def with_value(doc, path: tuple, value):
    doc = copy.deepcopy(doc)
    place = doc
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    return doc


def damaged_json(doc) -> st.SearchStrategy[bytes]:
    text = json.dumps(doc).encode()
    return st.one_of(
        st.tuples(st.sampled_from(paths_in(doc)), WRONG).map(lambda pv: json.dumps(with_value(doc, *pv)).encode()),
        st.integers(0, len(text) - 1).map(lambda n: text[:n]),  # cut short
        st.binary(max_size=40),  # not JSON at all
    )


def damaged_lines(data: bytes) -> st.SearchStrategy[bytes]:
    """A file of JSON lines with a garbage line put in, a line damaged as JSON, or the file cut short."""
    lines = data.splitlines()

    def insert(args):
        i, garbage = args
        return b"\n".join([*lines[:i], garbage, *lines[i:]]) + b"\n"

    def replace(args):
        i, damaged = args
        return b"\n".join([*lines[:i], damaged.replace(b"\n", b" "), *lines[i + 1:]]) + b"\n"

    return st.one_of(
        st.tuples(st.integers(0, len(lines)), GARBAGE_LINE).map(insert),
        st.integers(0, len(lines) - 1).flatmap(
            lambda i: st.tuples(st.just(i), damaged_json(json.loads(lines[i])))).map(replace),
        st.integers(0, len(data) - 1).map(lambda n: data[:n]),
    )


def tree_digest(folder: Path, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(part in leave_out for part in p.relative_to(folder).parts)}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A finished one-run sweep, launched --local: its manifest, run directory, checkpoints (steps 5, 10)."""
    from tests.support.tiny import TINY_TEXT

    root = tmp_path_factory.mktemp("damaged")
    corpus = root / "corpus.txt"
    corpus.write_text(TINY_TEXT)
    spec = root / "damaged.yaml"
    spec.write_text(yaml.safe_dump({"name": "damaged", "train": {**TRAIN, "data_file": str(corpus)}}))
    work = root / "w"
    code, err = run_cli([str(spec), "--local", "--workdir", str(work)])
    assert code == 0, err
    run = work / "runs" / "damaged" / "base"
    # Records of Slurm submissions too (ids no job has), so that their fields are damaged as well
    path = sweep_dirs(work, "damaged").manifest
    manifest = json.loads(path.read_text())
    manifest["submissions"] += [
        {"backend": "sbatch", "job_id": "4000001", "indices": [0], "array": "0-0", "offset": 0, "pack": 1,
         "script": str(sweep_dirs(work, "damaged").script()), "submitted_at": 1.0e9}]
    Manifest.model_validate(manifest)  # (a manifest every command reads, before it is damaged)
    path.write_text(json.dumps(manifest, indent=1))
    record_submission(path, "submitit", "4000002", [0], per_run_ids={"0": "4000002_0"},  # (appended beside it)
                      folder=str(sweep_dirs(work, "damaged").submitit))
    (work / "logs" / "damaged").mkdir(parents=True, exist_ok=True)
    (work / "logs" / "damaged" / "4000001_0.out").write_text("tinygpt: run 0 of damaged\nstep 5 | loss 3.7\n")
    pristine = root / "pristine"
    shutil.copytree(work, pristine, symlinks=True)
    return {"spec": spec, "work": work, "run": run, "pristine": pristine,
            "manifest": sweep_dirs(work, "damaged").manifest}


def restore(sweep) -> None:
    shutil.rmtree(sweep["work"])
    shutil.copytree(sweep["pristine"], sweep["work"], symlinks=True)


def commands(sweep) -> list[list[str]]:
    """Every command that reads the sweep and changes nothing on Slurm (cancel would scancel the ids a damaged
    manifest names, which may be other tests' jobs)."""
    spec, work = str(sweep["spec"]), str(sweep["work"])
    return [["status", spec, "--workdir", work], ["report", spec, "--workdir", work],
            ["logs", spec, "--workdir", work], ["resubmit", spec, "--dry-run", "--workdir", work],
            ["sync", spec, "--dry-run", "--workdir", work], [spec, "--dry-run", "--no-snapshot", "--workdir", work]]


def run_every_command(sweep) -> None:
    for argv in commands(sweep):
        code, err = run_cli(argv)  # (anything but a message, an exception, fails the test here)
        assert code in (0, 1) and "Traceback" not in err, (argv, err)


@SETTINGS
@given(data=st.data())
def test_every_command_over_a_damaged_manifest_answers_with_a_message(sweep, data):
    manifest = json.loads(sweep["manifest"].read_text())
    damaged = data.draw(damaged_json(manifest))
    kept = tree_digest(sweep["run"], leave_out=("report",))
    sweep["manifest"].write_bytes(damaged)
    try:
        run_every_command(sweep)
        assert tree_digest(sweep["run"], leave_out=("report",)) == kept  # the run's files are as they were
    finally:
        restore(sweep)


@SETTINGS
@given(data=st.data())
def test_every_command_over_a_damaged_submissions_record_answers_with_a_message(sweep, data):
    record = sweep_dirs(sweep["work"], "damaged").submissions
    kept = tree_digest(sweep["run"], leave_out=("report",))
    record.write_bytes(data.draw(damaged_lines(record.read_bytes())))
    try:
        run_every_command(sweep)
        assert tree_digest(sweep["run"], leave_out=("report",)) == kept
    finally:
        restore(sweep)


def test_a_damaged_manifest_is_named_with_what_to_do(sweep):
    """A record of the wrong type, and a file cut short (a crash, a full disk): each with its fix."""
    text = sweep["manifest"].read_text()
    for damaged, said in [(json.dumps({**json.loads(text), "runs": [{"index": 0, "name": 3}]}),
                           "the manifest is damaged (runs[0].name: expected a single value"),
                          (text[:len(text) // 2], "the manifest is damaged (not JSON: ")]:
        sweep["manifest"].write_text(damaged)
        try:
            code, err = run_cli(commands(sweep)[0])
            assert code == 1 and said in err, err
            assert "move it aside (mv " in err and "and launch the spec again" in err
        finally:
            restore(sweep)


@SETTINGS
@given(data=st.data())
def test_status_report_and_a_resume_over_a_damaged_metrics_file_keep_every_valid_record(sweep, data, tmp_path_factory):
    path = sweep["run"] / "metrics.jsonl"
    damaged = data.draw(damaged_lines(path.read_bytes()))
    path.write_bytes(damaged)
    try:
        run_every_command(sweep)
        # A resume (to step 15) keeps every valid record up to its checkpoint (step 10), in order
        copy_dir = tmp_path_factory.mktemp("resume") / "run"
        shutil.copytree(sweep["run"], copy_dir)
        valid = [r for r in metrics.read(copy_dir / "metrics.jsonl") if r["step"] <= 10]
        cfg = config.build({**TRAIN, "data_file": str(sweep["spec"].parent / "corpus.txt"), "max_steps": 15,
                            "out_dir": str(copy_dir), "sample_tokens": 0})
        result = trainer.train(cfg)
        assert result.finished and result.step == 15
        after = metrics.read(copy_dir / "metrics.jsonl")
        assert after[:len(valid)] == valid and after[len(valid)]["event"] == "start"
        assert after[len(valid)]["step"] == 10 and after[-1]["event"] == "finished"
    finally:
        restore(sweep)


def damaged_bytes(data: bytes) -> st.SearchStrategy[bytes]:
    """A binary file cut short, one byte changed anywhere, or a run of garbage written over it."""
    def flip(args):
        i, bit = args
        out = bytearray(data)
        out[i] ^= 1 << bit
        return bytes(out)

    return st.one_of(st.integers(0, len(data) - 1).map(lambda n: data[:n]),
                     st.tuples(st.integers(0, len(data) - 1), st.integers(0, 7)).map(flip),
                     st.tuples(st.integers(0, len(data) - 1), st.binary(min_size=1, max_size=64)).map(
                         lambda a: data[:a[0]] + a[1] + data[a[0] + len(a[1]):]))


@SETTINGS
@given(data=st.data())
def test_logs_and_status_read_a_damaged_slurm_log(sweep, data):
    log = sweep["work"] / "logs" / "damaged" / "4000001_0.out"
    log.write_bytes(data.draw(st.one_of(damaged_bytes(log.read_bytes()), st.binary(max_size=200))))
    try:
        run_every_command(sweep)
    finally:
        restore(sweep)


@SETTINGS
@given(data=st.data())
def test_a_resume_over_a_damaged_checkpoint_and_provenance_goes_on_from_the_newest_valid_one(
        sweep, data, tmp_path_factory):
    run = tmp_path_factory.mktemp("resume") / "run"
    shutil.copytree(sweep["run"], run)
    newest = run / "checkpoints" / "step_00000010.pt"
    newest.write_bytes(data.draw(damaged_bytes(newest.read_bytes()), label="checkpoint"))
    provenance = run / "provenance.json"
    provenance.write_bytes(data.draw(damaged_json(json.loads(provenance.read_text())), label="provenance"))
    cfg = config.build({**TRAIN, "data_file": str(sweep["spec"].parent / "corpus.txt"), "max_steps": 15,
                        "out_dir": str(run), "sample_tokens": 0})
    result = trainer.train(cfg)
    assert result.finished and result.step == 15
    start = [r for r in metrics.read(run / "metrics.jsonl") if r.get("event") == "start"][-1]
    try:
        checkpoint.load(newest)
        intact = True  # (the change fell where nothing reads it: the zip's padding)
    except checkpoint.CheckpointError:
        intact = False
    set_aside = sorted(p.name for p in (run / "checkpoints").glob("step_00000010.pt.corrupt*"))
    assert (start["step"], bool(set_aside)) in ((10, False), (5, True)), (start, set_aside, intact)
    starts = json.loads((run / "provenance.json").read_text())["starts"]
    assert isinstance(starts, list) and starts  # this start's record, after the old ones or anew when damaged


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> bytes:
    """An Optuna journal of four finished trials, written through the study's own storage."""
    import optuna

    from tinygpt.launch.node import study_journal

    path = tmp_path_factory.mktemp("journal") / "optuna.journal"
    study = optuna.create_study(study_name="s", storage=study_journal.storage(str(path)),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_float("x", 0, 1) + t.suggest_categorical("n", [1, 2]), n_trials=4)
    return path.read_bytes()


def trials_of(path: Path) -> list[tuple]:
    import optuna

    from tinygpt.launch.node import study_journal

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="s", storage=study_journal.storage(str(path), warn=lambda m: None))
    return [(t.number, t.state.name, t.params, t.value) for t in study.get_trials(deepcopy=False)]


@SETTINGS
@given(data=st.data())
def test_the_study_reads_past_a_damaged_journal_line_and_goes_on(journal, data, tmp_path_factory):
    import optuna

    from tinygpt.launch.node import study_journal
    from tinygpt.launch.node.study_journal import TolerantJournal

    path = tmp_path_factory.mktemp("study") / "optuna.journal"
    original = tmp_path_factory.mktemp("study") / "optuna.journal"
    original.write_bytes(journal)
    lines = journal.splitlines()
    i = data.draw(st.integers(0, len(lines)), label="where")
    garbage = data.draw(st.one_of(GARBAGE_LINE, damaged_json(json.loads(lines[min(i, len(lines) - 1)])))
                        .map(lambda b: b.replace(b"\n", b" ")).filter(lambda b: TolerantJournal._parse(b) is None),
                        label="garbage")  # (not: a well-formed operation with a damaged field inside)
    path.write_bytes(b"\n".join([*lines[:i], garbage, *lines[i:]]) + b"\n")
    assert trials_of(path) == trials_of(original)  # every trial, as it was
    # ... and the study goes on: a worker asks for a trial and tells its value past the damaged line
    study = optuna.load_study(study_name="s", storage=study_journal.storage(str(path), warn=lambda m: None))
    trial = study.ask()
    study.tell(trial, trial.suggest_float("x", 0, 1))
    assert [t[1] for t in trials_of(path)] == ["COMPLETE"] * 5


def test_a_damaged_journal_line_is_said_once_with_its_file_and_line(journal, tmp_path):
    from tinygpt.launch.node import study_journal

    path = tmp_path / "optuna.journal"
    lines = journal.splitlines()
    path.write_bytes(b"\n".join([*lines[:2], b"[1]", *lines[2:]]) + b"\n")
    said = []
    storage = study_journal.storage(str(path), warn=said.append)
    import optuna

    for _ in range(3):
        optuna.load_study(study_name="s", storage=storage).get_trials()
    assert said == [f"{path} line 3 is not an Optuna operation (b'[1]\\n'); skipped (the study goes on without it)"]
