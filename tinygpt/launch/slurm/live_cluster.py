"""What the reachable Slurm says about itself, asked once: its config, partitions, nodes and the user's
accounts, and what follows from them (which partitions the user may use, what the nodes of one hold).
Read by `launch.py profile new` (profile_new.py) and `launch.py check` (submit/preflight.py).
"""

from __future__ import annotations

import getpass
import grp
import os
import re
from collections import Counter
from dataclasses import dataclass

from tinygpt.launch.slurm import slurm_cli

# A node's shape: (CPUs, memory in MB, GPUs, the GPUs' GRES type or None)
Shape = tuple[int | None, int | None, int, str | None]


@dataclass(frozen=True)
class LiveCluster:
    config: dict[str, str]  # scontrol show config
    partitions: dict[str, dict[str, str]]  # scontrol show partition, by name, in Slurm's order
    nodes: list[dict[str, str]]  # scontrol show node
    accounts: tuple[str | None, list[dict[str, str]]] | None  # (default account, associations); None: no answer
    qos_max_wall: dict[str, str] | None = None  # {QOS: MaxWall, '' for none}; None: accounting did not answer

    @classmethod
    def ask(cls) -> LiveCluster | None:
        """None when scontrol does not answer (accounting may not: then `accounts` is None); SlurmAway at once
        when the controller does not."""
        slurm_cli.require_controller()
        if (config := slurm_cli.cluster_config()) is None:
            return None
        if (partitions := slurm_cli.scontrol_records("partition")) is None:
            return None
        if (nodes := slurm_cli.scontrol_records("node")) is None:
            return None
        return cls(config, {p.get("PartitionName", "?"): p for p in partitions}, nodes,
                   slurm_cli.associations(getpass.getuser()), slurm_cli.qos_max_wall())

    @property
    def name(self) -> str | None:
        return self.config.get("ClusterName")

    @property
    def release(self) -> str:
        """The controller's Slurm release ("24.11.5"), as `scontrol show config` says it."""
        return self.config.get("SLURM_VERSION", "of an unknown release")

    @property
    def default_partition(self) -> str | None:
        return next((n for n, p in self.partitions.items() if p.get("Default") == "YES"), None)

    def my_accounts(self) -> set[str] | None:
        return {row["Account"] for row in self.accounts[1]} if self.accounts else None

    def _associations(self, account: str | None) -> list[dict[str, str]] | None:
        """The user's associations with `account` (their default account when None); None: not known."""
        if not self.accounts:
            return None
        account = account or self.accounts[0]
        return [row for row in self.accounts[1] if row.get("Account") == account]

    def allowed_qos(self, account: str | None) -> set[str] | None:
        """The QOS the user may use with `account` (their default account when None); None: not known."""
        rows = self._associations(account)
        return None if rows is None else {q for row in rows for q in row.get("QOS", "").split(",") if q}

    def default_qos(self, account: str | None) -> str | None:
        """The QOS a job of `account` (the user's default account when None) gets when it names none."""
        return next((row["DefaultQOS"] for row in self._associations(account) or [] if row.get("DefaultQOS")), None)

    def refusal(self, name: str) -> str | None:
        """Why the user may not submit to partition `name` (it is down, closed to their groups or accounts)."""
        p = self.partitions[name]
        groups = set(p.get("AllowGroups", "ALL").split(","))
        accounts = set(p.get("AllowAccounts", "ALL").split(","))
        mine = self.my_accounts()
        if not p.get("State", "UP").startswith("UP"):
            return f"State={p.get('State')}"
        if "ALL" not in groups and not groups & _group_names():
            return f"AllowGroups={p['AllowGroups']}: none of your groups"
        if mine is not None and "ALL" not in accounts and not accounts & mine:
            return f"AllowAccounts={p['AllowAccounts']}: none of your accounts"
        return None

    def shapes(self, partition: str) -> Counter[Shape]:
        """How many of the partition's nodes have each shape."""
        return Counter(shape(n) for n in self.nodes if partition in n.get("Partitions", "").split(","))


def shape(node: dict[str, str]) -> Shape:
    gpus, gpu_type = 0, None
    for gres in node.get("Gres", "(null)").split(","):  # gpu:a100:4(S:0-1), gpu:2, shard:...
        fields = re.sub(r"\(.*?\)", "", gres).split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            gpus += int(fields[-1])
            gpu_type = fields[1] if len(fields) == 3 else gpu_type
    cpus, mem = node.get("CPUTot", ""), node.get("RealMemory", "")
    return (int(cpus) if cpus.isdigit() else None, int(mem) if mem.isdigit() else None, gpus, gpu_type)


def _group_names() -> set[str]:
    names = set()
    for gid in {os.getgid(), *os.getgroups()}:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:  # (a group with no name here)
            continue
    return names
