"""The laptop flow under every login shell of the local cluster's login node (up.sh --login): one table of
command and outcome per shell user (lib.sh's LOGIN_OTHERS), for this checkout or another (--checkout: an older
commit's work tree, to compare before and after). Run as root on the machine of the local cluster:

    python bench/login_shells.py [--checkout DIR] [--shells sh,bash,zsh,fish,tcsh,csh]

Each step runs the checkout's launch.py as a laptop would (Slurm's commands off PATH): launch a one-run sweep,
status --watch until it ends, logs, report, pull, and Ctrl-C of a `status --watch` of a held sweep (the outcome
is its exit status: 130 is Ctrl-C reaching the login node). An outcome is `ok` or the step's last error line.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.laptop import laptop_for, write_spec  # noqa: E402 (importable from the line above)

USERS = {"sh": "tgsh", "bash": "tgbash", "zsh": "tgzsh", "fish": "tgfish", "tcsh": "tgtcsh", "csh": "tgcsh"}
STEPS = ("launch", "status", "logs", "report", "pull", "ctrl-c")


def outcome(done: subprocess.CompletedProcess, ok: bool) -> str:
    if ok:
        return "ok"
    said = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return (said[-1] if said else f"exit {done.returncode}")[:110]


def flow(checkout: Path, user: str, here: Path) -> dict[str, str]:
    laptop = laptop_for(user, here, remote_dir=f"tinygpt-hpc-bench-{checkout.name}")
    env = {**os.environ, **laptop["env"], "PYTHONPATH": str(checkout), "COLUMNS": "200", "TINYGPT_OFFLINE": "1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(checkout / "launch.py"), *args, "--workdir", str(here)],
                              capture_output=True, text=True, cwd=here, env=env, timeout=600)

    name = f"bench-{user}-{int(time.time())}"
    spec = write_spec(here, name, grid=[0.001])
    done = run(str(spec), "--cluster", str(laptop["profile"]))
    results = {"launch": outcome(done, done.returncode == 0)}
    if done.returncode != 0:
        return results | {step: "-" for step in STEPS[1:]}
    done = run("status", str(spec), "--watch", "--interval", "1")
    results["status"] = outcome(done, done.returncode == 0 and "COMPLETED" in done.stdout)
    done = run("logs", str(spec), "lr-0.001", "--tail", "2")
    results["logs"] = outcome(done, done.returncode == 0 and bool(done.stdout.strip()))
    done = run("report", str(spec))
    results["report"] = outcome(done, done.returncode == 0 and (here / "runs" / name / "report.md").is_file())
    done = run("pull", str(spec))
    results["pull"] = outcome(done, done.returncode == 0)
    held = write_spec(here, f"{name}-held", grid=[0.001])
    run(str(held), "--cluster", str(laptop["profile"]), "--hold")
    watch = subprocess.Popen([sys.executable, str(checkout / "launch.py"), "status", str(held), "--watch",
                              "--workdir", str(here)], cwd=here, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    time.sleep(5)  # (a measurement, not a test: long enough for the watch to start there)
    watch.send_signal(signal.SIGINT)
    try:
        status = watch.wait(timeout=60)
    except subprocess.TimeoutExpired:
        watch.kill()
        status = "hung"
    results["ctrl-c"] = "ok (130)" if status == 130 else f"exit {status}: {watch.stderr.read().strip()[-110:]}"
    subprocess.run(["scancel", "--name", held.stem], timeout=60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the work tree whose launch.py runs")
    parser.add_argument("--shells", default=",".join(USERS), help="which login shells (default: all six)")
    args = parser.parse_args()
    print(f"checkout {args.checkout.resolve()}\n\n| shell | " + " | ".join(STEPS) + " |")
    print("|---" * (len(STEPS) + 1) + "|")
    for shell in args.shells.split(","):
        with tempfile.TemporaryDirectory() as here:
            results = flow(args.checkout.resolve(), USERS[shell], Path(here))
        print(f"| {shell} | " + " | ".join(results[s] for s in STEPS) + " |", flush=True)


if __name__ == "__main__":
    main()
