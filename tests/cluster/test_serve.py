"""`launch.py serve` in a real headless browser over sweeps on the local cluster: the page follows the runs as they
step (no reload), shows a run that failed with its error line, shows a log line holding `<script>` as text,
resubmits the failed run and cancels the sweep after the user confirms each; and a login node's page reached from
the laptop through the node's sshd, which another user of the node is refused. With TINYGPT_SCREENSHOTS=DIR the
browser's screenshots go there."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from selenium.webdriver.common.by import By

from tests.support.browser import browser  # noqa: F401 (a fixture)
from tests.support.cluster_gate import LOCAL_CLUSTER_HOME
from tests.support.laptop import jobs_named, laptop_for, on_laptop, on_login, write_spec
from tests.support.paths import ROOT
from tests.support.processes import launch, python_env, wait_until
from tests.support.slurm import cancel, manifest_of, unique_name
from tinygpt.launch.serve import server as server_mod
from tinygpt.launch.serve.reading import Reader

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
        wait_until(lambda: "CPU eff" in text(browser, "#run-efficiency"), timeout=60, poll=0.5,
                   what=lambda: f"broken's use of its allocation: {text(browser, '#run')}")  # (sacct, this run's job)
        shot(browser, "serve-run.png")

        browser.find_element(By.ID, "resubmit").click()  # (broken, which failed; steady runs on untouched)
        browser.switch_to.alert.accept()
        wait_until(lambda: text(browser, "#done").startswith("resubmitted: "), timeout=60, poll=0.5,
                   what=lambda: f"the page's resubmission: {text(browser, 'body')}")
        again = manifest_of(work, name).task_job_ids()
        assert text(browser, "#done") == f"resubmitted: {again[1].split('_')[0]}"  # (the new array job's id)
        assert again[1] != manifest.task_job_ids()[1]
        assert again[0] == manifest.task_job_ids()[0]

        browser.execute_script("document.querySelector(\"#runs tr[data-run='steady']\").click()")
        wait_until(lambda: text(browser, "#run-name").startswith("run steady"), timeout=60, poll=0.5,
                   what="steady's page")
        browser.find_element(By.ID, "cancel-run").click()  # (steady alone: the sweep's other run goes on)
        alert = browser.switch_to.alert
        assert "steady" in alert.text
        alert.accept()
        steady = manifest.task_job_ids()[0]
        wait_until(lambda: not _queued(steady), timeout=120, poll=0.5, what="steady's job ended by its page's cancel")
        wait_until(lambda: rows().get("steady", "").startswith("steady CANCELLED"), timeout=120, poll=0.5,
                   what=lambda: f"steady shown cancelled: {rows()}")
        assert text(browser, "#done") == f"cancelled steady: {steady}"

        browser.find_element(By.ID, "cancel").click()  # (the whole sweep: the resubmitted run's job too)
        alert = browser.switch_to.alert
        assert name in alert.text
        alert.accept()
        wait_until(lambda: text(browser, "#done").startswith("cancelled: "), timeout=60, poll=0.5,
                   what=lambda: f"the sweep's cancel: {text(browser, 'body')}")
        assert again[1].split("_")[0] in text(browser, "#done")
    finally:
        server.shutdown()
        server.server_close()
        cancel(*manifest.task_job_ids().values(), *manifest_of(work, name).task_job_ids().values())


def _queued(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True, timeout=30)
    return bool(out.stdout.strip())


@pytest.mark.slurm(needs=["login"])
def test_the_page_of_a_login_nodes_sweep_on_the_laptop_through_the_forward_serve_opens_refused_to_another_user(
        tmp_path, browser):  # noqa: F811
    """As the README says: the laptop's `serve SPEC` of a sweep it launched on a login node runs the server there
    and forwards a port of the laptop's to it over the profile's SSH connection; the link it prints opens the
    sweep's page here. tgpeer, another user of the login node, reaches the server's port there and is refused (no
    token: 403). Ctrl-C on the laptop stops the server there and closes the forward."""
    laptop = laptop_for("tgstudent", tmp_path, remote_dir="tinygpt-hpc-serve")
    name = unique_name("seen")
    spec = write_spec(tmp_path, name, grid=[0.001])
    out = on_laptop(laptop, str(spec), "--cluster", str(laptop["profile"]), "--workdir", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    said = tmp_path / "serve.out"
    with said.open("w") as output:
        serving = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), "serve", str(spec), "--workdir",
                                    str(tmp_path), "--idle-minutes", "5"], stdout=output, stderr=subprocess.STDOUT,
                                   cwd=tmp_path, env=python_env(**laptop["env"]))
    try:
        link = wait_until(lambda: re.search(r"(http://127\.0\.0\.1:\d+/sweep/\S+)\n.* to port (\d+) of",
                                            said.read_text()), timeout=120, poll=0.2, proc=serving,
                          what=lambda: f"the laptop's link: {said.read_text()}")
        browser.get(link[1])
        wait_until(lambda: re.match(r"lr-0\.001 (COMPLETED|FINISHED)", text(browser, "#runs tbody")),
                   timeout=120, poll=0.5,
                   what=lambda: f"the login node's sweep trained, on the laptop's page: {text(browser, 'body')}")
        assert text(browser, "#name") == name
        browser.execute_script("document.querySelector(\"#runs tr[data-run='lr-0.001']\").click()")
        heads = lambda: len(browser.find_elements(By.CSS_SELECTOR, "#run-attention canvas"))  # noqa: E731
        wait_until(lambda: heads() == 2 and text(browser, "#run-samples"), timeout=60, poll=0.5,  # (n_head 2)
                   what=lambda: f"our trainer's attention maps and samples on its run's page: {text(browser, '#run')}")
        assert text(browser, "#run-attention-title").startswith("attention of layer 0 at step 12")
        browser.execute_script("document.getElementById('run-samples-part').scrollIntoView()")
        shot(browser, "serve-run-trainer.png")

        peer = on_login("tgpeer", f"python3 -c 'import urllib.request as r, urllib.error as e\ntry: "
                                  f"r.urlopen(\"http://127.0.0.1:{link[2]}/api/sweeps\")\nexcept e.HTTPError as x: "
                                  f"print(x.code)'")
        assert peer.stdout.strip() == "403", peer.stdout + peer.stderr

        serving.send_signal(signal.SIGINT)
        assert serving.wait(timeout=60) == 130, said.read_text()
        assert "stops after 5 min" in said.read_text()  # (the server's words relayed; its hint to forward by hand, no)
        assert "from a laptop:" not in said.read_text()
        serves = f"pgrep -f 'tinygpt[.]launch serve {there_root(laptop)}/jobs/{name}/'"  # ([.]: not pgrep's own shell)
        wait_until(lambda: on_login("tgstudent", serves).returncode == 1, timeout=60, poll=0.5,
                   what="the server on the login node stopped")
        here = int(re.search(r"127\.0\.0\.1:(\d+)", link[1])[1])
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", here), timeout=10):
            pass  # (the forward closed with the command)
    finally:
        serving.kill()
        on_login("tgstudent", f"pkill -f 'tinygpt[.]launch serve {there_root(laptop)}/'")
        cancel(*jobs_named(name))


def there_root(laptop: dict) -> str:
    """The laptop's remote_dir as the login node names it."""
    return "/" + str(laptop["there"].relative_to(LOCAL_CLUSTER_HOME))
