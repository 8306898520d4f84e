"""How sbatch reads the `#SBATCH` lines of a batch script, written from its rules (src/sbatch/opt.c,
`_opt_batch_script` and `_get_argument`): the oracle the tests hold our scripts against.

The script is split at newlines, and sbatch stops at the first line that is neither blank nor a comment.
Of each line that starts with `#SBATCH`, the rest is cut into arguments: whitespace (C's isspace) ends an
argument unless a quote is open, even right after a backslash, except that from Slurm 24.05 on a backslash
keeps the space (' ', only) after it in the argument; a backslash makes the next character literal, inside
quotes too; a single or double quote opens a quote that only the same character closes
(both dropped); an unescaped `#` outside quotes, or an empty argument, ends the line; an unclosed quote or
an argument that starts with `:` is fatal. A line holding the word `hetjob` (or the older `packjob`)
anywhere starts the next component of a heterogeneous job.
"""

from __future__ import annotations

C_SPACE = " \t\n\v\f\r"


class Fatal(Exception):
    """sbatch would stop with an error on this line."""


RELEASES = ((22, 5), (24, 11))  # the Slurm releases the local cluster brings up (hpc_lab/local_cluster/up.sh)
KEEPS_ESCAPED_SPACE = (24, 5)  # the first release whose _get_argument keeps a space after a backslash


def arguments(text: str, release: tuple[int, int] = RELEASES[0]) -> list[str]:
    """The arguments the sbatch of `release` (major, minor) takes from the text after `#SBATCH`."""
    args, i = [], 0
    while True:
        while i < len(text) and text[i] in C_SPACE:
            i += 1
        if i >= len(text):
            return args
        if text[i] == ":":
            raise Fatal(f"unexpected `:` in {text!r}")
        arg, escaped, quote = [], False, None
        while i < len(text) and (quote or text[i] not in C_SPACE):
            ch = text[i]
            i += 1
            if escaped:
                escaped = False
            elif ch == "\\":
                if release >= KEEPS_ESCAPED_SPACE and text[i:i + 1] == " ":
                    arg.append(" ")
                    i += 1
                else:
                    escaped = True
                continue
            elif quote:
                if ch == quote:
                    quote = None
                    continue
            elif ch in "\"'":
                quote = ch
                continue
            elif ch == "#":
                return args + ["".join(arg)] if arg else args
            arg.append(ch)
        if quote:
            raise Fatal(f"unmatched {quote} in {text!r}")
        if not arg:  # nothing copied: sbatch's loop stops at the first NULL
            return args
        args.append("".join(arg))


def directives(script: str, release: tuple[int, int] = RELEASES[0]) -> list[str]:
    """Every argument of the script's `#SBATCH` lines, in order, as the sbatch of `release` would hand them to
    getopt."""
    found = []
    for line in script.split("\n")[1:]:  # (the first line is the #! line)
        if line.startswith("#SBATCH"):
            assert "hetjob" not in line.lower() and "packjob" not in line.lower(), f"a new het component: {line!r}"
            found += arguments(line[len("#SBATCH"):], release)
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return found


def options(script: str, release: tuple[int, int] = RELEASES[0]) -> dict[str, str | None]:
    """{long option: value, None for a flag} from the script's directives (fails on anything else)."""
    found: dict[str, str | None] = {}
    for arg in directives(script, release):
        assert arg.startswith("--"), f"not a long option: {arg!r}"
        name, eq, value = arg[2:].partition("=")
        assert name not in found, f"--{name} given twice"
        found[name] = value if eq else None
    return found
