"""`pack: 2` against `pack: 1` for the same four tiny runs on the local Slurm cluster: the sweep's wall time.

    python bench/packing.py [--rounds 2] [--steps 300]

Both ask for the same CPUs in all (pack 1: four tasks of one CPU; pack 2: two tasks of two CPUs, one per
run), alternated round by round. Prints JSON: seconds from submission until every task has ended, per
round, and the median of each. Needs the cluster of hpc_lab/local_cluster/up.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tinygpt.launch import manifest
from tinygpt.launch.layout import SweepDirs

ROOT = Path(__file__).resolve().parent.parent
TEXT = "".join(f"{w}: the {t} of the {n}, {w.lower()}!\n" for w in ("ROMEO", "JULIET", "NURSE")
               for t in ("rose", "moon", "night", "sword") for n in ("house", "town", "field", "sea")) * 20


def sweep_seconds(work: Path, pack: int, steps: int) -> float:
    corpus = work / "corpus.txt"
    corpus.write_text(TEXT)
    spec = work / f"pack{pack}.yaml"
    spec.write_text(
        f"name: pack{pack}\ncluster: local\npack: {pack}\n"
        f"train: {{data_file: {corpus}, n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, batch_size: 8, "
        f"max_steps: {steps}, eval_interval: {steps}, sample_tokens: 0, eval_windows: 8, threads: 1}}\n"
        "grid: {seed: [1, 2, 3, 4]}\n"
        f"resources: {{time: '00:30:00', cpus_per_task: {pack}}}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "launch.py"), str(spec), "--workdir", str(work)], check=True,
                   capture_output=True, env=env)
    job = manifest.load(SweepDirs(work, f"pack{pack}").manifest).submissions[0].job_id
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        time.sleep(0.2)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    seconds: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for pack in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                seconds[pack].append(round(sweep_seconds(Path(tmp), pack, args.steps), 1))
    print(json.dumps({f"pack{p}": {"rounds_s": s, "median_s": statistics.median(s)} for p, s in seconds.items()}))


if __name__ == "__main__":
    main()
