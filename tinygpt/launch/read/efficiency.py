"""How well a sweep's jobs used what they asked for, from ONE `sacct` call for the whole sweep.

Per job (the latest life of each run): elapsed time; CPU efficiency, the CPU time its processes used
(TotalCPU) against elapsed x allocated CPUs; peak memory (the largest MaxRSS of its steps) against the
memory requested; and, where Slurm's TRES accounting reports them (a GPU accounting plugin), GPU
utilisation and GPU memory. A run that left most of its allocation idle (under half of its GPUs' time
when GPU utilisation is known, else of its CPUs') is flagged. Slurm samples usage every
JobAcctGatherFrequency seconds (30 by default); jobs shorter than that show no memory, unless the
job asks for a shorter period (`sbatch_options: {acctg-freq: 1}` in the spec).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tinygpt.launch.slurm import slurm_cli
from tinygpt.launch.spec.resources import duration_s, size_mb, tres
from tinygpt.launch.spec.retry import RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Collection

    from tinygpt.launch.manifest import Manifest, RunRecord

IDLE_BELOW = 0.5  # a job using less than this share of its allocation is flagged
FIELDS = ("JobID", "State", "ElapsedRaw", "TotalCPU", "AllocCPUS", "ReqMem", "MaxRSS", "AllocTRES",
          "TRESUsageInAve", "TRESUsageInMax", "NNodes")


@dataclass
class Usage:
    job_id: str
    state: str
    elapsed_s: int
    cpus: int
    cpu_s: float
    req_mem_mb: float | None
    peak_mem_mb: float | None = None
    gpus: int = 0
    gpu_util: float | None = None  # percent, averaged over the job's steps
    gpu_mem_mb: float | None = None

    @property
    def cpu_eff(self) -> float | None:
        return self.cpu_s / (self.elapsed_s * self.cpus) if self.elapsed_s and self.cpus else None

    @property
    def mem_eff(self) -> float | None:
        return self.peak_mem_mb / self.req_mem_mb if self.peak_mem_mb is not None and self.req_mem_mb else None

    @property
    def idle(self) -> bool:
        """Most of the allocation unused: by GPU utilisation when the job has GPUs and Slurm reports it."""
        if self.gpus and self.gpu_util is not None:
            return self.gpu_util / 100 < IDLE_BELOW
        return self.cpu_eff is not None and self.cpu_eff < IDLE_BELOW


def _mb(text: str) -> float | None:
    """A size sacct printed, in MB; None for an empty field or one that is not a size."""
    try:
        return size_mb(text) if text.strip() else None
    except ValueError:
        return None


def req_mem_mb(text: str, cpus: int, nodes: int) -> float | None:
    """ReqMem as Slurm prints it: `4000M` per job (Slurm >= 21), or `4000Mc`/`4000Mn` per CPU/node (older)."""
    per = text[-1:] if text[-1:] in ("c", "n") else ""
    size = _mb(text[:-1] if per else text)
    if size is None:
        return None
    return size * (cpus if per == "c" else nodes if per == "n" else 1)


def parse(text: str) -> dict[str, Usage]:
    """sacct's `-P -n -o FIELDS` lines (allocations and their steps) -> {job id: Usage}."""
    usage: dict[str, Usage] = {}
    steps: list[tuple[str, dict[str, str]]] = []
    for line in text.splitlines():
        values = line.split("|")
        if len(values) != len(FIELDS):
            continue
        row = dict(zip(FIELDS, values))
        job_id, _, step = row["JobID"].partition(".")
        if step:
            steps.append((job_id, row))
            continue
        cpus = int(row["AllocCPUS"] or 0)
        alloc = tres(row["AllocTRES"])
        usage[job_id] = Usage(job_id, row["State"].split()[0] if row["State"] else "?", int(row["ElapsedRaw"] or 0),
                              cpus, duration_s(row["TotalCPU"]),
                              req_mem_mb(row["ReqMem"], cpus, int(row["NNodes"] or 1)),
                              gpus=int(alloc.get("gres/gpu", "0") or 0))
    for job_id, row in steps:
        u = usage.get(job_id)
        if u is None:
            continue
        rss = _mb(row["MaxRSS"])
        if rss is not None:
            u.peak_mem_mb = max(u.peak_mem_mb or 0.0, rss)
        util = tres(row["TRESUsageInAve"]).get("gres/gpuutil")
        if util is not None and util.replace(".", "", 1).isdigit():
            u.gpu_util = max(u.gpu_util or 0.0, float(util))
        gpu_mem = _mb(tres(row["TRESUsageInMax"]).get("gres/gpumem", ""))
        if gpu_mem is not None:
            u.gpu_mem_mb = max(u.gpu_mem_mb or 0.0, gpu_mem)
    return usage


def of_sweep(manifest: Manifest,
             runs: Collection[str] | None = None) -> list[tuple[RunRecord, str, Usage | None]] | None:
    """(run, its latest job id, that job's usage) for every run that went to Slurm (or those of `runs`), from one
    sacct call over the sweep's job ids (those runs' jobs); None when accounting does not answer."""
    ids = manifest.task_job_ids()
    chosen = [run for run in manifest.runs if run.index in ids and (runs is None or run.name in runs)]
    if not chosen:
        return []
    asked = sorted({s.job_id for s in manifest.slurm_submissions()}) if runs is None else [ids[r.index] for r in chosen]
    text = slurm_cli.sacct_fields(asked, FIELDS, manifest.first_submitted())
    if text is None:
        return None
    usage = parse(text)
    return [(run, ids[run.index], usage.get(ids[run.index])) for run in chosen]


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def cells(usage: Usage | None) -> dict[str, str]:
    """One run's figures as text, for the status table and the report."""
    from tinygpt.training.progress import format_duration

    if usage is None:
        return {"elapsed": "-", "CPUs": "-", "CPU eff": "-", "mem peak / asked": "-", "GPUs": "-",
                "GPU util": "-", "GPU mem": "-", "flag": "not in accounting yet"}
    mem = "-" if usage.peak_mem_mb is None else f"{usage.peak_mem_mb:,.0f} MB"
    if usage.req_mem_mb:
        mem += f" / {usage.req_mem_mb:,.0f} MB ({_percent(usage.mem_eff)})"
    return {"elapsed": format_duration(usage.elapsed_s), "CPUs": str(usage.cpus), "CPU eff": _percent(usage.cpu_eff),
            "mem peak / asked": mem, "GPUs": str(usage.gpus),
            "GPU util": "-" if usage.gpu_util is None else f"{usage.gpu_util:.0f}%",
            "GPU mem": "-" if usage.gpu_mem_mb is None else f"{usage.gpu_mem_mb:,.0f} MB",
            "flag": "IDLE: most of the allocation unused" if usage.idle else ""}


COLUMNS = ("run", "job", "state", "elapsed", "CPUs", "CPU eff", "mem peak / asked", "GPUs", "GPU util", "GPU mem",
           "flag")
NEXT_MEM = "retry asks"  # a right-sizing retry policy's next request: peak x retry.mem_from_peak


def table_rows(manifest: Manifest, runs: Collection[str] | None = None) -> list[dict[str, str]]:
    """`status --efficiency`'s rows (of `runs` only, when named): each run's latest job, as text by column."""
    found = of_sweep(manifest, runs)
    if found is None:
        from tinygpt.launch.errors import LaunchError, SlurmAway

        if silence := slurm_cli.accounting_silence():
            raise SlurmAway(f"efficiency: cannot measure: {silence}; {slurm_cli.AGAIN}")
        raise LaunchError("efficiency: this cluster keeps no job accounting (sacct does not answer); the figures "
                          "need slurmdbd")
    policy = RetryPolicy.of(manifest.retry)
    rows = [{"run": run.name, "job": job_id, "state": u.state if u else "-", **cells(u)} for run, job_id, u in found]
    if policy is not None and policy.mem_from_peak:  # (what the policy would ask for next)
        for row, (_, _, u) in zip(rows, found):
            row[NEXT_MEM] = "-" if (asks := policy.right_size(u.peak_mem_mb if u else None)) is None else f"{asks:,} MB"
    return rows


def columns_of(rows: list[dict[str, str]]) -> tuple[str, ...]:
    return COLUMNS + ((NEXT_MEM,) if rows and NEXT_MEM in rows[0] else ())


def markdown(rows: list[dict[str, str]]) -> str:
    """The efficiency table as a Markdown section (for the sweep report)."""
    columns = columns_of(rows)
    lines = ["## Efficiency (sacct)", "", f"Runs using under {IDLE_BELOW:.0%} of their CPUs (or GPUs, when Slurm "
             "reports GPU utilisation) are flagged IDLE.", "", "| " + " | ".join(columns) + " |",
             "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(row[c] for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"
