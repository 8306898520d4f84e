"""The launcher's errors, one family: every refusal is a LaunchError, printed without a traceback and ended with
its `exit_status`; the library (`tinygpt.launch.api`) raises the same ones with the same messages."""

from __future__ import annotations

from tinygpt.base.errors import ProblemsError

TRY_AGAIN = 75  # sysexits' EX_TEMPFAIL: nothing was done, and the same command may work later (scripts retry on it)


class LaunchError(ProblemsError):
    """One or more problems; `problems` holds one message each, naming the field and the fix."""

    exit_status = 1


class SlurmAway(LaunchError):
    """The controller or accounting did not answer: nothing was done, and the same command may work in a minute."""

    exit_status = TRY_AGAIN


class LoginAway(LaunchError):
    """The cluster's login node did not answer over SSH: nothing was sent; it may be back later."""

    exit_status = TRY_AGAIN


class SshRefused(LaunchError):
    """SSH refused the connection to the login node (a key, a host name): it will not work until fixed."""

    exit_status = 255  # (ssh's own, for its failures)


class SweepBusy(LaunchError):
    """Another command holds the sweep's lock."""


class WaitTimeout(LaunchError):
    """A sweep's runs had not all ended when a wait for them ran out; they go on."""
