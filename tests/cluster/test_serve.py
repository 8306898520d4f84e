"""`launch.py serve` in a real headless browser over sweeps on the local cluster: the page follows the runs as they
step (no reload), shows a run that failed with its error line, shows a log line holding `<script>` as text,
resubmits the failed run and cancels the sweep after the user confirms each; and a login node's page reached from
the laptop through the node's sshd, which another user of the node is refused. With TINYGPT_SCREENSHOTS=DIR the
browser's screenshots go there."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from selenium.webdriver.common.by import By

from tests.support.browser import browser  # noqa: F401 (a fixture)
from tests.support.cluster_gate import LOCAL_CLUSTER_HOME
from tests.support.laptop import KEYS, jobs_named, laptop_for, on_laptop, on_login, write_spec
from tests.support.paths import ROOT
from tests.support.processes import launch, wait_until
from tests.support.slurm import cancel, manifest_of, unique_name
from tinygpt.launch.serve import server as server_mod
from tinygpt.launch.serve.reading import Reader
from tinygpt.launch.submit import snapshot

pytestmark = [pytest.mark.slurm, pytest.mark.shares_cluster]  # (its jobs wait for CPUs like any other's)

PROGRAM = """\
import json, os, sys, time
from pathlib import Path

run = Path(os.environ["TINYGPT_RUN_DIR"])
step = 0
while step < 900:
    step += 1
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "loss": 1 / step}) + "\\n")
    if sys.argv[1] == "fail" and step == 3:
        print("<script>document.title = 'pwned'</script>", flush=True)
        print("error: the data ran out at step 3", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(0.5)
"""


def text(driver, selector: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0].text if found else ""


def shot(driver, name: str) -> None:
    folder = os.environ.get("TINYGPT_SCREENSHOTS")
    if folder:
        driver.save_screenshot(str(Path(folder) / name))


def test_a_running_sweep_seen_live_in_a_browser_its_failure_said_resubmitted_and_the_sweep_cancelled_from_the_page(
        tmp_path, browser):  # noqa: F811
    name = unique_name("serve")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "prog.py").write_text(PROGRAM)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "command": {"argv": ["python3", "prog.py", "{mode}"],
                                                              "project": str(tmp_path / "project")},
                                    "runs": [{"name": "steady", "mode": "count"}, {"name": "broken", "mode": "fail"}],
                                    "resources": {"time": "00:05:00"}}))
    work = tmp_path / "work"
    out = launch(str(spec), "--workdir", str(work))
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = manifest_of(work, name)
    server = server_mod.Server(Reader(work), idle_s=600)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        browser.get(server.url(f"/sweep/{name}"))
        browser.execute_script("window.loadedOnce = 'yes'")
        # (read in one script: the table is built anew on every refresh, so a row found a moment ago may be gone)
        rows = lambda: browser.execute_script(  # noqa: E731
            "return Object.fromEntries([...document.querySelectorAll('#runs tbody tr')].map("
            "r => [r.dataset.run, [...r.cells].map(c => c.textContent).join(' ')]))")
        wait_until(lambda: rows().get("broken", "").startswith("broken FAILED"), timeout=180, poll=0.5,
                   what=lambda: f"the failed run on the page: {rows()}")
        points = lambda: int(browser.find_element(By.ID, "chart").get_attribute("data-points"))  # noqa: E731
        seen = wait_until(lambda: points() >= 3 + 2 and points(), timeout=120, poll=0.5, what="steady's first steps")
        wait_until(lambda: points() >= seen + 3, timeout=120, poll=0.5, what=lambda: f"the curve grown from {seen}")
        assert browser.execute_script("return window.loadedOnce") == "yes"  # (grown in place: no reload)
        shot(browser, "serve-sweep.png")

        browser.execute_script("document.querySelector(\"#runs tr[data-run='broken']\").click()")
        wait_until(lambda: "<script>" in text(browser, "#run-log"), timeout=60, poll=0.5, what="broken's log")
        assert text(browser, "#run-error") == "error: the data ran out at step 3"
        assert "<script>document.title = 'pwned'</script>" in text(browser, "#run-log")  # (as text, not run)
        assert browser.find_elements(By.CSS_SELECTOR, "#run-log script") == [] and browser.title != "pwned"
        shot(browser, "serve-run.png")

        browser.find_element(By.ID, "resubmit").click()  # (broken, which failed; steady runs on untouched)
        browser.switch_to.alert.accept()
        wait_until(lambda: text(browser, "#done").startswith("resubmitted: "), timeout=60, poll=0.5,
                   what=lambda: f"the page's resubmission: {text(browser, 'body')}")
        again = manifest_of(work, name).task_job_ids()
        assert text(browser, "#done") == f"resubmitted: {again[1].split('_')[0]}"  # (the new array job's id)
        assert again[1] != manifest.task_job_ids()[1]
        assert again[0] == manifest.task_job_ids()[0]

        browser.find_element(By.ID, "cancel").click()
        alert = browser.switch_to.alert
        assert name in alert.text
        alert.accept()
        steady = manifest.task_job_ids()[0]
        wait_until(lambda: not _queued(steady), timeout=120, poll=0.5, what="steady's job ended by the page's cancel")
        wait_until(lambda: rows().get("steady", "").startswith("steady CANCELLED"), timeout=120, poll=0.5,
                   what=lambda: f"steady shown cancelled: {rows()}")
        assert text(browser, "#done").startswith("cancelled: ") and steady.split("_")[0] in text(browser, "#done")
    finally:
        server.shutdown()
        server.server_close()
        cancel(*manifest.task_job_ids().values(), *manifest_of(work, name).task_job_ids().values())


def _queued(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True, timeout=30)
    return bool(out.stdout.strip())


@pytest.mark.slurm(needs=["login"])
def test_the_page_of_a_login_nodes_sweep_reached_from_the_laptop_through_its_sshd_and_refused_to_another_user(
        tmp_path, browser):  # noqa: F811
    """As the README says: serve runs on the login node (there over SSH, as the laptop's launcher was sent), the
    laptop forwards a port of its own to it through the login node's sshd and opens the link; tgpeer, another
    user of the node, reaches the port and is refused (no token: 403)."""
    laptop = laptop_for("tgstudent", tmp_path, remote_dir="tinygpt-hpc-serve")
    name = unique_name("seen")
    spec = write_spec(tmp_path, name, grid=[0.001])
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), "--workdir", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    there = laptop["there"]
    root = "/" + str(there.relative_to(LOCAL_CLUSTER_HOME))  # (the same folder, as the login node names it)
    python = "/" + str(next(there.glob("venvs/wheels-*/bin/python")).relative_to(LOCAL_CLUSTER_HOME))
    ssh = ["ssh", "-i", str(KEYS / "id_ed25519"), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
           "-o", f"UserKnownHostsFile={KEYS / 'known_hosts'}", "-o", "ConnectTimeout=10", "-S", str(tmp_path / "ctl")]
    serving = subprocess.Popen(
        [*ssh, "-M", "tgstudent@login", f"cd {root} && PYTHONPATH={root}/trees/{snapshot.read(ROOT).digest} "
                                        f"{python} -m tinygpt.launch serve jobs/{name}/manifest.json --idle-minutes 5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = serving.stdout.readline()  # (the link, printed at once; or why it could not serve, then the end)
        link = re.search(r"http://127\.0\.0\.1:(\d+)(/sweep/\S+)\?token=(\S+)", said)
        assert link, said + serving.stdout.read()
        port, page, token = link.groups()
        with socket.socket() as s:  # a free port of the laptop's for the forward
            s.bind(("127.0.0.1", 0))
            here = s.getsockname()[1]
        subprocess.run([*ssh, "-O", "forward", "-L", f"{here}:127.0.0.1:{port}", "tgstudent@login"], check=True,
                       capture_output=True, timeout=30)
        browser.get(f"http://127.0.0.1:{here}{page}?token={token}")
        wait_until(lambda: "lr-0.001" in text(browser, "#runs tbody"), timeout=60, poll=0.5,
                   what=lambda: f"the login node's sweep on the laptop's page: {text(browser, 'body')}")
        assert text(browser, "#name") == name

        peer = on_login("tgpeer", f"python3 -c 'import urllib.request as r, urllib.error as e\ntry: "
                                  f"r.urlopen(\"http://127.0.0.1:{port}/api/sweeps\")\nexcept e.HTTPError as x: "
                                  f"print(x.code)'")
        assert peer.stdout.strip() == "403", peer.stdout + peer.stderr
    finally:
        on_login("tgstudent", f"pkill -f 'tinygpt.launch serve jobs/{name}/'")
        subprocess.run([*ssh, "-O", "exit", "tgstudent@login"], capture_output=True, timeout=30)
        serving.kill()
        cancel(*jobs_named(name))
