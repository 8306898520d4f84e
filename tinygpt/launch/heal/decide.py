"""What a sweep's retry policy does next with each run, from how it ended: send it again with what it needs,
give it up (and why), or wait for it; and the summary of the sweep once nothing is left to send.

Read only: the heal job (heal/heal_pass.py) sends what this decides, and `status` shows it. A run's round
is the round of its newest submission (the launch is round 1; each of the heal job's is one more). What a run
sent again asks for changes only as its end says (spec/retry.py's KINDS), over what its newest job asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tinygpt.launch.heal.ends import End, failed_nodes, of_run
from tinygpt.launch.heal.job import heal_jobs, job_state
from tinygpt.launch.read.run_states import retry_rounds
from tinygpt.launch.spec.resources import Minutes, parse_mem_mb
from tinygpt.launch.spec.retry import ENDS, NEVER, RetryPolicy

if TYPE_CHECKING:
    from tinygpt.launch.manifest import Manifest
    from tinygpt.launch.read.efficiency import Usage
    from tinygpt.launch.read.run_states import Row

SEND, GIVE_UP, DONE, WAIT = "send", "give up", "done", "wait"


@dataclass(frozen=True)
class Decision:
    row: Row
    end: End
    round: int  # the round of the run's newest submission
    action: str  # SEND, GIVE_UP, DONE or WAIT
    why: str = ""  # a give-up's reason
    options: dict[str, str] = field(default_factory=dict)  # SEND: the sbatch long options its next job gets

    def said(self) -> str:
        """What the policy does with the run, in a line (the heal job's log, `status`)."""
        what = (f"round {self.round + 1} with {options_text(self.options) or 'what it had'}" if self.action == SEND
                else f"given up: {self.why}: {self.end.line}")
        return f"{self.row.name} ({self.row.job_id}) ended {self.end.kind}: {what}"


def options_text(options: dict[str, str]) -> str:
    """sbatch long options as a job is given them: `--time=00:10:00 --mem=600M`."""
    return " ".join(f"--{k}={v}" for k, v in options.items())


def asked(manifest: Manifest) -> dict[int, dict[str, str]]:
    """Run index -> the sbatch options its newest job got over the batch script's own."""
    found: dict[int, dict[str, str]] = {}
    for sub in manifest.slurm_submissions():
        for index in sub.indices:
            found[index] = dict(sub.changes or {})
    return found


def decide(manifest: Manifest, rows: list[Row], usage: dict[str, Usage], policy: RetryPolicy) -> list[Decision]:
    """What the policy does with each run (`usage`: sacct's figures by job id, for right-sizing)."""
    round_of, options_of = retry_rounds(manifest), asked(manifest)
    bad = failed_nodes(rows, manifest)
    decisions = []
    for row in rows:
        end, now = of_run(row, manifest), round_of.get(row.index, 1)
        if end.kind == "live":
            decisions.append(Decision(row, end, now, WAIT))
        elif end.kind == "finished":
            decisions.append(Decision(row, end, now, DONE))
        elif end.kind not in policy.ends:
            why = NEVER.get(end.kind, "Slurm keeps no record of its job" if end.kind == "unknown" else
                            f"{end.kind} is not among retry.ends")
            decisions.append(Decision(row, end, now, GIVE_UP, why))
        elif now > policy.rounds:
            decisions.append(Decision(row, end, now, GIVE_UP, f"its {policy.rounds} retry round(s) are spent"))
        else:
            options, why = next_request(end.kind, options_of.get(row.index, {}), manifest, policy, bad,
                                        usage.get(row.job_id))
            decisions.append(Decision(row, end, now, GIVE_UP if why else SEND, why, options))
    return decisions


def next_request(kind: str, before: dict[str, str], manifest: Manifest, policy: RetryPolicy, bad_nodes: list[str],
                 usage: Usage | None) -> tuple[dict[str, str], str]:
    """The options a run that ended `kind` gets next (over `before`, its newest job's), or why it cannot go."""
    options = dict(before)
    mem = current_mem(before, manifest, usage)
    if kind == "time_limit":
        now = Minutes.parse(before["time"]) if "time" in before else _manifest_time(manifest)
        if policy.max_time is not None and now >= policy.max_time:
            return options, f"it met its time limit at the most allowed, {policy.max_time}"
        grown = now.times(policy.time_factor)
        options["time"] = str(min(grown, policy.max_time) if policy.max_time else grown)
    elif kind == "out_of_memory":
        if mem is None:
            return options, "its memory request is not known, so there is nothing to grow"
        if policy.max_mem is not None and mem >= policy.max_mem:
            return options, f"it ran out of memory at the most allowed, {policy.max_mem} MB"
        grown = math.ceil(mem * policy.mem_factor)
        options["mem"] = f"{min(grown, policy.max_mem) if policy.max_mem else grown}M"
    elif ENDS[kind].away_from_its_nodes and bad_nodes:
        excluded = [n for n in [options.get("exclude") or manifest.resources.get("exclude"), *bad_nodes] if n]
        options["exclude"] = ",".join(dict.fromkeys(excluded))
    fitted = policy.right_size(usage.peak_mem_mb if usage else None)
    if kind != "out_of_memory" and fitted is not None and (mem is None or fitted < mem):
        options["mem"] = f"{fitted}M"
    return options, ""


def current_mem(before: dict[str, str], manifest: Manifest, usage: Usage | None) -> int | None:
    """What the run's newest job asked for in MB: its own option, else the sweep's, else what sacct says."""
    if "mem" in before:
        return parse_mem_mb(before["mem"])
    if manifest.resources.get("mem_mb"):
        return int(manifest.resources["mem_mb"])
    return math.ceil(usage.req_mem_mb) if usage is not None and usage.req_mem_mb else None


def _manifest_time(manifest: Manifest) -> Minutes:
    return Minutes.parse(manifest.resources.get("time")) or Minutes(1)


def headline(manifest: Manifest, decisions: list[Decision]) -> str:
    done = sum(d.action == DONE for d in decisions)
    gave_up = sum(d.action == GIVE_UP for d in decisions)
    retried = sum(d.round > 1 for d in decisions)
    last = max((d.round for d in decisions), default=1)
    return (f"sweep {manifest.name}: {done} of {len(decisions)} run(s) finished, {retried} after a retry, "
            f"{gave_up} given up; {last} round(s)")


def summary(manifest: Manifest, decisions: list[Decision]) -> str:
    """The sweep's summary in Markdown: its headline, then each run's ends and requests round by round, final
    state, and each given-up run's error line."""
    ends: dict[int, list[str]] = {}
    asks: dict[int, list[str]] = {}
    for sub in manifest.slurm_submissions():
        for index, life in (sub.previous or {}).items():
            ends.setdefault(int(index), []).append(life.end or life.state)
        for index in sub.indices:
            asks.setdefault(index, []).append(options_text(sub.changes or {})
                                              or ("as launched" if sub.changes is None else "as before"))
    lines = [f"# {headline(manifest, decisions)}", "",
             "| run | round | ends, oldest first | asked, job by job | final |", "| --- | --- | --- | --- | --- |"]
    for d in decisions:
        final = "finished" if d.action == DONE else f"given up: {d.why}" if d.action == GIVE_UP else d.end.kind
        lines.append(f"| {d.row.name} | {d.round} | {', '.join([*ends.get(d.row.index, []), d.end.kind])} | "
                     f"{'; '.join(asks.get(d.row.index, []))} | {final} |")
    given_up = [d for d in decisions if d.action == GIVE_UP]
    if given_up:
        lines += ["", "## Given up", ""]
        lines += [f"- {d.row.name} ({d.row.job_id} {d.row.state.name}, {d.end.kind}): {d.end.line}" for d in given_up]
    return "\n".join(lines) + "\n"


def status_lines(manifest: Manifest, rows: list[Row]) -> tuple[list[str], dict[int, str]]:
    """What `status` says of the retry policy above its table: the round, the heal job, what the policy
    does next (or the summary's headline once it is written); and that next step by run index, for the runs it
    sends again or gives up."""
    policy = RetryPolicy.of(manifest.retry)
    if policy is None:
        return [], {}
    summary_file = manifest.dirs.summary
    if summary_file.exists():
        first = summary_file.read_text(errors="replace").partition("\n")[0].lstrip("# ")
        return [f"retry: done: {first} ({summary_file})"], {}
    job = next(reversed(heal_jobs(manifest)), None)
    state = job_state(job) if job else "none submitted"
    decisions = decide(manifest, rows, {}, policy)
    now = max((d.round for d in decisions), default=1)
    lines = [f"retry: round {now} of at most {1 + policy.rounds}; heal job {job or '-'} {state}"
             + ("; cancelled: nothing more is sent" if manifest.dirs.cancelled.exists() else "")]
    said = {d.row.index: d.said() for d in decisions if d.action in (SEND, GIVE_UP)}
    return lines + [f"  {line}" for line in said.values()], said
