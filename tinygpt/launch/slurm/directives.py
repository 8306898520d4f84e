"""`#SBATCH` lines that sbatch reads back exactly as written: each value whole, no other option.

sbatch does not read its directives with a shell. Its own parser (`_get_argument` in src/sbatch/opt.c)
cuts the text after `#SBATCH` at whitespace unless a quote is open (a backslash before a space does not
keep it), takes a backslash as the escape of the next character even inside quotes (so `shlex.quote`'s
single quotes do not protect one), and an unescaped `#` as the start of a comment (older versions: inside
quotes too). A line ends at its newline; one that holds the word `hetjob` (or `packjob`) starts
another component of a heterogeneous job; an argument is copied into a buffer of BUFSIZ (8192) bytes. So
a value with any of those characters is written in double quotes, with a backslash before each backslash,
double quote and `#`; one holding a line break, NUL, or those words, or too long for that buffer, cannot
be written at all and is refused.

The submitit backend writes its lines itself with `shlex.quote`, whose single quotes sbatch also takes as
quotes; only a backslash inside them still escapes for sbatch, so there a value with a backslash is refused.
"""

from __future__ import annotations

import re

SPECIAL = set('\\"\'#') | set(" \t\v\f\r")  # escapes, quotes, comments and C's isspace() (\n is refused)
ESCAPED = set('\\"#')  # what a backslash must precede inside double quotes (a single quote is literal there)
MAX_BYTES = 4000  # well inside sbatch's 8192-byte argument buffer, with the option's name
HET_WORD = re.compile(r"hetjob|packjob", re.IGNORECASE)  # anywhere on an #SBATCH line (opt.c)


def problem(value: str, backend: str = "sbatch") -> str | None:
    """Why `value` cannot go on an `#SBATCH` line as it is, or None when it can."""
    if "\n" in value or "\x00" in value:
        return "holds a line break or NUL, which an #SBATCH line cannot carry; give one line"
    if HET_WORD.search(value):
        return "holds the word hetjob or packjob, which makes sbatch start another job on that line; reword it"
    if len(value.encode()) > MAX_BYTES:
        return f"is {len(value.encode())} bytes long; sbatch reads at most {MAX_BYTES} bytes of one value"
    if backend == "submitit" and "\\" in value:
        return ("holds a backslash, which sbatch takes as an escape inside the shell quoting the submitit backend "
                "writes; leave it out, or use `backend: sbatch`")
    return None


def encode(value: str) -> str:
    """`value` escaped for sbatch's parser (raises ValueError for one that cannot be written)."""
    why = problem(value)
    if why:
        raise ValueError(f"{value[:60]!r} {why}")
    if not SPECIAL & set(value):
        return value
    return '"' + "".join("\\" + ch if ch in ESCAPED else ch for ch in value) + '"'


def line(name: str, value: str | None) -> str:
    """`#SBATCH --name` for a flag (None), else `#SBATCH --name=VALUE` with the value escaped."""
    return f"#SBATCH --{name}" if value is None else f"#SBATCH --{name}={encode(value)}"


def abbreviates(name: str, options) -> str | None:
    """The option of `options` that sbatch would read `--name` as (it takes any unambiguous prefix of a long
    option, and refuses an ambiguous one: either way such a name cannot be passed through), or None."""
    return next((option for option in sorted(options) if option.startswith(name)), None)
