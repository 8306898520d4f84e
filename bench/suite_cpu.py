"""Where the test suite's CPU goes: the whole machine's CPU seconds while a command runs, and each test's own.

    python bench/suite_cpu.py [--out DIR] -- make test        (any command; its exit status is kept)
    python bench/suite_cpu.py --summary DIR                   (the figures of an earlier measurement again)

The machine's figure is read from /proc/stat before and after the command, so it counts everything that ran
meanwhile: pytest's workers, the trainers they start, and the jobs slurmd starts for the cluster tests (the
machine should be otherwise idle). Each test's figure is the CPU time of its pytest process and of the
children it waited for during the test (os.times), the trainers launch/submit/fork_server.py forks included (its fork
server waits for them); it is recorded by this file, loaded as a pytest plugin (`-p suite_cpu`, through
PYTEST_ADDOPTS). A Slurm job's processes are not children of the test, so a cluster test's own figure leaves
them out: the machine's total less the tests' sum is what Slurm's daemons and jobs, pytest itself and the
rest of the machine spent. Prints per file and the ten most expensive tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

LOG_ENV = "TINYGPT_SUITE_CPU_LOG"


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (every field of /proc/stat's `cpu` line but idle
    and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def calibration_s() -> float:
    """CPU seconds of a fixed pure-Python loop, the best of three: this shared machine's speed drifts between
    runs made minutes apart (a whole suite's figure by a fifth and more), so a figure is read beside it."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        total = 0
        for i in range(3_000_000):
            total += i * i % 7
        best = min(best, time.process_time() - start)
    return best


# ---- the pytest plugin (loaded in every pytest process, xdist workers included) ---------------------------
_START: dict[str, tuple[float, os.times_result]] = {}
_SESSION: list[float] = []  # the machine's CPU seconds and the clock when pytest's session began
_RUNS_TESTS = [True]  # (False in pytest-xdist's controller, which only hears of the tests its workers run)


def pytest_configure(config):
    _RUNS_TESTS[0] = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def _forked_s() -> float:
    """CPU seconds of multiprocessing's fork server in this process and of the children it has reaped
    (tinygpt/launch/submit/fork_server.py forks trainers from it: they are not this process's children)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() if pid else []
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def pytest_sessionstart(session):
    if os.environ.get(LOG_ENV) and not hasattr(session.config, "workerinput"):  # (the process that runs pytest)
        _SESSION[:] = [machine_cpu_s(), time.perf_counter()]


def pytest_sessionfinish(session):
    """A line per pytest session (a command such as .ci/run runs more than one): its arguments, its machine CPU
    seconds and its wall seconds."""
    if os.environ.get(LOG_ENV) and _SESSION:
        record = {"args": session.config.invocation_params.args, "cpu_s": machine_cpu_s() - _SESSION[0],
                  "wall_s": time.perf_counter() - _SESSION[1]}
        with open(Path(os.environ[LOG_ENV]) / "pytest.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


def pytest_runtest_logstart(nodeid, location):
    _START[nodeid] = (time.perf_counter(), os.times(), _forked_s())


def pytest_runtest_logfinish(nodeid, location):
    if not os.environ.get(LOG_ENV) or not _RUNS_TESTS[0] or nodeid not in _START:
        return
    wall0, t0, forked0 = _START.pop(nodeid)
    t1 = os.times()
    record = {"test": nodeid, "wall_s": round(time.perf_counter() - wall0, 3),
              "self_s": round(t1.user + t1.system - t0.user - t0.system, 3),
              "children_s": round(t1.children_user + t1.children_system - t0.children_user - t0.children_system
                                  + max(_forked_s() - forked0, 0.0), 3)}
    with open(Path(os.environ[LOG_ENV]) / f"tests-{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


# ---- the command line -----------------------------------------------------------------------------------
def summary(out: Path) -> None:
    machine = json.loads((out / "machine.json").read_text())
    tests: dict[str, dict] = {}
    for path in sorted(out.glob("tests-*.jsonl")):
        for line in path.read_text().splitlines():
            t = json.loads(line)
            t["cpu_s"] = t["self_s"] + t["children_s"]
            if t["test"] not in tests or t["cpu_s"] > tests[t["test"]]["cpu_s"]:
                tests[t["test"]] = t
    tests = list(tests.values())
    per_file: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for t in tests:
        row = per_file[t["test"].split("::")[0]]
        row[0] += 1
        row[1] += t["cpu_s"]
        row[2] += t["wall_s"]
    total = sum(t["cpu_s"] for t in tests)
    print(f"command: {' '.join(machine['command'])} (exit {machine['exit']})")
    print(f"machine CPU seconds: {machine['cpu_s']:.0f} over {machine['wall_s']:.0f} s wall "
          f"({machine['cpu_s'] / machine['wall_s'] / os.cpu_count():.0%} of {os.cpu_count()} cores)")
    sessions = (out / "pytest.jsonl").read_text().splitlines() if (out / "pytest.jsonl").exists() else []
    for session in map(json.loads, sessions):
        print(f"  of which pytest's session ({' '.join(session['args'])}): {session['cpu_s']:.0f} over "
              f"{session['wall_s']:.0f} s")
    if "calibration_s" in machine:
        print(f"the machine's speed: a fixed loop took {machine['calibration_s'][0]:.2f} s of CPU before and "
              f"{machine['calibration_s'][1]:.2f} s after (compare runs made at other times with it)")
    print(f"tests: {len(tests)}, their own CPU seconds (process + waited-for children): {total:.0f}; "
          f"the rest (Slurm's daemons and jobs, pytest, collection, other): {machine['cpu_s'] - total:.0f}")
    print("\nper file (CPU s, wall s, tests):")
    for name, (n, cpu, wall) in sorted(per_file.items(), key=lambda kv: -kv[1][1]):
        print(f"  {cpu:8.1f} {wall:8.1f} {n:4d}  {name}")
    print("\nthe ten most expensive tests (CPU s, wall s):")
    for t in sorted(tests, key=lambda t: -t["cpu_s"])[:10]:
        print(f"  {t['cpu_s']:8.1f} {t['wall_s']:8.1f}  {t['test']}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summary"]:
        summary(Path(argv[1]))
        return 0
    out = Path("/tmp") / f"suite-cpu-{int(time.time())}"
    if argv[:1] == ["--out"]:
        out, argv = Path(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{LOG_ENV: str(out)})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    env["PYTEST_ADDOPTS"] = " ".join(filter(None, [env.get("PYTEST_ADDOPTS"), "-p suite_cpu"]))
    before = calibration_s()
    cpu0, wall0 = machine_cpu_s(), time.perf_counter()
    code = subprocess.call(argv, env=env)
    cpu, wall = machine_cpu_s() - cpu0, time.perf_counter() - wall0
    (out / "machine.json").write_text(json.dumps({"command": argv, "exit": code, "cpu_s": cpu, "wall_s": wall,
                                                  "calibration_s": [before, calibration_s()]}))
    summary(out)
    print(f"\nrecords: {out}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
