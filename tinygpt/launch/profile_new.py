"""`launch.py profile new`: a cluster profile written from what the reachable Slurm says about itself.

    scontrol show config       ClusterName, MaxArraySize, the preemption mode
    scontrol show partition    each partition: its time limit, node count, who may use it, whether it is up
    scontrol show node         each node: CPUs, memory, GPUs (Gres=gpu:TYPE:N), its partitions
    sacctmgr show assoc/user   the user's default account and QOS, where accounting answers

Every value Slurm did not give (the signal's lead time, what to load or activate on the nodes) is a comment
that says so, and the file is checked with the profile schema before it is written. A profile that exists
is never overwritten without --force.
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import re
from collections import Counter
from pathlib import Path

from tinygpt import durable

from . import slurm_cli
from .errors import LaunchError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a profile's name, as `--cluster NAME` finds it
PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
SCHEMA_LINE = "# yaml-language-server: $schema=../../schemas/profile.schema.json"  # (from hpc_lab/clusters/)
YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}  # plain, YAML reads them otherwise


def write(directory: Path, name: str | None, force: bool) -> Path:
    """Ask Slurm, write `<directory>/<name or ClusterName>.yaml`, return its path. Nothing is written when Slurm
    does not answer, the name is not a profile name, or the file exists (without `force`)."""
    from . import json_schema
    from .profiles import from_file

    config = slurm_cli.cluster_config()
    partitions = slurm_cli.scontrol_records("partition")
    nodes = slurm_cli.scontrol_records("node")
    if config is None or partitions is None or nodes is None:
        raise LaunchError("profile new: no Slurm answers here (scontrol show config/partition/node failed); run it "
                          "on a login node of the cluster; nothing was written")
    name = name or config.get("ClusterName") or "cluster"
    if not NAME.fullmatch(name):
        raise LaunchError(f"--name: {name!r} is not a profile name; use letters, digits, '.', '_' and '-'")
    path = directory / f"{name}.yaml"
    if path.exists() and not force:
        raise LaunchError(f"profile new: {path} exists; nothing was written. Give another --name, or --force to "
                          f"write over it")
    text = render(name, config, partitions, nodes, slurm_cli.associations(getpass.getuser()))
    text = text.replace(SCHEMA_LINE, SCHEMA_LINE.replace("../../schemas/profile.schema.json",
                                                         os.path.relpath(json_schema.path("profile"), directory)))
    draft = path.with_name(f".{path.name}.new")
    durable.write(draft, text)
    try:
        from_file(draft)  # (what we write passes the schema a launch reads it with)
    except LaunchError:
        draft.unlink()
        raise
    os.replace(draft, path)
    return path


def render(name: str, config: dict[str, str], partitions: list[dict[str, str]], nodes: list[dict[str, str]],
           accounts: tuple[str | None, list[dict[str, str]]] | None) -> str:
    """The profile's YAML, with a comment on every value that was guessed and on what could not be learnt."""
    usable, left_out = _usable(partitions, accounts)
    if not usable:
        raise LaunchError("profile new: Slurm lists no partition that is up and open to you; nothing was written")
    default = next((p["PartitionName"] for p in usable if p.get("Default") == "YES"), usable[0]["PartitionName"])
    shapes = {p["PartitionName"]: _shapes(nodes, p["PartitionName"]) for p in usable}
    node = shapes[default].most_common(1)[0][0] if shapes[default] else (None, None, 0, None)
    lines = [
        SCHEMA_LINE,
        f"# Written by `python launch.py profile new` from what Slurm said about cluster {config.get('ClusterName')}.",
        "# Check the values marked as guesses, and fill in what Slurm could not say (at the end).",
        f"name: {_scalar(name)}",
        f"cluster_name: {_scalar(config.get('ClusterName', name))}   # ClusterName: `--cluster auto` finds this file",
        *_account_lines(accounts),
        "partitions:",
        *(_partition_line(p, shapes[p["PartitionName"]], node) for p in usable),
        *(f"  # not here: {why}" for why in left_out),
        f"default_partition: {_scalar(default)}"
        + ("   # Slurm's default partition" if any(p.get("Default") == "YES" for p in usable)
           else "   # a guess: Slurm names no default partition"),
        *_node_lines(node, default, shapes[default]),
        f"max_array_size: {config.get('MaxArraySize', '1001')}" + ("" if config.get("MaxArraySize")
                                                                  else "   # a guess: Slurm did not say"),
        f"# preemption: {config.get('PreemptType', 'preempt/none')}, mode {config.get('PreemptMode', 'OFF')}"
        + "".join(f"; {p['PartitionName']} {p['PreemptMode']}" for p in usable
                  if p.get("PreemptMode") not in (None, config.get("PreemptMode"))),
        "signal: USR2                   # a guess: the signal the trainers save on before the time limit",
        "signal_lead_s: 120             # a guess: seconds before the limit; time enough to save a checkpoint",
        "# Slurm cannot say these; fill them in:",
        "# modules: [cuda/12.1, python/3.11]   # `module load` lines (`module avail` lists them)",
        "# setup: ['source \"$HOME/venvs/tinygpt/bin/activate\"']   # shell lines run first on the nodes",
        "# container: {runtime: apptainer, image: /path/to/image.sif}   # run the trainer in an image",
    ]
    return "\n".join(lines) + "\n"


def _usable(partitions: list[dict[str, str]], accounts) -> tuple[list[dict[str, str]], list[str]]:
    """The partitions that are up and open to this user (their groups, their accounts where accounting says),
    and a line on each of the others."""
    groups = _group_names()
    mine = {row["Account"] for row in accounts[1]} if accounts else None
    usable, left_out = [], []
    for p in partitions:
        name = p.get("PartitionName", "?")
        allowed_groups = set(p.get("AllowGroups", "ALL").split(","))
        allowed_accounts = set(p.get("AllowAccounts", "ALL").split(","))
        if not p.get("State", "UP").startswith("UP"):
            left_out.append(f"{name} (State={p.get('State')})")
        elif "ALL" not in allowed_groups and not allowed_groups & groups:
            left_out.append(f"{name} (AllowGroups={p['AllowGroups']}: none of your groups)")
        elif mine is not None and "ALL" not in allowed_accounts and not allowed_accounts & mine:
            left_out.append(f"{name} (AllowAccounts={p['AllowAccounts']}: none of your accounts)")
        else:
            usable.append(p)
    return usable, left_out


def _group_names() -> set[str]:
    names = set()
    for gid in {os.getgid(), *os.getgroups()}:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:  # (a group with no name here)
            continue
    return names


def _shapes(nodes: list[dict[str, str]], partition: str) -> Counter:
    """How many of the partition's nodes have each shape (CPUs, memory MB, GPUs, GPU type)."""
    return Counter(_shape(n) for n in nodes if partition in n.get("Partitions", "").split(","))


def _shape(node: dict[str, str]) -> tuple[int | None, int | None, int, str | None]:
    gpus, gpu_type = 0, None
    for gres in node.get("Gres", "(null)").split(","):  # gpu:a100:4(S:0-1), gpu:2, shard:...
        fields = re.sub(r"\(.*?\)", "", gres).split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            gpus += int(fields[-1])
            gpu_type = fields[1] if len(fields) == 3 else gpu_type
    cpus, mem = node.get("CPUTot", ""), node.get("RealMemory", "")
    return (int(cpus) if cpus.isdigit() else None, int(mem) if mem.isdigit() else None, gpus, gpu_type)


def _partition_line(p: dict[str, str], shapes: Counter, node: tuple) -> str:
    max_time = "INFINITE" if p.get("MaxTime", "UNLIMITED") == "UNLIMITED" else p["MaxTime"]
    total = p.get("TotalNodes", "")
    max_nodes = total if p.get("MaxNodes", "UNLIMITED") == "UNLIMITED" else p["MaxNodes"]
    fields = [f"max_time: {_scalar(max_time)}"] + ([f"max_nodes: {max_nodes}"] if max_nodes.isdigit() else [])
    notes = [f"{total} node(s)"] if total else []
    notes += [f"{count} x {_describe(shape)}" for shape, count in shapes.most_common() if shape != node]
    return f"  {_scalar(p['PartitionName'])}: {{{', '.join(fields)}}}   # {'; '.join(notes) or 'no node listed'}"


def _node_lines(node: tuple, default: str, shapes: Counter) -> list[str]:
    cpus, mem, gpus, gpu_type = node
    note = f"the nodes of {default}" + (f" ({shapes[node]} of {sum(shapes.values())})" if len(shapes) > 1 else "")
    lines = [f"node:   # {note}", f"  gpus: {gpus}"]
    lines += [f"  gpu_type: {_scalar(gpu_type)}"] if gpu_type else []
    lines += [f"  cpus: {cpus}"] if cpus is not None else []
    lines += [f"  mem: {mem}M"] if mem else []
    if gpus and gpu_type:
        lines.append("gpu_request: gres               # --gres=gpu:TYPE:N, as the nodes' Gres spell it")
    elif gpus:
        lines.append("gpu_request: gpus-per-node      # the nodes' GPUs have no type: --gpus-per-node=N")
    else:
        lines.append("gpu_request: none")
    return lines


def _account_lines(accounts: tuple[str | None, list[dict[str, str]]] | None) -> list[str]:
    if accounts is None:
        return ["# account: ...   # sacctmgr did not answer (no accounting here?): the account your jobs are "
                "charged to, if any"]
    default, rows = accounts
    lines = [f"account: {_scalar(default)}   # your default account (of {', '.join(r['Account'] for r in rows)})"
             if default else "# account: ...   # accounting names no default account for you"]
    default_qos = next((r["DefaultQOS"] for r in rows if r.get("Account") == default and r.get("DefaultQOS")), None)
    allowed = sorted({q for r in rows for q in r.get("QOS", "").split(",") if q})
    if default_qos:
        lines.append(f"qos: {_scalar(default_qos)}   # your default QOS (allowed: {', '.join(allowed)})")
    else:
        lines.append(f"# qos: ...   # no default QOS; allowed: {', '.join(allowed) or 'none listed'}")
    return lines


def _describe(shape: tuple) -> str:
    cpus, mem, gpus, gpu_type = shape
    return ", ".join([*([f"{gpus} x {gpu_type or 'GPU'}"] if gpus else []), f"{cpus} CPUs", f"{mem}M"])


def _scalar(value: str) -> str:
    """A YAML scalar for `value`: plain where YAML reads it back as this text, else double-quoted."""
    return value if PLAIN.fullmatch(value) and value.lower() not in YAML_WORDS else json.dumps(value)
