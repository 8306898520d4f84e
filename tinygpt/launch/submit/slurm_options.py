"""What a sweep's jobs ask of Slurm, worked out once for both backends (sbatch scripts and submitit).

From a run's resources and the cluster profile: the `#SBATCH` options (long names, values unquoted;
each backend quotes them as it writes them), the shell lines that set the node up (modules, variables,
the profile's own lines) and the command prefix that runs the trainer inside the profile's container.
The option names the backends add themselves (job name, array, output, open mode) are not here.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from tinygpt.launch.slurm import directives
from tinygpt.launch.spec.resources import SOURCE

if TYPE_CHECKING:
    from tinygpt.launch.spec.profiles import Profile
    from tinygpt.launch.spec.resources import Resources


def sbatch_options(r: Resources, prof: Profile, workdir: Path) -> dict[str, str | None]:
    """{long option: value} for `#SBATCH --option=value` lines; None marks a flag (`--requeue`)."""
    opts: dict[str, str | None] = {
        "nodes": str(r.nodes),
        "ntasks-per-node": str(r.tasks_per_node),
        "cpus-per-task": str(r.cpus_per_task),
        "time": str(r.time),
        "requeue": None,
        # No `B:`: the signal goes to the srun steps (the trainers), not only to the batch shell.
        "signal": f"{prof.signal}@{prof.signal_lead_s}",
        "chdir": str(workdir),
    }
    if r.mem_mb is not None:  # (never 0, which Slurm reads as a whole node's: refused when the spec is read)
        opts["mem"] = f"{r.mem_mb}M"
    opts.update(r.named)  # (spec/resources.NAMED_OPTIONS: each key is sbatch's option)
    if r.gpus_per_node:
        if prof.gpu_request == "gres":
            kind = f"gpu:{prof.node.gpu_type}" if prof.node.gpu_type else "gpu"
            opts["gres"] = f"{kind}:{r.gpus_per_node}"
        elif prof.gpu_request == "gpus-per-node":
            opts["gpus-per-node"] = str(r.gpus_per_node)
    opts.update(r.sbatch_extra)  # checked in passthrough.py: never an option set above
    return opts


def unwritable(sweep) -> list[str]:
    """Problems with the values of a sweep's `#SBATCH` lines that cannot reach sbatch as they are
    (directives.py), each naming its field: checked before anything is written."""
    options = {**sbatch_options(sweep.resources, sweep.profile, sweep.workdir), "job-name": sweep.name,
               "output": str(sweep.dirs.logs)}
    problems = []
    for name, value in sorted(options.items()):
        why = None if value is None else directives.problem(value, sweep.backend)
        if why:
            field = SOURCE.get(name, f"sbatch_options.{name} (the spec's or the profile's)")
            problems.append(f"{field}: {value[:60]!r} (for --{name}) {why}")
    return problems


# A setup line that fails ends the job there, naming the line, instead of training in an environment nobody
# asked for. Exit status 1: the job ends FAILED and is not requeued for it.
SETUP_GUARD = ("trap 'echo \"tinygpt: setup failed (exit status $?): $BASH_COMMAND; fix the profile'\"'\"'s "
               "modules, env or setup\" >&2; exit 1' ERR")


def setup_lines(prof: Profile, pythonpath: str) -> list[str]:
    """Shell lines run on the node before the trainer: modules, variables, the profile's own lines (written
    by the cluster's admin or user, taken as they are), and the project on PYTHONPATH; the first that fails
    ends the job with a line that names it."""
    q = shlex.quote
    lines = [SETUP_GUARD]
    lines += [f"module load {q(m)}" for m in prof.modules]
    lines += [f"export {k}={q(v)}" for k, v in sorted(prof.env.items())]
    lines += list(prof.setup)
    lines.append(f"export PYTHONPATH={q(pythonpath)}${{PYTHONPATH:+:$PYTHONPATH}}")
    lines.append("trap - ERR")
    return lines


def container_prefix(prof: Profile) -> str:
    """`apptainer exec --nv IMAGE ` (quoted, with a trailing space) when the profile runs the trainer in a
    container, else ''."""
    if prof.container is None:
        return ""
    c, q = prof.container, shlex.quote
    args = "".join(f"{q(a)} " for a in shlex.split(c.args))
    return f"{q(c.runtime)} exec {args}{q(c.image)} "
