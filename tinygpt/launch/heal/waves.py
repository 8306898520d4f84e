"""A sweep larger than the queue limits let out at once goes out in waves, fed by the sweep's heal job.

The launch submits what fits now and writes the rest in `jobs/<sweep>/waves.json`; the heal job waits for the
first of the sweep's live tasks to end (`--dependency=afterany:A_1?afterany:A_2...`, at most LIVE_MAX of them),
then submits the next wave, as many tasks as fit then, and itself again. No process waits on the login node and
the heal job holds no CPU while it waits; each pass is one small job, and a run is never sent twice: a run waits
while no submission names it, and every submission is recorded as Slurm gives its id, under the sweep's lock.

What fits is read anew before every wave (slurm/limits.py: the submit limits that count this user's jobs, each
array task one), less the places the spec leaves to the user's other jobs (`queue_margin`, read again from the
spec file) and one for the heal job's next submission. A limit lowered mid-sweep makes the next waves smaller, or
none: the heal job then looks again a minute later (`--begin`), and never fails for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from tinygpt.base import durable
from tinygpt.launch import manifest as manifest_mod
from tinygpt.launch.errors import LaunchError, SlurmAway
from tinygpt.launch.heal.job import heal_jobs, job_state, submit
from tinygpt.launch.manifest import WaveScript, WavesRecord
from tinygpt.launch.read.run_states import jobs_of
from tinygpt.launch.slurm import limits, slurm_cli
from tinygpt.launch.submit import chain
from tinygpt.launch.submit.plan import ranges
from tinygpt.training.progress import format_duration

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest
    from tinygpt.launch.read.run_states import Row
    from tinygpt.launch.slurm.limits import Limit
    from tinygpt.launch.slurm.live_cluster import LiveCluster
    from tinygpt.launch.spec.sweep import Sweep
    from tinygpt.launch.submit.plan import Plan

LIVE_MAX = 16  # the heal job starts when the first of at most this many live tasks ends
LOOK_AGAIN = "now+60"  # with no task of the sweep live to wait for, the heal job looks again this much later
HEAL_PLACES = 1  # the heal job's own place in the queue, always kept


class Waves(NamedTuple):
    """A launch larger than the queue limits let out at once: its waves, the tasks waiting, the places now."""

    record: WavesRecord
    tasks: int
    places: int | None
    tightest: Limit | None


def at_launch(plan: Plan, cluster: LiveCluster, relaunch: bool, dry_run: bool, chained: bool) -> Waves | None:
    """The waves a checked sbatch array goes out in, when its tasks are more than the queue limits let out now (or
    a relaunch adds to the waves of the launch before); None: all at once. A chain's (`chained`) data step takes a
    place before the first wave, and its report goes out after the last. A search's workers go out whole, as does
    submitit's array (not asked), and Slurm's own words refuse what does not fit."""
    sweep = plan.sweep
    if sweep.search is not None or not plan.scripts:
        return None
    before = manifest_mod.load_waves(sweep.dirs) if relaunch else None
    report = str(sweep.dirs.step_script("report")) if chained else None
    data_step = chained and sweep.command is None  # (a program of the user's brings its own data)
    record = joined(before, record_for(sweep, plan, queue_qos(sweep, cluster), report))
    tasks = tasks_of(record, set(manifest_mod.load(plan.manifest_path).waiting(record)))
    places, tightest = room(record, sweep.queue_margin)
    if places is not None and data_step:
        places -= 1
    if before is None and (places is None or tasks <= places + (0 if sweep.retry or chained else HEAL_PLACES)):
        return None
    if before is None and places <= 0 and not dry_run:
        data = ", one for the chain's data step" if data_step else ""
        raise LaunchError(f"waves: no place in the queue for a first wave now ({tightest} counts your jobs; "
                          f"queue_margin {sweep.queue_margin}, and one place for the heal job{data}); launch again "
                          f"once some of your jobs have ended, or lower queue_margin")
    return Waves(record, tasks, places, tightest)


def queue_qos(sweep: Sweep, cluster: LiveCluster) -> list[str]:
    """The QOS whose limits count the sweep's jobs: the job's own (the association's default when it names
    none) and its partition's."""
    account = sweep.resources.named.get("account")
    job = sweep.resources.named.get("qos") or cluster.default_qos(account)
    partition = cluster.partitions.get(sweep.resources.partition or cluster.default_partition or "", {})
    return [q for q in dict.fromkeys([job, partition.get("QoS")]) if q and q not in ("N/A", "(null)")]


def launch_first(plan: Plan, found: Waves, follow: str, steps: dict[str, Path], hold: bool) -> int:
    """The first wave submitted (after a chain's data step, of `steps`), the rest recorded to wait, and the heal
    job that feeds them (unless the sweep's heal job is queued already: a relaunch's new runs join its waves).
    `follow`: the command that shows them."""
    manifest = manifest_mod.load(plan.manifest_path)
    feeding = queued_heal_job(manifest)
    save(manifest, found.record)
    data = chain.submit_data(plan.manifest_path, steps, hold) if steps else None
    ids = feed(manifest, found.record, found.places, f"afterok:{data}" if data else None)
    manifest = manifest_mod.load(plan.manifest_path)
    live = [manifest.task_job_ids()[i] for s in manifest.submissions if s.job_id in ids for i in s.indices]
    waiting = len(manifest.waiting(found.record))
    print(f"{f'submitted the data step as job {data}; ' if data else ''}submitted {len(live)} run(s) as job array "
          f"{', '.join(ids) or '(none: no place now)'}; {waiting} wait for a wave; follow with `{follow}`")
    if feeding:
        print(f"waves: heal job {feeding}, queued already, sends the next wave")
        return 0
    # (with no task out, a chain's heal job waits for its data step: a wave it sends must not start before)
    when = after_the_first_of(list(dict.fromkeys(live))) if live or not data else [f"--dependency=afterok:{data}"]
    try:
        job = submit(manifest, when, 1)
    except LaunchError as err:
        raise LaunchError(f"waves: {err}; the runs not submitted wait: launch the spec again once some of your jobs "
                          f"have ended, and a heal job sends them") from None
    print(f"waves: heal job {job} sends the next wave when a task of the sweep ends"
          + (f"; it also sends again what ended by {', '.join(plan.sweep.retry.ends)}" if plan.sweep.retry else "")
          + ("; the report goes out after the last wave" if steps else ""))
    return 0


def record_for(sweep: Sweep, plan: Plan, qos: list[str], report: str | None) -> WavesRecord:
    """Every run of the plan's scripts as waiting for a wave (and a chain's `report` step's script)."""
    return WavesRecord(scripts=[WaveScript(script=str(s.path), offset=s.offset, pack=sweep.pack, indices=s.indices)
                                for s in plan.scripts],
                       account=sweep.resources.named.get("account"), qos=qos, margin=sweep.queue_margin,
                       throttle=sweep.array_parallelism, report=report)


def joined(before: WavesRecord | None, new: WavesRecord) -> WavesRecord:
    """A relaunch's new runs added to the waves of the sweep's earlier launch (its settings are the new ones)."""
    return new if before is None else new.model_copy(update={"scripts": [*before.scripts, *new.scripts]})


def tasks_of(record: WavesRecord, waiting: set[int]) -> int:
    """How many array tasks the waiting runs need."""
    return sum(len({(i - s.offset) // s.pack for i in s.indices if i in waiting}) for s in record.scripts)


def room(record: WavesRecord, margin: int) -> tuple[int | None, Limit | None]:
    """How many tasks may go out now (None: no submit limit applies), and the limit that says so. Fails closed:
    SlurmAway while accounting or the controller does not answer."""
    found = limits.read(record.account, record.qos)
    if found is None:
        if silence := slurm_cli.accounting_silence():
            raise SlurmAway(f"the queue limits cannot be read: {silence}; {slurm_cli.AGAIN}")
        return None, None  # (no accounting: no association or QOS limit is enforced)
    left, tightest = limits.room(found)
    return (None, None) if left is None else (left - margin - HEAL_PLACES, tightest)


def save(manifest: Manifest, record: WavesRecord) -> None:
    durable.write(manifest.dirs.waves, record.model_dump_json(indent=1))


def margin_now(manifest: Manifest, record: WavesRecord) -> int:
    """The spec's `queue_margin` as its file says now (so that a changed margin counts from the next wave), else
    as the launch recorded it."""
    import yaml

    try:
        value = (yaml.safe_load(Path(manifest.spec).read_text(encoding="utf-8")) or {}).get("queue_margin",
                                                                                          record.margin)
    except (OSError, yaml.YAMLError, AttributeError, UnicodeDecodeError):
        return record.margin
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else record.margin


def feed(manifest: Manifest, record: WavesRecord, places: int | None, after: str | None = None) -> list[str]:
    """The next wave: the first waiting tasks, at most `places` of them (None: all), one `sbatch --array` per
    script (`after`: its --dependency); each recorded as Slurm gives its id. A submission over a limit lowered
    since it was read is tried again with half as many tasks, down to none. The new jobs' ids."""
    waiting, ids = set(manifest.waiting(record)), []
    dependency = [f"--dependency={after}"] if after else []
    for s in record.scripts:
        tasks = sorted({(i - s.offset) // s.pack for i in s.indices if i in waiting})
        take = tasks if places is None else tasks[:max(0, places)]
        while take:
            array = ranges(take) + (f"%{record.throttle}" if record.throttle else "")
            try:
                job_id = slurm_cli.sbatch(s.script, [f"--array={array}", *dependency])
            except SlurmAway:
                raise
            except LaunchError as err:
                if not limits.over_a_submit_limit(str(err)):
                    raise
                print(f"heal: a wave of {len(take)} task(s) is over a limit now ({err}); trying "
                      f"{len(take) // 2}", flush=True)
                take = take[:len(take) // 2]
                places = len(take)
                continue
            chosen = set(take)
            runs = [i for i in s.indices if i in waiting and (i - s.offset) // s.pack in chosen]
            manifest_mod.record_submission(manifest.path, "sbatch", job_id, runs, array=array, offset=s.offset,
                                           script=s.script, pack=s.pack)
            waiting -= set(runs)  # (a relaunch's script may name a run an earlier one does)
            ids.append(job_id)
            if places is not None:
                places -= len(take)
            break
        if places is not None and places <= 0:
            break
    return ids


def report_after_the_last(manifest: Manifest, record: WavesRecord | None, rows: list[Row]) -> None:
    """A chain's report step, sent once (its submission recorded) when no run waits for a wave any more: after
    every task of the sweep still live."""
    if record is None or record.report is None or manifest.waiting(record) or \
            any(s.role == "report" for s in manifest.submissions):
        return
    live = jobs_of(live_tasks(rows))
    job = chain.submit_report(manifest.path, record.report, live)
    print(f"heal: the chain's report job {job} follows the last wave"
          + (f" (after {', '.join(live)})" if live else ""), flush=True)


def live_tasks(rows: list[Row]) -> list[str]:
    """The sweep's tasks still queued or running, each once (packed runs share one)."""
    return list(dict.fromkeys(r.job_id for r in rows if r.job_id != "-" and not r.state.ended
                              and r.source != "waves"))


def after_the_first_of(live: list[str]) -> list[str]:
    """The heal job's sbatch options while runs wait for a wave: to start when the first of the live tasks
    `live` ends, or a minute later when none is live (the queue is full of the user's other jobs)."""
    if not live:
        return [f"--begin={LOOK_AGAIN}"]
    return ["--dependency=" + "?".join(f"afterany:{job}" for job in live[:LIVE_MAX])]


def queued_heal_job(manifest: Manifest) -> str | None:
    """The sweep's newest heal job, when it is still queued or running (it will feed what a relaunch adds);
    SlurmAway when squeue does not answer."""
    heals = heal_jobs(manifest)
    if not heals:
        return None
    found = slurm_cli.squeue_states(heals[-1:])
    if found is None:
        raise SlurmAway(f"squeue did not answer whether heal job {heals[-1]} is queued; {slurm_cli.AGAIN}")
    state = found.get(heals[-1])
    return heals[-1] if state is not None and state.state in ("PENDING", "RUNNING", "CONFIGURING") else None


def said(record: WavesRecord, waiting: int, places: int | None, tightest: Limit | None) -> str:
    """A wave in a line: how much waits, how much fits now and why."""
    limit = f"{tightest} counts your jobs" if tightest else "no submit limit"
    return (f"waves: {waiting} task(s) wait for a wave; {max(0, places or 0) if places is not None else 'all'} fit "
            f"now ({limit}; {record.margin} left to your other jobs, {HEAL_PLACES} to the heal job)")


def status_lines(manifest: Manifest, rows: list[Row]) -> list[str]:
    """What `status` says of the queue above its table: the runs that wait for a wave, the heal job that sends
    them and when the last should go out at the pace so far; and the runs Slurm keeps pending for a limit."""
    from collections import Counter

    lines = []
    held = Counter(r.reason for r in rows if r.state.name == "PENDING" and "Limit" in r.reason)
    lines += [f"queue: {n} run(s) pending for {reason}: Slurm starts them as your other jobs end"
              for reason, n in sorted(held.items())]
    if manifest_mod.load_waves(manifest.dirs) is None:
        return lines
    waiting = sum(r.source == "waves" for r in rows)
    heals = heal_jobs(manifest)
    if not waiting:
        return [f"waves: every run went out, in {sum(bool(s.indices) for s in manifest.slurm_submissions())} "
                f"submission(s)", *lines]
    if manifest.dirs.cancelled.exists():
        return [f"waves: {waiting} run(s) wait for a wave; cancelled: nothing more is sent", *lines]
    ended, since = sum(r.state.name in ("COMPLETED", "FINISHED") for r in rows), manifest.first_submitted()
    eta = ""
    if ended and since and (spent := time.time() - since) > 0:
        eta = (f"; at the pace so far ({ended} run(s) ended in {format_duration(spent)}) the last goes out in about "
               f"{format_duration(waiting * spent / ended)}")
    heal = f"heal job {heals[-1]} {job_state(heals[-1])}" if heals else "no heal job"
    return [f"waves: {waiting} run(s) wait for a wave; {heal}{eta}", *lines]
