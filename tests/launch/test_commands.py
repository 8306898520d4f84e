"""A spec's `command:` (spec/command.py) and the process beside the program on the node (node/supervise.py), without
Slurm: the words each run starts, the values checked as the spec declares them, one clear message for each
hostile input, and the run contract kept (environment, exit statuses, requeue cap) with the programs of
tests/support/foreign, which know nothing of this project. cluster/test_commands.py runs them on the cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import launch, python_env, run_cli, wait_until
from tinygpt.launch.manifest import load
from tinygpt.launch.node import torchrun_start
from tinygpt.launch.spec import sweep as spec_mod

FOREIGN = ROOT / "tests" / "support" / "foreign"
ECHO = [sys.executable, "-c", "import json, os, sys; print(json.dumps([sys.argv[1:], dict((k, v) for k, v in "
                              "os.environ.items() if k.startswith(('TINYGPT_', 'RANK')))]))"]  # (no brace: {{ }})


def write(folder: Path, command: dict, **extra) -> Path:
    spec = folder / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "command": command, "resources": {"time": "00:05:00"}, **extra}))
    return spec


def refused(spec: Path, *args: str) -> str:
    code, err = run_cli([str(spec), "--dry-run", "--workdir", str(spec.parent / "work"), *args])
    assert code == 1 and err.count("error: ") == 1 and "Traceback" not in err, err
    assert not (spec.parent / "work" / "jobs").exists()
    return err


def test_each_run_starts_its_own_words_whatever_its_values_hold(tmp_path):
    """Placeholders take the run's values (grid over `values`, runs, the launcher's own); a value with spaces,
    quotes or `$(...)` stays one word, as the program is started without a shell."""
    hostile = "a b; $(touch pwned) 'q' \"d\""
    spec = write(tmp_path, {"argv": [*ECHO, "--lr={lr}", "{note}", "{{literal}}", "{run_name}@{sweep}"],
                            "values": {"note": hostile, "lr": 0.5}, "project": str(tmp_path)},
                 grid={"lr": [0.1, 2]}, runs=[{"name": "extra", "note": "x"}])
    sweep = spec_mod.load(spec, tmp_path / "work")
    assert [r.name for r in sweep.runs] == ["lr-0.1", "lr-2", "extra"]
    (tmp_path / "alone").mkdir()
    alone = write(tmp_path / "alone", ECHO)  # (a command's words alone: its argv)
    assert spec_mod.load(alone, tmp_path / "alone").command.argv == ECHO
    code, err = run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])
    assert code == 0, err
    manifest = tmp_path / "work" / "jobs" / "s" / "manifest.json"
    said = [json.loads(supervise(manifest, i).stdout) for i in range(3)]
    assert [s[0][:4] for s in said] == [["--lr=0.1", hostile, "{literal}", "lr-0.1@s"],
                                        ["--lr=2", hostile, "{literal}", "lr-2@s"],
                                        ["--lr=0.5", "x", "{literal}", "extra@s"]]
    env = said[0][1]
    assert env["TINYGPT_RUN_DIR"] == str(tmp_path / "work" / "runs" / "s" / "lr-0.1")
    assert (env["TINYGPT_RUN_NAME"], env["TINYGPT_SWEEP"], env["TINYGPT_STOP_SIGNAL"], env["TINYGPT_REQUEUE_EXIT"]) \
        == ("lr-0.1", "s", "SIGUSR2", "75")
    assert not (tmp_path / "pwned").exists()
    shown = launch("status", str(spec), "--workdir", str(tmp_path / "work"))
    assert shown.returncode == 0 and "no run of this program has reported a step" in shown.stdout, shown


def supervise(manifest: Path, index: int, **env: str) -> subprocess.CompletedProcess:
    """The node's process beside the program, as srun starts it (here, without Slurm)."""
    return subprocess.run([sys.executable, "-m", "tinygpt.launch.node.supervise", str(manifest), str(index)],
                          capture_output=True, text=True, timeout=120, env=python_env(**env))


@pytest.mark.parametrize("command, extra, said", [
    ({"argv": ["prog", "{lr"]}, {}, "argv[1]: '{lr': expected '}' before end of string"),
    ({"argv": ["prog", "{0}"]}, {}, "{0} is not a placeholder"),
    ({"argv": ["prog", "{a.b}"]}, {}, "{a.b} is not a placeholder"),
    ({"argv": ["prog", "{lr!r}"]}, {}, "is not a placeholder"),
    ({"argv": ["{prog}"]}, {}, "argv[0] is the program"),
    ({"argv": []}, {}, "command.argv"),
    ({"argv": ["prog", "{lr}"]}, {}, "no value for {lr} in command.argv"),
    ({"argv": ["prog"], "values": {"run_dir": "/x"}}, {}, "`run_dir` is set by the launcher"),
    ({"argv": ["prog"], "values": {"lr": [1, 2]}}, {}, "lr: [1, 2] is not a word a program can be given"),
    ({"argv": ["prog", "{lr}"], "params": {"lr": {"type": "float", "max": 1}}}, {"grid": {"lr": [0.5, 3]}},
     "run lr-3: lr: must be <= 1, got 3"),
    ({"argv": ["prog", "{lr}"], "params": {"lr": {"type": "float", "max": 1}}}, {"grid": {"lr": ["1e-3", "2e0"]}},
     "run lr-2e0: lr: must be <= 1, got 2.0"),  # (1e-3, which YAML 1.1 reads as a text, is a float)
    ({"argv": ["prog", "{n}"], "params": {"n": {"type": "int"}}}, {"grid": {"n": [1, "two"]}},
     "n: expected int, got 'two'"),
    ({"argv": ["prog", "{opt}"], "params": {"opt": {"choices": ["adam", "sgd"]}}}, {"runs": [{"opt": "adm"}]},
     "opt: 'adm' is not one of 'adam', 'sgd'"),
    ({"argv": ["prog"]}, {"train": {"max_steps": 5}}, "train: a spec runs the trainer (train:) or a program of "
                                                       "yours (command:), not both"),
    ({"argv": ["prog"]}, {"backend": "submitit"}, "backend: a command runs with the sbatch backend"),
    ({"argv": ["prog"]}, {"pack": 2, "grid": {"a": [1, 2]}}, "pack: 2 runs at once would share 1 CPU(s)"),
    ({"argv": ["prog"], "heartbeat_s": 1}, {}, "command.heartbeat_s: must be >= 2"),
    ({"argv": ["./missing.sh"]}, {}, "command.argv[0]: ./missing.sh is not a file of the project"),
    ({"argv": ["prog", "{lr}"]}, {"search": {"method": "optuna", "trials": 2, "params": {"lr": {"uniform": [0, 1]}}}},
     "search.metric: an Optuna search of a command minimises a named value"),
    ({"argv": ["prog", "{lr}"], "params": {"lr": {"max": 0.5}}},
     {"search": {"method": "optuna", "trials": 2, "metric": "loss", "params": {"lr": {"uniform": [0.1, 0.9]}}}},
     "search.params: lr: must be <= 0.5, got 0.9"),
    ({"argv": ["prog"], "project": "nowhere"}, {}, "nowhere is not a folder; name the folder of your program"),
    ({"argv": ["python3", str(FOREIGN / "fit.py")]}, {}, "fit.py is outside the project"),
    ({"argv": [str(FOREIGN / "count.sh")]}, {}, "count.sh is outside the project"),
    ({"argv": ["python3", "../s.yaml"]}, {}, "command.argv[1]: ../s.yaml leads out of the project"),
    ({"argv": ["python3", "x.py", "--data=../../etc/passwd"]}, {}, "command.argv[2]: ../../etc/passwd leads out of"),
    ({"argv": ["prog"], "lr": 1}, {}, "command.lr"),
    ({"argv": ["prog"], "start": "mpirun"}, {}, "command.start"),
    ("python train.py --lr {lr}", {}, "command: 'python train.py --lr {lr}' is one text, and a program is started "
                                      "with its words, never through a shell: write them as a list, command: [python, "
                                      "train.py, --lr, ...], or command: {argv: [...]}"),
    ({"argv": ["prog"], "include": ["../data/*"]}, {}, "command.include[0]: '../data/*' is not inside the project"),
    ({"argv": ["prog"], "progress": ["loss (?P<loss>[\\d.]+)"]}, {}, "needs a (?P<step>\\d+) group for the step"),
    ({"argv": ["prog"], "progress": ["step (?P<step>\\d+"]}, {}, "is not a regular expression"),
    ({"argv": ["prog"], "resume": {"when": "{ckpt}", "add": ["--resume"]}}, {}, "no value for {ckpt} in command"),
], ids=lambda v: None)
def test_a_hostile_command_section_is_one_clear_message_and_nothing_is_written(tmp_path, command, extra, said):
    spec = write(tmp_path, command, **extra)
    assert said in refused(spec)


def test_what_does_not_apply_to_a_command_is_said(tmp_path):
    spec = write(tmp_path, {"argv": ["prog"]})
    code, err = run_cli([str(spec), "--local", "--nproc", "2", "--workdir", str(tmp_path / "work")])
    assert code == 1 and "--nproc: starts the trainer's ranks under torchrun" in err, err


def test_local_runs_each_run_of_a_command_as_a_plain_process_here(tmp_path):
    """--local (--chain: the runs, then the report), the smoke test before a cluster: count.sh (not Python, so
    never in the warm fork server) per run."""
    spec = write(tmp_path, {"argv": ["./count.sh", "{goal}"], "project": str(FOREIGN)}, grid={"goal": [1, 2]})
    out = launch(str(spec), "--local", "--chain", "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert out.returncode == 0 and "2/2 run(s) finished" in out.stdout, out.stdout + out.stderr
    assert "counted to 1" in out.stdout and "counted to 2" in out.stdout
    assert (tmp_path / "work" / "runs" / "s" / "goal-2" / "count").read_text() == "2\n"
    assert "=== chain, data" not in out.stdout and "(1 metric(s) drawn)" not in out.stdout  # (count.sh: steps only)
    assert "No run wrote a metrics.jsonl with named values" in (tmp_path / "work/runs/s/report.md").read_text()


def test_the_users_project_is_what_the_jobs_run_as_it_was_at_launch(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('first')\n")
    (project / "runs").mkdir()  # (what sweeps write there is left out)
    (project / "runs" / "big.bin").write_bytes(b"x" * 1000)
    (project / "venv" / "lib").mkdir(parents=True)  # (and a virtual environment: not the program's code)
    (project / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (project / "venv" / "lib" / "big.so").write_bytes(b"x" * 1000)
    spec = write(tmp_path, {"argv": [sys.executable, "train.py"], "project": "project"})
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])[0] == 0
    (project / "train.py").write_text("print('edited after the launch')\n")
    manifest = tmp_path / "work" / "jobs" / "s" / "manifest.json"
    snapshot = Path(load(manifest).command.project)
    assert snapshot != project and sorted(p.name for p in snapshot.iterdir()) == ["SNAPSHOT.json", "train.py"]
    assert supervise(manifest, 0).stdout == "first\n"


def test_a_git_projects_snapshot_is_checked_as_the_node_will_find_it_and_says_what_it_leaves_out(tmp_path):
    """nanoGPT's layout: its prepared data (*.bin) git-ignored beside the tracked prepare.py, an untracked helper.
    A word naming a file the snapshot will not hold, or a script without its run bit, is refused before anything
    is written; `include` brings the data along; what stays out is named with its size."""
    project = tmp_path / "nano"
    (project / "data" / "shakespeare_char").mkdir(parents=True)
    (project / ".gitignore").write_text("*.bin\n")
    (project / "train.py").write_text("import sys; print(open(sys.argv[1], 'rb').read())\n")
    (project / "run.sh").write_text("#!/bin/sh\nexec python3 train.py \"$@\"\n")
    (project / "data" / "shakespeare_char" / "prepare.py").write_text("")
    (project / "data" / "shakespeare_char" / "train.bin").write_bytes(b"\x01\x02")
    (project / "notes").mkdir()
    (project / "notes" / "draft.txt").write_text("x" * 3000)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", ".gitignore", "train.py", "run.sh", "data"], check=True)
    data = "data/shakespeare_char/train.bin"
    for argv, said in [([sys.executable, "train.py", data], f"command.argv[2]: {data} is in the project but not in its "
                        f"snapshot, as git does not track it; `git add` it, or take it with command.include: [{data}]"),
                       (["./run.sh", f"--data={data}"],
                        "command.argv[0]: ./run.sh cannot be run (no run bit: chmod +x"),
                       (["./run.sh", f"--data={data}"], f"command.argv[1]: {data} is in the project but not in")]:
        spec = write(tmp_path, {"argv": argv, "project": "nano"})
        code, err = run_cli([str(spec), "--workdir", str(tmp_path / "work"), "--no-check"])
        assert code == 1 and said in err and not (tmp_path / "work" / "jobs").exists(), err
    spec = write(tmp_path, {"argv": [sys.executable, "train.py", data], "project": "nano",
                            "include": ["data/*/*.bin"]})
    out = launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "work"))
    assert out.returncode == 0 and "project: left out, as git does not track them: notes/ (1 file, 0.00 MB)" in \
        out.stdout, out.stdout + out.stderr
    assert supervise(tmp_path / "work" / "jobs" / "s" / "manifest.json", 0).stdout == "b'\\x01\\x02'\n"
    (tmp_path / "other").mkdir()
    assert "command.include[0]: data/*.csv matches no file of the project" in refused(
        write(tmp_path / "other", {"argv": ["true"], "project": str(project), "include": ["data/*.csv"]}))


def test_the_requeue_status_passes_through_until_the_cap_and_a_crash_is_not_requeued(tmp_path):
    """count.sh (not Python) saves on the stop signal, which this process passes on, and asks for a requeue (75);
    past command.max_requeues the run ends FAILED (1) with why; a program that crashes ends with its own status
    (fit_with_helper.py, given a learning rate that is no number), which the batch script never requeues."""
    spec = write(tmp_path, {"argv": ["./count.sh", "{goal}"], "values": {"goal": 1000}, "project": str(FOREIGN),
                            "max_requeues": 2}, runs=[{"name": "count"}])
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])[0] == 0
    manifest = tmp_path / "work" / "jobs" / "s" / "manifest.json"
    run_dir = tmp_path / "work" / "runs" / "s" / "count"
    for restarts, status, said in (("1", 75, "asks to be requeued (1 so far)"),
                                   ("2", 1, "the most command.max_requeues allows; not requeued")):
        stopped = stopped_once_counting(manifest, run_dir, SLURM_RESTART_COUNT=restarts)
        assert stopped.returncode == status and said in stopped.stderr, stopped.stderr
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, int((run_dir / "count").read_text()) + 1))  # (each step once, across both lives)
    crashing = write(tmp_path, {"argv": [sys.executable, "fit_with_helper.py", "--lr=x", "--steps=3"],
                                "project": str(FOREIGN)})
    assert run_cli([str(crashing), "--dry-run", "--workdir", str(tmp_path / "crash")])[0] == 0
    crashed = supervise(tmp_path / "crash" / "jobs" / "s" / "manifest.json", 0)
    assert crashed.returncode == 2 and "--lr: invalid float value: 'x'" in crashed.stderr


def test_a_signal_after_the_program_ended_leaves_the_process_beside_it_to_say_how(tmp_path):
    """Slurm's warning may come again once the program has saved and ended (seen on the cluster: the task then died
    of SIGUSR2, and the run was not requeued). The process beside the program outlives such signals."""
    spec = write(tmp_path, {"argv": [sys.executable, "-c", "pass"], "project": str(tmp_path)})
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])[0] == 0
    code = ("import os, signal, sys; from pathlib import Path; from tinygpt.launch.node import supervise as s; "
            "head, run = s.load_run(Path(sys.argv[1]), 0); ended = s.run_program(head, run.name, {}, "
            "Path(run.out_dir)); [os.kill(os.getpid(), n) for n in (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM, "
            "signal.SIGHUP)]; print('ended', ended.code)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "work" / "jobs" / "s" / "manifest.json")],
                         capture_output=True, text=True, timeout=60, env=python_env())
    assert (out.returncode, out.stdout) == (0, "ended 0\n"), out.stderr


def stopped_once_counting(manifest: Path, run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    """Run 0 started as srun starts it; once it counts, the stop signal (as Slurm sends it before the time limit)."""
    seen = len((run_dir / "metrics.jsonl").read_text().splitlines()) if (run_dir / "metrics.jsonl").exists() else 0
    proc = subprocess.Popen([sys.executable, "-m", "tinygpt.launch.node.supervise", str(manifest), "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env(**env))
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists() and
                   len((run_dir / "metrics.jsonl").read_text().splitlines()) > seen, timeout=60, what="counting")
        proc.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_program_that_does_not_exist_is_named(tmp_path):
    """By a path in the project: refused at launch (a hostile case above); by a name that the node's PATH lacks:
    said by the task, exit 127."""
    spec = write(tmp_path, {"argv": ["no-such-program-anywhere", "x"], "project": str(tmp_path)})
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])[0] == 0
    out = supervise(tmp_path / "work" / "jobs" / "s" / "manifest.json", 0)
    assert out.returncode == 127 and "cannot start no-such-program-anywhere in" in out.stderr
    assert "check command.argv" in out.stderr


def test_the_helper_needs_nothing_but_the_standard_library():
    out = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "from tinygpt import job; print(job.REQUEUE_EXIT)", str(ROOT)], capture_output=True,
                         text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.stdout == "75\n", out.stderr


def test_the_readmes_example_program_runs_as_written(tmp_path):
    """hpc_lab/05_own_program: the dry run the README shows, then its first run as a task starts it."""
    spec = ROOT / "hpc_lab" / "05_own_program" / "sweep.yaml"
    code, err = run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path)])
    assert code == 0, err
    manifest = load(tmp_path / "jobs" / "own-program" / "manifest.json")
    assert [r.name for r in manifest.runs] == ["lr-0.05", "lr-0.1", "lr-0.2"]
    assert sorted(p.name for p in Path(manifest.command.project).iterdir()) == ["SNAPSHOT.json", "sweep.yaml",
                                                                                 "train.py"]
    done = supervise(manifest.path, 2)
    assert done.returncode == 0 and "after 200 steps" in done.stdout, done.stderr
    said = [json.loads(line) for line in (tmp_path / "runs/own-program/lr-0.2/metrics.jsonl").read_text().splitlines()]
    assert said[-2]["step"] == 200 and said[-1]["event"] == "finished"  # (the launcher's record: it ended 0)
    shown = launch("status", str(spec), "--workdir", str(tmp_path))
    assert shown.returncode == 0 and "│  200 │" in shown.stdout and "no run of this program" not in shown.stdout, shown


def test_the_report_of_a_program_draws_each_named_metric_and_says_what_has_no_meaning(tmp_path):
    spec = write(tmp_path, {"argv": [sys.executable, "train.py", "--lr", "{lr}", "--steps", "20"],
                            "project": str(ROOT / "hpc_lab" / "05_own_program")}, grid={"lr": [0.1, 0.2]})
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])[0] == 0
    manifest = tmp_path / "work" / "jobs" / "s" / "manifest.json"
    assert [supervise(manifest, i).returncode for i in (0, 1)] == [0, 0]
    out = launch("report", str(spec), "--workdir", str(tmp_path / "work"))
    assert out.returncode == 0 and "(1 metric(s) drawn)" in out.stdout, out.stderr
    report = (tmp_path / "work" / "runs" / "s" / "report.md").read_text()
    assert "![loss](loss.png)" in report and "| lr-0.2 | 0.2 | 20 |" in report
    assert "Samples and attention maps are the TinyGPT trainer's" in report
    assert (tmp_path / "work" / "runs" / "s" / "loss.png").stat().st_size > 1000


def test_an_optuna_search_of_a_program_minimises_its_named_metric(tmp_path):
    """`search: {method: optuna, metric: loss}`: two workers here (--local), each trial the program run as a run
    is, scored by the last `loss` it wrote; the study's values are the program's own."""
    spec = write(tmp_path, {"argv": [sys.executable, "train.py", "--lr", "{lr}", "--steps", "30"],
                            "project": str(ROOT / "hpc_lab" / "05_own_program")},
                 search={"method": "optuna", "trials": 4, "workers": 2, "seed": 1, "metric": "loss",
                         "params": {"lr": {"loguniform": [0.01, 0.3]}}})
    out = launch(str(spec), "--local", "--workdir", str(tmp_path / "work"), cwd=tmp_path)
    assert out.returncode == 0 and "2/2 worker(s) ended well" in out.stdout, out.stdout + out.stderr
    # (two workers print at once: a line of one may land inside a line of the other)
    said = sorted(float(value) for value in re.findall(r"loss=([0-9.]+)", out.stdout))
    import optuna

    from tinygpt.launch.node.study_journal import storage

    study = optuna.load_study(study_name="s", storage=storage(str(tmp_path / "work" / "jobs" / "s" /
                                                                   "optuna.journal")))
    assert sorted(round(t.value, 6) for t in study.trials) == said and len(said) == 4
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


def test_a_search_of_the_trainer_has_no_metric(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "search": {"method": "optuna", "trials": 2, "metric": "loss",
                                                            "params": {"lr": {"uniform": [0.001, 0.01]}}}}))
    assert "search.metric, search.value: are a command's" in refused(spec)


def test_under_torchrun_each_node_starts_torchrun_once_and_the_first_node_hosts_the_rendezvous(tmp_path):
    """The batch script: one task per node with the node's CPUs; on each node, torchrun's words."""
    spec = write(tmp_path, {"argv": ["prog", "--out", "{run_dir}"], "start": "torchrun"},
                 resources={"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1, "time": "00:05:00"})
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])[0] == 0
    script = (tmp_path / "work" / "jobs" / "s" / "s.sbatch").read_text()
    assert 'srun --kill-on-bad-exit=1 --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" --cpus-per-task=2 ' \
        in script and "#SBATCH --ntasks-per-node=2" in script
    slurm = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "2"}
    first, second = (torchrun_start.words(["prog", "a b"], 3, tmp_path, {**slurm, "SLURM_NODEID": node},
                                          ("n1", 29577)) for node in ("0", "1"))
    assert first[1:9] == ["-m", "torch.distributed.run", "--nnodes=2", "--rdzv-backend=c10d",
                          "--rdzv-endpoint=n1:29577", "--rdzv-id=41-2", "--rdzv-conf=is_host=1", "--nproc-per-node=3"]
    assert "--rdzv-conf=is_host=0" in second and first[-3:] == [str(tmp_path), "prog", "a b"]
    alone = torchrun_start.words(["prog"], 1, tmp_path, {}, ("x", 1))
    assert alone[3:5] == ["--standalone", "--nproc-per-node=1"]
    told = torchrun_start.environment({}, "USR2")
    assert told["PET_SIGNALS_TO_HANDLE"] == told["TORCHELASTIC_SIGNALS_TO_HANDLE"] == \
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"


@pytest.mark.parametrize("codes, torchrun, node", [
    ([0, 0], 0, 0), ([75, 75], 1, 75), ([0, 75], 1, 75), ([75, 1], 1, 1), ([143, 75], 1, 143),
    ([75, None], 1, 1), ([None, None], 1, 1), ([0, None], 0, 1),
])
def test_a_nodes_status_is_its_workers_which_torchrun_keeps_to_itself(tmp_path, codes, torchrun, node):
    for rank, code in enumerate(codes):
        if code is not None:
            (tmp_path / str(rank)).write_text(str(code))
    assert torchrun_start.node_status(tmp_path, len(codes), torchrun) == node


def test_a_nodes_status_waits_for_a_worker_that_outlives_torchrun(tmp_path):
    """torchrun may abort while it stops its workers (seen on the cluster: `terminate called without an active
    exception`, status 134): the worker still saving is waited for, and its 75 is the node's status."""
    worker = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1); "
                               "open(sys.argv[1], 'w').write('75')", str(tmp_path / "0")])
    (tmp_path / "0.pid").write_text(str(worker.pid))
    try:
        assert torchrun_start.node_status(tmp_path, 1, 134) == 75
    finally:
        worker.wait(timeout=60)


def test_under_torchrun_the_stop_signal_reaches_every_worker_and_the_node_asks_for_a_requeue(tmp_path):
    """ddp_fit.py, two workers under torchrun here (--standalone): the stop signal sent to the task's process
    group, as Slurm sends it to every process of the step, reaches the workers through torchrun (told to pass
    it on); they save and exit 75, which torchrun hides (it ends with 1) and the node's status says again."""
    project = str(FOREIGN)
    spec = write(tmp_path, {"argv": [sys.executable, "ddp_fit.py", "--lr", "0.05", "--steps", "1000", "--step-s",
                                     "0.1", "--out", "{run_dir}"], "project": project, "start": "torchrun"},
                 resources={"tasks_per_node": 2, "time": "00:05:00"})
    assert run_cli([str(spec), "--dry-run", "--workdir", str(tmp_path / "work")])[0] == 0
    run_dir = tmp_path / "work" / "runs" / "s" / "base"
    proc = subprocess.Popen([sys.executable, "-m", "tinygpt.launch.node.supervise",
                             str(tmp_path / "work" / "jobs" / "s" / "manifest.json"), "0"], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env())
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), timeout=120, what="ddp_fit.py training", proc=proc)
        os.killpg(proc.pid, signal.SIGUSR2)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 75 and "saved and asks to be requeued" in err, err
    assert "stopped at step" in out and (run_dir / "ckpt.pt").exists()
    assert {json.loads(line)["world"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()} == {2}


def test_a_program_of_yours_gets_one_task_and_no_gpu_unless_its_spec_asks(tmp_path):
    """A profile's GPUs are the trainer's default, and a ceiling for a program the launcher knows nothing of: one
    task per GPU would start it once per GPU, each copy told a RANK. --dry-run says what a run asks for, and why."""
    profile = tmp_path / "gpus.yaml"
    profile.write_text("name: gpus\nnode: {gpus: 4, cpus: 32, mem: 64G}\ncpus_per_gpu: 8\nmem_per_gpu: 16G\n")
    for asked, said in [({}, "1 node(s) x 1 task(s), 1 CPU/task, 00:05:00"),
                        ({"gpus_per_node": 2}, "1 node(s) x 2 task(s), 2 GPU/node, 8 CPU/task, 32768 MB")]:
        spec = write(tmp_path, {"argv": ["true"]}, cluster=str(profile),
                     resources={"time": "00:05:00", **asked})
        out = launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "work"), "--no-snapshot")
        assert out.returncode == 0 and f"resources per run: {said}" in out.stdout, out.stdout + out.stderr
        note = "a program of yours gets one task and no GPU unless `resources` asks"
        assert (note in out.stdout) == (not asked), out.stdout
    trainer = tmp_path / "t.yaml"
    trainer.write_text(yaml.safe_dump({"name": "t", "cluster": str(profile), "resources": {"time": "00:05:00"}}))
    assert spec_mod.load(trainer, tmp_path / "work").resources.gpus_per_node == 4


NANO_PROGRESS = r"step (?P<step>\d+): train loss (?P<train_loss>[\d.]+), val loss (?P<val_loss>[\d.]+)"


def read_text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def nano_project(tmp_path: Path) -> Path:
    """nano_like.py (nanoGPT's habits) as a clone of nanoGPT is laid out: its code tracked by git, its prepared data
    (data/tiny/train.bin) ignored."""
    project = tmp_path / "nanoGPT"
    (project / "data" / "tiny").mkdir(parents=True)
    (project / "train.py").write_text((FOREIGN / "nano_like.py").read_text())
    (project / ".gitignore").write_text("*.bin\n")
    (project / "data" / "tiny" / "train.bin").write_bytes(bytes(range(256)))
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "add", "."], check=True)
    return project


def test_a_program_that_splits_on_equals_resumes_only_when_told_and_prints_its_losses_runs_unchanged(tmp_path):
    """nanoGPT's train.py as it is, with a few lines of spec: `--out_dir={run_dir}` splits on its one `=` (a run's
    name holds none), its git-ignored data comes along (include), a life that finds its checkpoint adds
    --init_from=resume (--dry-run shows both lives' words), and its printed losses become the run's metrics.
    Killed by the signal Slurm sends before the time limit (it has no handler) as it holds after its first
    checkpoint (NANO_LIKE_HOLD), the next life resumes where that checkpoint was and ends as an unbroken run ends;
    status shows the losses."""
    nano_project(tmp_path)
    spec = write(tmp_path, {"argv": [sys.executable, "train.py", "--out_dir={run_dir}", "--learning_rate={lr}",
                                     "--max_iters=40", "--step_s={step_s}"],
                            "values": {"step_s": 0.05}, "project": "nanoGPT", "include": ["data/*/*.bin"],
                            "resume": {"when": "ckpt.pt", "add": ["--init_from=resume"]},
                            "progress": [NANO_PROGRESS]}, grid={"lr": [0.001, 0.002]})
    out = launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "work"))
    run_dir = tmp_path / "work" / "runs" / "s" / "lr-0.001"
    first = f"run lr-0.001, first life: {sys.executable} train.py --out_dir={run_dir} --learning_rate=0.001"
    assert out.returncode == 0 and first in out.stdout, out.stdout + out.stderr
    assert f"run lr-0.001, a life that finds {run_dir / 'ckpt.pt'}: {first.split(': ', 1)[1]} --max_iters=40 " \
           f"--step_s=0.05 --init_from=resume" in out.stdout, out.stdout
    manifest = tmp_path / "work" / "jobs" / "s" / "manifest.json"
    proc = subprocess.Popen([sys.executable, "-m", "tinygpt.launch.node.supervise", str(manifest), "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=python_env(NANO_LIKE_HOLD="1"))
    try:  # (once its first checkpoint is written, and its step recorded from what it printed)
        wait_until(lambda: '"step": 10' in read_text(run_dir / "metrics.jsonl"), timeout=60, what="step 10", proc=proc)
        proc.send_signal(signal.SIGUSR2)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGUSR2 and "without saving (SIGUSR2)" in err, err
    saved = json.loads((run_dir / "ckpt.pt").read_text())["iter_num"]
    again = supervise(manifest, 0)
    assert again.returncode == 0 and saved == 10 and "--init_from=resume" in again.stderr, again
    assert f"resuming training from {run_dir} at iter {saved}" in again.stdout, again.stdout
    unbroken = supervise(manifest, 1)
    assert unbroken.returncode == 0 and "matched no line" not in unbroken.stderr, unbroken
    data = json.loads(manifest.read_text())
    data["command"]["progress"].append(r"epoch (?P<step>\d+)")  # (a pattern that never matches is said)
    manifest.write_text(json.dumps(data))
    (run_dir.parent / "lr-0.002" / "metrics.jsonl").unlink()  # (a finished run is not started again)
    assert "command.progress[1] matched no line the program printed" in supervise(manifest, 1).stderr
    said = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "val_loss" in record:
            said[record["step"]] = record["val_loss"]
    assert sorted(said) == [0, 10, 20, 30, 40] and said[40] == 4.0 / (1 + 0.1 * 40) + 0.05 + 256e-4
    shown = launch("status", str(spec), "--workdir", str(tmp_path / "work"))
    row = next(line for line in shown.stdout.splitlines() if "lr-0.001" in line)
    assert "40" in row and f"{said[40]:.4f}" in row, shown.stdout
    assert "no run of this program has reported a step" not in shown.stdout


@pytest.mark.parametrize("sets, said", [
    (["lr=0.5"], "--set lr: `lr` differs between the sweep's runs, which are named after it; change it in the "
                 "spec's grid, runs or search instead"),
    (["epochs=3"], "--set epochs: no word of command.argv has {epochs}, so no run would get it; give a value the "
                   "program's words use (lr, note)"),
    (["note=a\0b"], "run lr-0.1: note: 'a\\x00b' holds a NUL character, which no program can be given"),
], ids=["grid key", "unused key", "NUL"])
def test_a_value_set_on_the_command_line_reaches_the_program_as_its_runs_are_named_or_is_refused(tmp_path, sets,
                                                                                                  said):
    """What `--set` gives every run reaches the program exactly as the runs' names and the plan table say."""
    spec = write(tmp_path, {"argv": ["prog", "{lr}", "{note}"], "values": {"note": "x"}}, grid={"lr": [0.1, 0.2]})
    assert said in refused(spec, *[word for value in sets for word in ("--set", value)])


def test_a_float_written_as_yaml_1_1_leaves_it_a_text_is_a_float_and_reaches_the_program_as_written(tmp_path):
    spec = write(tmp_path, {"argv": ["prog", "{lr}"], "params": {"lr": {"type": "float", "min": 0, "max": 1}}},
                 grid={"lr": ["1e-3", 0.5]})
    sweep = spec_mod.load(spec, tmp_path / "work")
    assert [r.own["lr"] for r in sweep.runs] == ["1e-3", 0.5] and sweep.runs[0].name == "lr-1e-3"


AS_WRITTEN = ["0755", "on", "off", "yes", "no", "12:30", "12:30:00", "1.10", "1_000", "0x1F", "+5", ".5",
              "2026-12-05"]  # (plain scalars YAML 1.1 reads as a number, a truth value or a date)
TYPED = {"10": "10", "0.001": "0.001", "1.0": "1.0", "true": "true", "false": "false", "3.0e-4": "0.0003"}


def test_a_plain_value_reaches_the_program_as_written_wherever_the_spec_or_the_command_line_gives_it(tmp_path):
    """Class 1 of the edges: a spec's plain scalar is the text as written unless it is its value's own text
    (schema.load_yaml), in `values`, the grid, `runs` and `--set` alike, and names the run as written; a float in
    exponent form is a number. The same rule gives a spec's unquoted `time: 1:30:00` as 90 minutes, where YAML 1.1
    read 5400 (base 60) and the job asked for 5400 minutes."""
    literal = {**{text: text for text in AS_WRITTEN}, **TYPED}
    keys = {text: f"v{i}" for i, text in enumerate(literal)}
    argv = ", ".join(f'"{{{key}}}"' for key in keys.values())
    (tmp_path / "s.yaml").write_text(
        "name: s\nresources: {time: 1:30:00}\n"
        f"command:\n  argv: [{', '.join(json.dumps(w) for w in ECHO)}, {argv}, \"{{g}}\", \"{{r}}\", \"{{c}}\"]\n"
        f"  project: {tmp_path}\n"
        "  values: {" + ", ".join(f"{keys[t]}: {t}" for t in literal) + ", c: x, r: x}\n"
        "grid: {g: [0755, 1.10]}\nruns: [{name: one, g: yes, r: on}]\n")
    code, err = run_cli([str(tmp_path / "s.yaml"), "--dry-run", "--workdir", str(tmp_path / "work"),
                         "--set", "c=0755"])
    assert code == 0, err
    manifest = tmp_path / "work" / "jobs" / "s" / "manifest.json"
    assert [r.name for r in load(manifest).runs] == ["g-0755", "g-1.10", "one"]
    assert json.loads(supervise(manifest, 1).stdout)[0] == [*literal.values(), "1.10", "x", "0755"]
    assert json.loads(supervise(manifest, 2).stdout)[0] == [*literal.values(), "yes", "on", "0755"]
    script = next((tmp_path / "work" / "jobs" / "s").glob("*.sbatch")).read_text()
    assert "#SBATCH --time=01:30:00" in script, script
