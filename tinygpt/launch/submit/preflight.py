"""A sweep against the live cluster before anything is submitted: `launch.py check SPEC`, and the first step
of every submission (`--no-check` skips it, and the output says so).

Asked of Slurm: the profile is this cluster's; the partition exists, is up and open to the user; the time
fits its MaxTime and the nodes its size; the GPUs asked for are on its nodes, of the profile's GRES type; the
account and QOS are the user's, and the time fits the QOS's MaxWall (where accounting answers); each job
array's task ids stay below MaxArraySize. Then `sbatch --test-only` of each batch script: Slurm's own
verdict, and its estimate of when the job would start. When Slurm does not answer, nothing is submitted
(the check fails closed); a controller that does not answer is said at once (errors.SlurmAway). With
`placement: soonest`, each of the spec's ways is checked so, and the one Slurm would start first taken
(placement.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tinygpt.launch.console import next_command
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.slurm import limits, slurm_cli
from tinygpt.launch.slurm.live_cluster import LiveCluster
from tinygpt.launch.spec.resources import SOURCE, Minutes
from tinygpt.launch.submit import placement

if TYPE_CHECKING:
    from tinygpt.launch.spec.sweep import Sweep
    from tinygpt.launch.submit.plan import Plan

NOT_CHECKED = ("so the spec cannot be checked against the cluster and nothing was submitted; submit from a login "
               "node of the cluster, or add --no-check to submit without the check")


def before_writing(sweep: Sweep) -> LiveCluster:
    """What can be checked from the spec alone, before a file is written; the cluster as Slurm described it."""
    cluster = LiveCluster.ask()
    if cluster is None:
        raise LaunchError(f"check: {slurm_cli.no_answer()}, {NOT_CHECKED}")
    if sweep.placement:  # (`placement: soonest`: each way checked as the spec is, then Slurm's estimates)
        refused = {i: "; ".join(why) for i, way in enumerate(sweep.placement)
                   if (why := spec_problems(dataclasses.replace(sweep, resources=way.resources), cluster))}
        sweep.resources = placement.soonest(sweep, refused)
    if problems := spec_problems(sweep, cluster):
        raise LaunchError(problems, f"{sweep.spec_path} against cluster {cluster.name}")
    if sweep.retry is not None:  # (the caps the profile did not know, as this cluster says them)
        sweep.retry = sweep.retry.model_copy(update=dict(zip(("max_time", "max_mem"), _retry_caps(sweep, cluster))))
    return cluster


def before_submitting(plan: Plan, cluster: LiveCluster, in_waves: bool = False) -> list[str]:
    """The written scripts: their arrays against MaxArraySize, then `sbatch --test-only` of each (`in_waves`: of
    its first task, as a whole array would be over the queue limits). Slurm's estimates of when each would start;
    a LaunchError naming every problem."""
    problems = array_problems(plan, cluster)
    estimates = []
    for path, *_ in plan.scripts if not problems else []:
        # (a script's first run is its task 0: plan.py starts each part's tasks at its first run)
        ok, said = slurm_cli.sbatch_test_only(str(path), ["--array=0"] if in_waves else [])
        if ok:
            estimates.append(f"{path.name}: {said}")
        elif in_waves and limits.over_a_submit_limit(said):  # (the queue is full now: its runs wait for a wave)
            estimates.append(f"{path.name}: no estimate, as the queue is at its limit now: {said}")
        else:
            problems.append(f"sbatch --test-only {path.name}: Slurm would refuse the job: {said}")
    if problems:
        raise LaunchError(problems, f"{plan.sweep.spec_path} against cluster {cluster.name}")
    return estimates


def spec_problems(sweep: Sweep, cluster: LiveCluster) -> list[str]:
    r, prof = sweep.resources, sweep.profile
    problems = []
    if prof.cluster_name and cluster.name and prof.cluster_name != cluster.name:
        problems.append(f"cluster: profile `{prof.name}` is for cluster `{prof.cluster_name}`, and this Slurm is "
                        f"`{cluster.name}`; use --cluster auto (this cluster's profile), or write one with "
                        f"`{next_command('profile new')}`")
    partition = r.partition or cluster.default_partition
    if partition not in cluster.partitions:
        return [*problems, f"{SOURCE['partition']}: `{partition}` is not a partition of cluster {cluster.name} (it "
                           f"has {', '.join(cluster.partitions)}); name one of those"]
    if why := cluster.refusal(partition):
        problems.append(f"{SOURCE['partition']}: partition `{partition}` is not open to you ({why}); choose "
                        f"another")
    return (problems + _size_problems(sweep, cluster, partition) + _account_problems(sweep, cluster)
            + _retry_problems(sweep, cluster, partition))


def _live_limits(cluster: LiveCluster, partition: str) -> tuple[int | None, int | None]:
    """The partition's MaxTime in minutes and its largest node's memory in MB (None: no limit, not known)."""
    mems = [s[1] for s in cluster.shapes(partition) if s[1]]
    return Minutes.limit(cluster.partitions[partition].get("MaxTime", "UNLIMITED")), max(mems, default=None)


def _retry_problems(sweep: Sweep, cluster: LiveCluster, partition: str) -> list[str]:
    """The retry policy's caps against what the partition gives."""
    policy, (max_time, max_mem) = sweep.retry, _live_limits(cluster, partition)
    problems = []
    if policy is not None and policy.max_time and max_time and policy.max_time > max_time:
        problems.append(f"retry.max_time: {policy.max_time} is over partition {partition}'s MaxTime "
                        f"{max_time}; ask for at most that")
    if policy is not None and policy.max_mem and max_mem and policy.max_mem > max_mem:
        problems.append(f"retry.max_mem: {policy.max_mem} MB is more than the largest node of partition {partition} "
                        f"holds ({max_mem} MB); ask for at most that")
    return problems


def _retry_caps(sweep: Sweep, cluster: LiveCluster) -> tuple[int | None, int | None]:
    partition = sweep.resources.partition or cluster.default_partition
    live = _live_limits(cluster, partition)
    return sweep.retry.max_time or live[0], sweep.retry.max_mem or live[1]


def _size_problems(sweep: Sweep, cluster: LiveCluster, partition: str) -> list[str]:
    r, prof, p = sweep.resources, sweep.profile, cluster.partitions[partition]
    problems = []
    limit = Minutes.limit(p.get("MaxTime", "UNLIMITED"))
    if limit is not None and r.time > limit:
        problems.append(f"resources.time: {r.time} is over partition {partition}'s MaxTime {p['MaxTime']}; ask for "
                        f"at most {p['MaxTime']} (a run stopped at its limit resumes in its next job)")
    sizes = [int(v) for v in (p.get("MaxNodes", ""), p.get("TotalNodes", "")) if v.isdigit()]
    most = min(sizes, default=None)
    if most is not None and r.nodes > most:
        problems.append(f"resources.nodes: {r.nodes} is more than partition {partition} gives one job ({most}); ask "
                        f"for at most {most}")
    if r.gpus_per_node:
        shapes = [s for s in cluster.shapes(partition) if s[2]]
        wanted = prof.node.gpu_type if prof.gpu_request == "gres" else None
        types = sorted({s[3] for s in shapes if s[3]})
        fitting = [s[2] for s in shapes if wanted in (None, s[3])]
        if not shapes:
            problems.append(f"resources.gpus_per_node: {r.gpus_per_node}, and the nodes of partition {partition} have "
                            f"no GPU; set gpus_per_node: 0, or choose a partition with GPUs")
        elif not fitting:
            problems.append(f"node.gpu_type (profile {prof.name}): `{wanted}` is not a GPU type on partition "
                            f"{partition}'s nodes (they have {', '.join(types) or 'untyped GPUs'}); set node.gpu_type "
                            f"to one of those, or choose the partition that has {wanted}")
        elif max(fitting) < r.gpus_per_node:
            problems.append(f"resources.gpus_per_node: {r.gpus_per_node} is more than a node of partition {partition} "
                            f"holds ({max(fitting)}); ask for at most {max(fitting)}, and more nodes")
    return problems


def _account_problems(sweep: Sweep, cluster: LiveCluster) -> list[str]:
    r, mine = sweep.resources, cluster.my_accounts()
    if mine is None:  # (no accounting: Slurm's sbatch --test-only still judges)
        return []
    account, qos = r.named.get("account"), r.named.get("qos")
    if account and account not in mine:
        return [f"{SOURCE['account']}: `{account}` is not one of your accounts "
                f"({', '.join(sorted(mine)) or 'none'}); name one of those"]
    allowed = cluster.allowed_qos(account)
    if qos and allowed is not None and qos not in allowed:
        return [f"{SOURCE['qos']}: `{qos}` is not a QOS you may use with account "
                f"{account or cluster.accounts[0]} ({', '.join(sorted(allowed)) or 'none'}); name one of those"]
    qos = qos or cluster.default_qos(account)
    wall = (cluster.qos_max_wall or {}).get(qos or "", "")
    limit = Minutes.limit(wall) if wall else None
    if limit is not None and r.time > limit:
        return [f"resources.time: {r.time} is over QOS {qos}'s MaxWall {wall}; ask for at most {wall}, or another "
                f"QOS ({SOURCE['qos']})"]
    return []


def array_problems(plan: Plan, cluster: LiveCluster) -> list[str]:
    """Task ids must stay below MaxArraySize (plan.py splits at Slurm's own when the profile is this cluster's)."""
    limit = cluster.config.get("MaxArraySize", "")
    problems = []
    for path, _, offset, indices in plan.scripts if limit.isdigit() else []:
        top = (indices[-1] - offset) // plan.sweep.pack  # the task of its last run (Submission.task_of)
        if top >= int(limit):
            problems.append(f"max_array_size (profile {plan.sweep.profile.name}): {path.name}'s task ids reach {top}, "
                            f"and this cluster's MaxArraySize is {limit} (ids must stay below it); set max_array_size: "
                            f"{limit} in the profile, and the sweep is split into arrays that fit")
    return problems
