"""Every login shell a site may give (sh, bash, zsh, fish, tcsh, csh): the laptop's commands reach the login
node through each alike. Each shell has a user of its own on the local cluster's login node (lib.sh's
LOGIN_OTHERS), whose startup file prints a banner on stdout and stderr, as many sites' do (dash reads none when
it runs a command): a round trip (connect, one command, Ctrl-C) under each, and the whole laptop flow under tcsh
and fish, the two whose syntax is furthest from sh's."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.laptop import (
    home_there,
    laptop_for,
    on_laptop,
    on_login,
    watch_interrupted_then_cancelled,
    write_spec,
)
from tests.support.processes import python_env
from tests.support.slurm import unique_name

pytestmark = [pytest.mark.slurm(needs=["login"]), pytest.mark.shares_cluster]

USERS = {"sh": "tgsh", "bash": "tgbash", "zsh": "tgzsh", "fish": "tgfish", "tcsh": "tgtcsh", "csh": "tgcsh"}
BANNER = "Welcome to the login node"  # (on stdout; "maintenance on Friday" on stderr)
STARTUP = {  # the file each shell reads when sshd runs a command with it, and a banner in its syntax
    "bash": (".bashrc", 'echo "{banner}"; echo "maintenance on Friday" >&2\n'),
    "zsh": (".zshenv", 'echo "{banner}"; echo "maintenance on Friday" >&2\n'),
    "fish": (".config/fish/config.fish", 'echo "{banner}"; echo "maintenance on Friday" >&2\n'),
    "tcsh": (".tcshrc", 'echo "{banner}"\necho "maintenance on Friday" > /dev/stderr\n'),
    "csh": (".cshrc", 'echo "{banner}"\necho "maintenance on Friday" > /dev/stderr\n'),
}
# Words a shell would read specially, each to arrive as it left.
WORDS = ["$(touch pwned)", "`touch pwned`", "; touch pwned", "'", '"', "!!", "a\nb", "~", "*", "{a,b}", "%1",
         "x" * 2000]
ECHO_AND_WAIT = ("import json, signal, sys, time; signal.signal(signal.SIGINT, lambda *_: sys.exit(130)); "
                 "print(json.dumps(sys.argv[1:]), flush=True); time.sleep(600)")
# (Ctrl-C handled as the command line does it: a suite started in the background by a non-interactive shell, as CI
# may be, passes SIGINT on ignored, and Python keeps an ignored SIGINT ignored)
STREAM = """import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from tinygpt.launch.remote import laptop
from tinygpt.launch.spec import profiles
conn, _ = laptop.connect(profiles.from_file(sys.argv[1]).login)
sys.exit(conn.stream("run", conn.root, "--", "python3", "-c", *sys.argv[2:]))
"""


def with_banner(shell: str) -> None:
    user = USERS[shell]
    if shell not in STARTUP:
        return
    name, text = STARTUP[shell]
    path = home_there(user) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.format(banner=f"{BANNER} ({shell})"))
    for p in (path, *[q for q in path.parents if q.is_relative_to(home_there(user)) and q != home_there(user)]):
        os.chown(p, home_there(user).stat().st_uid, home_there(user).stat().st_gid)


@pytest.fixture(scope="module", params=list(USERS))
def shell(request, tmp_path_factory) -> tuple[str, dict]:
    with_banner(request.param)
    return request.param, laptop_for(USERS[request.param], tmp_path_factory.mktemp(request.param))


def test_a_round_trip_under_every_login_shell(shell):
    """Connect (the banner dropped from the answer), one command whose words are what shells read specially
    (each arrives as it left, nothing runs), and Ctrl-C on the laptop ends it there."""
    name, laptop = shell
    raw = on_login(USERS[name], "true")  # (without the launcher: the banner is there to be dropped)
    assert raw.returncode == 0 and (name not in STARTUP or BANNER in raw.stdout), raw
    stream = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", STREAM, str(laptop["profile"]),
                               ECHO_AND_WAIT, *WORDS],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=python_env(**laptop["env"]))
    try:
        first = stream.stdout.readline()
        assert json.loads(first) == WORDS, (name, first, stream.stderr.read() if not first else "")
        stream.send_signal(signal.SIGINT)
        try:
            assert stream.wait(timeout=60) == 130
        except subprocess.TimeoutExpired:
            pytest.fail(_why_it_goes_on(stream, laptop))
    finally:
        stream.kill()
    said = stream.stderr.read().decode()
    assert "maintenance" not in said and BANNER not in said and "Traceback" not in said, said
    ended = [c / "status" for c in (laptop["there"] / "commands").iterdir() if (c / "status").exists()]
    assert any(s.read_text() == "130" for s in ended)
    assert not list(home_there(USERS[name]).rglob("pwned"))


def _why_it_goes_on(stream: subprocess.Popen, laptop: dict) -> str:
    """What a laptop that did not end 60 s after its Ctrl-C was doing (-X faulthandler: its threads' stacks on
    SIGABRT), the SSH clients and login node processes of the user, and each of its commands' files there."""
    seen = subprocess.run(["ps", "-eo", "pid,pgid,etime,user,args"], capture_output=True, text=True).stdout
    mine = [line[:240] for line in seen.splitlines() if laptop["user"] in line]
    stream.send_signal(signal.SIGABRT)
    _, stack = stream.communicate(timeout=30)
    commands = {c.name: sorted(f.name for f in c.iterdir()) for c in (laptop["there"] / "commands").iterdir()}
    return (f"the laptop went on 60 s after its Ctrl-C; its stderr and stacks:\n{stack.decode()[-6000:]}\n"
            f"processes of {laptop['user']}:\n" + "\n".join(mine) + f"\ncommands there: {commands}")


@pytest.mark.parametrize("shell", ["tcsh", "fish"], indirect=True)
def test_the_whole_laptop_flow_under_tcsh_and_fish(shell, tmp_path):
    """launch, status, logs, report, pull and Ctrl-C, as test_laptop.py does under bash."""
    _, laptop = shell
    name = unique_name(f"shell-{laptop['user']}")
    spec = write_spec(tmp_path, name, grid=[0.001])
    args = ["--workdir", str(tmp_path)]
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), *args, cwd=tmp_path)
    assert out.returncode == 0 and "submitted 1 run(s)" in out.stdout, out.stderr
    assert BANNER not in out.stdout + out.stderr
    watched = on_laptop(laptop, "status", str(spec), "--watch", "--interval", "1", *args, cwd=tmp_path)
    assert watched.returncode == 0 and "COMPLETED" in watched.stdout.rsplit(f"sweep {name}", 1)[-1], watched
    logs = on_laptop(laptop, "logs", str(spec), "lr-0.001", "--tail", "3", *args, cwd=tmp_path)
    assert logs.returncode == 0 and logs.stdout.strip() and BANNER not in logs.stdout, logs.stderr
    report = on_laptop(laptop, "report", str(spec), *args, cwd=tmp_path)
    assert report.returncode == 0 and "lr-0.001" in (tmp_path / "runs" / name / "report.md").read_text(), report
    pulled = on_laptop(laptop, "pull", str(spec), "--checkpoints", *args, cwd=tmp_path)
    assert pulled.returncode == 0 and list((tmp_path / "runs" / name).glob("*/checkpoints/*.pt")), pulled.stderr

    held = write_spec(tmp_path, unique_name(f"shell-held-{laptop['user']}"), grid=[0.001])
    try:
        out = on_laptop(laptop, str(held), "--cluster", str(laptop["profile"]), "--hold", *args, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        watch_interrupted_then_cancelled(laptop, held, args, tmp_path)
    finally:  # (held jobs never end by themselves)
        subprocess.run(["scancel", "--name", held.stem], timeout=60)
    assert (laptop["there"] / "jobs" / name / "manifest.json").is_file()
