"""The base of the user-facing error types: one or more problems, each naming the field and the fix."""

from __future__ import annotations

import errno


class ProblemsError(Exception):
    """One or more problems; `problems` holds one message each. Printed without a traceback."""

    def __init__(self, problems: list[str] | str, source: str | None = None):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = head + self.problems[0]
        else:
            text = head + f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)


_FILESYSTEM = {  # errno -> (the cause in words, the fix)
    errno.ENOSPC: ("no space left on the device", "free space on it"),
    errno.EDQUOT: ("the disk quota is used up", "free space within your quota (or ask for more)"),
    errno.EROFS: ("the filesystem is read-only", "use a directory on a writable filesystem"),
    errno.EACCES: ("permission denied", "check the owner and permissions (ls -ld), or use a directory of your own"),
    errno.EPERM: ("not permitted", "check the owner and permissions (ls -ld), or use a directory of your own"),
}
FULL = (errno.ENOSPC, errno.EDQUOT)  # refusals that pass once space is freed


def filesystem_message(err: OSError) -> str:
    """One plain line for the filesystem's refusal of a read or write: the path, the cause, the fix."""
    cause, fix = _FILESYSTEM.get(err.errno, (err.strerror or str(err), "check the path"))
    return f"{shown_path(err.filename) if err.filename else 'a file'}: {cause}; {fix}"


def shown_path(path: object, most: int = 200) -> str:
    """A path as a message shows it: whole up to `most` characters, else its two ends around `...`."""
    text = str(path)
    return text if len(text) <= most else f"{text[:most // 2]}...{text[-most // 2:]}"


def not_utf8(argv: list[str]) -> list[str]:
    """One problem per command-line argument that is not UTF-8 text (bytes Python could not decode arrive as lone
    surrogates): every value ends up in a UTF-8 file or script. Named by its option where it is one's value."""
    problems = []
    for i, arg in enumerate(argv):
        try:
            arg.encode()
        except UnicodeEncodeError:
            option, eq, _ = arg.partition("=")
            named = option if eq and option.startswith("-") else argv[i - 1] if i and argv[i - 1].startswith("-") \
                else f"argument {i + 1}"
            shown = arg.encode(errors="surrogateescape").decode(errors="backslashreplace")
            problems.append(f"{named}: {shown!r} holds bytes that are not UTF-8 text; give it in UTF-8")
    return problems


def blank_arguments(actions: list, args: object, keep: tuple[str, ...] = ()) -> list[str]:
    """One problem per option or argument (argparse's `actions`, as parsed into `args`) given as an empty or blank
    text: it would read as `.` (a path) or as the default, not as what the user meant. `keep`: the destinations
    where a blank text is a value."""
    return [f"{a.option_strings[-1] if a.option_strings else a.dest}: is empty; give a value"
            + ("" if a.required else ", or leave the option out for its default")
            for a in actions if a.dest not in keep and isinstance(value := getattr(args, a.dest, None), str)
            and not value.strip()]
