"""A program that ends as it is told, for a retry policy's tests: `ends.py KIND RUN_DIR`.

    ok       ends 0
    bug      raises an error of its own (never retried)
    time     its first life runs past any time limit and cannot save: the signal Slurm sends before the limit
             ends it (that signal's default action); a later one ends 0
    oom      holds --mb megabytes until Slurm kills it for them; a later life holds them 3 s, then ends 0
    stay     its first life stays until Slurm ends it (deaf to the warning signal too); a later one ends 0
    hang     its first life stops beating its heartbeat ($TINYGPT_HEARTBEAT), deaf to that signal too; a later
             one ends 0

A life is counted by a file in RUN_DIR. Every life but a hung one beats its heartbeat once a second.
"""

import argparse
import os
import signal
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("kind", choices=("ok", "bug", "time", "oom", "hang", "stay"))
parser.add_argument("run_dir")
parser.add_argument("--mb", type=int, default=400)
args = parser.parse_args()
lives = Path(args.run_dir) / "lives"
first = not lives.exists()
with lives.open("a") as f:
    f.write(f"{os.environ.get('SLURM_JOB_ID')}\n")
print(f"ends.py: {args.kind}, life {lives.read_text().count(chr(10))}", flush=True)


def beat_for(seconds: float) -> None:
    heartbeat = os.environ.get("TINYGPT_HEARTBEAT")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if heartbeat:
            Path(heartbeat).touch()
        time.sleep(1)


if first and args.kind in ("hang", "stay"):
    signal.signal(getattr(signal, os.environ.get("TINYGPT_STOP_SIGNAL", "SIGUSR2")), signal.SIG_IGN)
if args.kind == "bug":
    raise ValueError("bad data: row 7 has no label")
if args.kind == "oom":
    held = b"x" * (args.mb * 2**20)  # (written, so every page is resident)
    beat_for(10**9 if first else 3)
elif first and args.kind in ("time", "stay"):
    beat_for(10**9)
elif first and args.kind == "hang":
    time.sleep(10**9)
print("ends.py: done", flush=True)
