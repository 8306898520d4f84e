"""Who am I? Rank, world size and rendezvous from torchrun, from srun, or a single process.

Detection order:
1. torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
2. Slurm tasks started by srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID): the master is the first
   host of SLURM_JOB_NODELIST and the port is derived from the job id, so two jobs sharing a node do
   not collide (MASTER_ADDR / MASTER_PORT, when set, win);
3. otherwise one process.

A Slurm batch shell itself (SLURM_JOB_ID set, SLURM_STEP_ID unset, one task) counts as one process.

Joining checks itself (`init`): a job on several nodes whose master address is a loopback one is refused
before anything waits (each node would wait for a world of its own), and the join is bounded: each rank
says it has arrived in the rendezvous store, and when the time runs out the message names the master's
address and port and, on rank 0, the ranks that never arrived.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

DEFAULT_PORT_BASE = 20000
ARRIVED = "tinygpt/arrived/{}"  # a rank's key in the rendezvous store: "<its node> <its pid>"
PORT_RANGE = 20000


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    launcher: str = "single"  # "single", "torchrun" or "slurm"
    nodes: int = 1  # how many machines the ranks are spread over

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm host list such as `gpu[001-003,010],cpu7` without scontrol.

    Handles several bracket groups per name (`rack[1-2]-n[01-02]`) and keeps zero padding.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        if not item:
            continue
        expanded = [""]
        for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            if not literal and not group:
                continue
            options = [""]
            if group:
                options = []
                for part in group.split(","):
                    lo, dash, hi = part.partition("-")
                    if dash:
                        width = len(lo)
                        options += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
                    else:
                        options.append(part)
            expanded = [prefix + literal + option for prefix in expanded for option in options]
        hosts.extend(expanded)
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: `scontrol show hostnames`, else our own parser."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10
            )
            if out.returncode == 0 and out.stdout.split():
                return out.stdout.split()[0]
        except (OSError, subprocess.SubprocessError):
            pass
    hosts = expand_nodelist(nodelist)
    if not hosts:
        raise ValueError(f"SLURM_JOB_NODELIST {nodelist!r} names no host")
    return hosts[0]


def port_for_job(job_id: str | int) -> int:
    """A port from the job id: stable for the job (every rank agrees), different for neighbours."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return DEFAULT_PORT_BASE + int(digits) % PORT_RANGE


def detect(environ: dict[str, str] | None = None) -> DistEnv:
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            launcher="torchrun",
            nodes=int(env.get("GROUP_WORLD_SIZE") or
                      int(env["WORLD_SIZE"]) // max(1, int(env.get("LOCAL_WORLD_SIZE") or env["WORLD_SIZE"]))),
        )
    ntasks = int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")) or 1)
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and ntasks > 1:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        job_id = env.get("SLURM_JOB_ID", "0")
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=ntasks,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
            master_port=int(env.get("MASTER_PORT") or port_for_job(job_id)),
            launcher="slurm",
            nodes=int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or 1),
        )
    return DistEnv()


class JoinError(RuntimeError):
    """The ranks could not form their process group: what was wrong and what to check."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine's loopback (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):  # (a name that does not resolve here: the join will say so)
        return False


def check(dist_env: DistEnv) -> None:
    """Refuse, before anything waits, a master address that cannot work for this job."""
    if dist_env.nodes > 1 and is_loopback(dist_env.master_addr):
        raise JoinError(
            f"rank {dist_env.rank} on {socket.gethostname()}: the master address {dist_env.master_addr} is the "
            f"loopback of each machine, but the job spans {dist_env.nodes} nodes, so each would wait for a world "
            f"of its own; set MASTER_ADDR to the first node's address on the cluster network (or leave it unset "
            f"under srun), and check that its name does not resolve to 127.0.x.x in the nodes' /etc/hosts")


def init(dist_env: DistEnv, device: str, timeout_s: float = 600.0, collective_timeout_s: float = 1800.0) -> None:
    """Join the process group (NCCL on CUDA, gloo on CPU), within `timeout_s` or with a JoinError. A collective
    gives up after `collective_timeout_s`: longer than the watchdog's hang_timeout, so that a hung run ends with
    the watchdog's account of it (tinygpt/training/watchdog.py), not with a collective's traceback."""
    if not dist_env.is_distributed:
        return
    import torch
    import torch.distributed as dist

    check(dist_env)
    where = f"{dist_env.master_addr}:{dist_env.master_port}"
    deadline = time.monotonic() + timeout_s
    try:
        store = dist.TCPStore(dist_env.master_addr, dist_env.master_port, dist_env.world_size,
                              is_master=dist_env.is_main, timeout=datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=False)
    except (RuntimeError, OSError) as err:  # (DistStoreError, DistNetworkError: RuntimeErrors)
        raise JoinError(f"rank {dist_env.rank} on {socket.gethostname()}: could not reach the master at {where} "
                        f"within {timeout_s:g} s ({str(err).splitlines()[0][:200]}); check that {dist_env.master_addr} "
                        f"is the first node's address and that the nodes can reach each other on port "
                        f"{dist_env.master_port}") from None
    store.set(ARRIVED.format(dist_env.rank), f"{socket.gethostname()} {os.getpid()}")
    if dist_env.is_main:
        _wait_for_ranks(store, dist_env, deadline, where, timeout_s)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo", store=store,
                                rank=dist_env.rank, world_size=dist_env.world_size,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
    except (RuntimeError, OSError) as err:
        raise JoinError(f"rank {dist_env.rank} on {socket.gethostname()}: the process group at {where} did not "
                        f"form within {timeout_s:g} s ({str(err).splitlines()[0][:200]}); rank 0's log says "
                        f"which ranks never arrived") from None


def arrival(store, rank: int) -> tuple[str, int | None]:
    """(node, pid) that rank `rank` wrote when it arrived; ("node unknown", None) when the store cannot say."""
    try:
        node, _, pid = store.get(ARRIVED.format(rank)).decode().partition(" ")
    except Exception:  # noqa: BLE001 (the store's errors: time-outs, a lost connection)
        return "node unknown", None
    return node, int(pid) if pid.isdigit() else None


def store_client(dist_env: DistEnv, timeout_s: float = 5.0):
    """A new connection to the rendezvous store on rank 0 (the watchdog's: it must not wait for long)."""
    import torch.distributed as dist

    return dist.TCPStore(dist_env.master_addr, dist_env.master_port, None, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)


def _wait_for_ranks(store, dist_env: DistEnv, deadline: float, where: str, timeout_s: float) -> None:
    keys = [ARRIVED.format(r) for r in range(dist_env.world_size)]
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, key in enumerate(keys) if not store.check([key])]
            raise JoinError(f"rank 0 on {socket.gethostname()}: rank(s) {', '.join(map(str, missing))} of "
                            f"{dist_env.world_size} never arrived at the master {where} within {timeout_s:g} s; "
                            f"their own logs say why (they may not have started, or cannot reach {where})")
        time.sleep(0.2)


def teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # Leave together: a rank that tears gloo down while a peer is still finishing (rank 0 writes the
        # sample) can abort in gloo's connection threads ("terminate called without an active exception").
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 (a peer that died already: tear down anyway)
            pass
        dist.destroy_process_group()


def any_rank(flag: bool, device: str) -> bool:
    """True on every rank when `flag` is True on any rank (a collective; plain value when alone)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def mean_over_ranks(value: float, device: str) -> float:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def gather_objects(obj, dist_env: DistEnv) -> list:
    """Every rank's `obj`, on every rank (list indexed by rank)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist_env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def unwrap_ddp(module):
    """The module inside a DistributedDataParallel wrapper (the module itself when it is not wrapped)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return module.module if isinstance(module, DDP) else module
