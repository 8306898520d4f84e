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

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tinygpt.base import durable
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.layout import schema_file
from tinygpt.launch.slurm import limits, slurm_cli
from tinygpt.launch.slurm.live_cluster import LiveCluster, Shape

PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
SCHEMA_LINE = "# yaml-language-server: $schema=../../schemas/profile.schema.json"  # (from hpc_lab/clusters/)
YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}  # plain, YAML reads them otherwise


def new(directory: Path | None, name: str | None, force: bool, login: str | None, ssh_options: Sequence[str]) -> Path:
    """`profile new`: the profile of the Slurm here, or with `login` (USER@HOST) of a login node's over SSH,
    written in `directory` (None: hpc_lab/clusters inside the checkout, else the user's profile folder); its
    path. A LaunchError, and nothing written, for a flag that cannot be, a name taken or a Slurm that does not
    answer."""
    from tinygpt.launch.layout import CHECKOUT, user_profile_dir

    if directory is None and CHECKOUT is not None and Path.cwd().resolve().is_relative_to(CHECKOUT):
        directory = CHECKOUT / "hpc_lab" / "clusters"
    directory = directory or user_profile_dir()
    if ssh_options and login is None:
        raise LaunchError("--ssh-option: only with --login USER@HOST (the options of the SSH connection to it)")
    if login is not None:
        return write_over_ssh(directory, login, ssh_options, name, force)
    return write(directory, name, force)


def write(directory: Path, name: str | None, force: bool) -> Path:
    """Ask Slurm, write `<directory>/<name or ClusterName>.yaml`, return its path. Nothing is written when Slurm
    does not answer, the name is not a profile name, or the file exists (without `force`)."""
    import yaml

    from tinygpt.launch.spec.profiles import from_data

    if name is not None:  # (its own flags first: a mistake in them is said without asking Slurm)
        refuse_name(directory, name, force)
    cluster = LiveCluster.ask()
    if cluster is None:
        raise LaunchError(f"profile new: {slurm_cli.no_answer()}; run it on a login node of the cluster; nothing "
                          f"was written")
    name = name or cluster.name or "cluster"
    refuse_name(directory, name, force)
    path = directory / f"{name}.yaml"
    text, schema = render(name, cluster), schema_file("profile")
    text = text.replace(SCHEMA_LINE, "" if schema is None else
                        SCHEMA_LINE.replace("../../schemas/profile.schema.json", os.path.relpath(schema, directory)))
    from_data(yaml.safe_load(text), path)  # (what is written passes the schema a launch reads it with)
    durable.write(path, text)
    return path


def write_over_ssh(directory: Path, address: str, ssh_options: Sequence[str], name: str | None, force: bool) -> Path:
    """`profile new --login USER@HOST`: the profile that the login node's Slurm describes, with the login:
    section that reaches it, written here (its own flags checked first, nothing written when Slurm does not
    answer there)."""
    import yaml

    from tinygpt.base import schema
    from tinygpt.launch.remote.laptop import connect, fetch, launcher_python, launcher_there, send_code
    from tinygpt.launch.spec.profiles import Login, from_data

    if name is not None:
        refuse_name(directory, name, force)
    user, at, host = address.rpartition("@")
    if bad := [o for o in ssh_options if "=" not in o]:
        raise LaunchError(f"--ssh-option: {bad[0]!r} is not KEY=VALUE; give e.g. ProxyJump=gateway.example.edu")
    options = dict(o.split("=", 1) for o in ssh_options)
    login = schema.validate(Login, {"host": host, **({"user": user} if at else {}), "options": options}, "--login",
                            LaunchError)
    conn, hello = connect(login)
    code, _ = send_code(conn)
    folder = f"profiles-new/{hashlib.sha256(os.urandom(16)).hexdigest()[:12]}"
    named = ["--name", name] if name else []
    env, words = launcher_there(conn, launcher_python(conn, hello), code)
    conn.call("run", conn.root, *env, "--", *words, "profile", "new", "--force", "--dir", f"{conn.root}/{folder}",
              *named)  # (its one line is for there: not shown)
    (written,) = fetch(conn, [f"{folder}/*.yaml"]).items()
    path = directory / Path(written[0]).name
    refuse_name(directory, path.stem, force)
    text = written[1].decode() + "\n# How a laptop reaches the login node (launch.py ... --cluster " + path.stem + \
        " from there)\n" + yaml.safe_dump({"login": login.model_dump(exclude_defaults=True)}, sort_keys=False)
    from_data(yaml.safe_load(text), path)  # (as it will be read: a mistake is said before the file is written)
    directory.mkdir(parents=True, exist_ok=True)
    durable.write(path, text)
    return path


def refuse_name(directory: Path, name: str, force: bool) -> None:
    from tinygpt.launch.spec.profiles import PROFILE_NAME

    if not PROFILE_NAME.fullmatch(name):
        raise LaunchError(f"--name: {name!r} is not a profile name; use letters, digits, '.', '_' and '-'")
    if (directory / f"{name}.yaml").exists() and not force:
        raise LaunchError(f"profile new: {directory / f'{name}.yaml'} exists; nothing was written. Give another "
                          f"--name, or --force to write over it")


def render(name: str, cluster: LiveCluster) -> str:
    """The profile's YAML, with a comment on every value that was guessed and on what could not be learnt."""
    config = cluster.config
    usable = [n for n in cluster.partitions if cluster.refusal(n) is None]
    if not usable:
        raise LaunchError("profile new: Slurm lists no partition that is up and open to you; nothing was written")
    default = cluster.default_partition if cluster.default_partition in usable else usable[0]
    shapes = {n: cluster.shapes(n) for n in usable}
    node = shapes[default].most_common(1)[0][0] if shapes[default] else (None, None, 0, None)
    lines = [
        SCHEMA_LINE,
        f"# Written by `python launch.py profile new` from what Slurm said about cluster {config.get('ClusterName')}.",
        "# Check the values marked as guesses, and fill in what Slurm could not say (at the end).",
        f"name: {_scalar(name)}",
        f"cluster_name: {_scalar(config.get('ClusterName', name))}   # ClusterName: `--cluster auto` finds this file",
        *_account_lines(cluster),
        "partitions:",
        *(_partition_line(n, cluster.partitions[n], shapes[n], node) for n in usable),
        *(f"  # not here: {n} ({cluster.refusal(n)})" for n in cluster.partitions if n not in usable),
        f"default_partition: {_scalar(default)}"
        + ("   # Slurm's default partition" if default == cluster.default_partition
           else "   # a guess: Slurm names no default partition open to you"),
        *_node_lines(node, default, shapes[default]),
        f"max_array_size: {config.get('MaxArraySize', '1001')}" + ("" if config.get("MaxArraySize")
                                                                  else "   # a guess: Slurm did not say"),
        f"# preemption: {config.get('PreemptType', 'preempt/none')}, mode {config.get('PreemptMode', 'OFF')}"
        + "".join(f"; {n} {cluster.partitions[n]['PreemptMode']}" for n in usable
                  if cluster.partitions[n].get("PreemptMode") not in (None, config.get("PreemptMode"))),
        "signal: USR2                   # a guess: the signal the trainers save on before the time limit",
        "signal_lead_s: 120             # a guess: seconds before the limit; time enough to save a checkpoint",
        "# Slurm cannot say these; fill them in:",
        "# modules: [cuda/12.1, python/3.11]   # `module load` lines (`module avail` lists them)",
        "# setup: ['source \"$HOME/venvs/tinygpt/bin/activate\"']   # shell lines run first on the nodes",
        "# container: {runtime: apptainer, image: /path/to/image.sif}   # run the trainer in an image",
    ]
    return "\n".join(lines) + "\n"


def _partition_line(name: str, p: dict[str, str], shapes: Counter, node: Shape) -> str:
    max_time = "INFINITE" if p.get("MaxTime", "UNLIMITED") == "UNLIMITED" else p["MaxTime"]
    total = p.get("TotalNodes", "")
    max_nodes = total if p.get("MaxNodes", "UNLIMITED") == "UNLIMITED" else p["MaxNodes"]
    fields = [f"max_time: {_scalar(max_time)}"] + ([f"max_nodes: {max_nodes}"] if max_nodes.isdigit() else [])
    notes = [f"{total} node(s)"] if total else []
    notes += [f"{count} x {_describe(other)}" for other, count in shapes.most_common() if other != node]
    return f"  {_scalar(name)}: {{{', '.join(fields)}}}   # {'; '.join(notes) or 'no node listed'}"


def _node_lines(node: Shape, default: str, shapes: Counter) -> list[str]:
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


def _account_lines(cluster: LiveCluster) -> list[str]:
    accounts, max_wall = cluster.accounts, cluster.qos_max_wall
    if accounts is None:
        return ["# account: ...   # sacctmgr did not answer (no accounting here?): the account your jobs are "
                "charged to, if any"]
    default, rows = accounts
    lines = [f"account: {_scalar(default)}   # your default account (of {', '.join(r['Account'] for r in rows)})"
             if default else "# account: ...   # accounting names no default account for you"]
    default_qos = cluster.default_qos(None)
    allowed = [q + (f" (MaxWall {max_wall[q]})" if (max_wall or {}).get(q) else "")
               for q in sorted({q for r in rows for q in r.get("QOS", "").split(",") if q})]
    if default_qos:
        lines.append(f"qos: {_scalar(default_qos)}   # your default QOS (allowed: {', '.join(allowed)})")
    else:
        lines.append(f"# qos: ...   # no default QOS; allowed: {', '.join(allowed) or 'none listed'}")
    found = limits.read(default, [default_qos] if default_qos else [])
    said = "accounting did not say" if found is None else ", ".join(map(str, found)) or "none"
    return [*lines, f"# queue limits on your jobs: {said} (a launch reads them anew; a sweep over them goes out in "
                    f"waves)"]


def _describe(node: Shape) -> str:
    cpus, mem, gpus, gpu_type = node
    return ", ".join([*([f"{gpus} x {gpu_type or 'GPU'}"] if gpus else []), f"{cpus} CPUs", f"{mem}M"])


def _scalar(value: str) -> str:
    """A YAML scalar for `value`: plain where YAML reads it back as this text, else double-quoted."""
    return value if PLAIN.fullmatch(value) and value.lower() not in YAML_WORDS else json.dumps(value)
