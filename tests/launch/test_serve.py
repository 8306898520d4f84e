"""`launch.py serve` without a cluster or a browser (tests/cluster/test_serve.py has both): who it answers, what
it answers with, and what it reads again. Requests go to the server's loopback port, as a browser's would."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.processes import launch, wait_until
from tinygpt.launch.errors import LaunchError
from tinygpt.launch.serve import reading
from tinygpt.launch.serve import server as server_mod
from tinygpt.launch.serve.reading import Reader


@pytest.fixture
def served(tmp_path):
    """A dry-run sweep of two runs (one with three metrics lines) under a server in this process."""
    spec = tmp_path / "demo.yaml"
    spec.write_text(yaml.safe_dump({"name": "demo", "command": {"argv": ["prog", "{x}"], "project": str(tmp_path)},
                                    "grid": {"x": [1, 2]}, "resources": {"time": "00:05:00"}}))
    assert launch(str(spec), "--dry-run", "--workdir", str(tmp_path / "w")).returncode == 0
    run_dir = tmp_path / "w" / "runs" / "demo" / "x-1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in (1, 2, 3)))
    page = server_mod.start(tmp_path / "w", idle_minutes=10)  # (the Python call; `serve` blocks in the same server)
    yield page.server
    page.stop()


def ask(server, path: str, method: str = "GET", headers: dict | None = None, body: str | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Host": f"127.0.0.1:{server.port}", **(headers or {})})
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read().decode()
    finally:
        conn.close()


def signed_in(server) -> dict:
    return {"Cookie": f"{server.cookie}={server.token}"}


def test_only_the_holder_of_the_token_on_the_loopback_is_answered(served):
    status, headers, _ = ask(served, f"/sweep/demo?token={served.token}")
    cookie = headers["Set-Cookie"]
    assert status == 303 and headers["Location"] == "/sweep/demo"  # (the token leaves the address bar)
    assert cookie.startswith(f"{served.cookie}={served.token};") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert not ask(served, f"//elsewhere.example/?token={served.token}")[1]["Location"].startswith("//")
    assert ask(served, "/api/sweeps")[0] == 403  # no cookie
    assert ask(served, "/?token=wrong")[0] == 403
    assert ask(served, "/api/sweeps", headers={"Cookie": f"{served.cookie}=wrong"})[0] == 403
    rebound = ask(served, "/api/sweeps", headers={**signed_in(served), "Host": f"attacker.example:{served.port}"})
    assert rebound[0] == 421 and "not 'attacker.example" in rebound[2]
    status, headers, _ = ask(served, "/sweep/demo", headers=signed_in(served))
    assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_an_action_must_come_from_the_servers_own_page(served):
    cancel = "/api/sweeps/demo/cancel"
    json_body = {"Content-Type": "application/json"}
    assert ask(served, cancel, "POST", {**signed_in(served), **json_body}, "{}")[0] == 403  # no Origin
    elsewhere = {**signed_in(served), **json_body, "Origin": "http://attacker.example"}
    assert ask(served, cancel, "POST", elsewhere, "{}")[0] == 403
    form = {**signed_in(served), "Origin": f"http://127.0.0.1:{served.port}",
            "Content-Type": "application/x-www-form-urlencoded"}  # (what a cross-site form can send)
    assert ask(served, cancel, "POST", form, "a=1")[0] == 403
    own = {**signed_in(served), **json_body, "Origin": f"http://127.0.0.1:{served.port}"}
    assert ask(served, cancel, "POST", own, "x" * (server_mod.BODY_MAX + 1))[0] == 413
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)  # (two on one connection: the body read)
    try:
        for _ in range(2):
            conn.request("POST", cancel, body="{}", headers={"Host": f"127.0.0.1:{served.port}", **own})
            answer = conn.getresponse()
            assert (answer.status, json.loads(answer.read())) == (200, {"cancelled": []})  # (a dry run: none live)
    finally:
        conn.close()


def test_the_questions_are_answered_through_the_library_and_nothing_else_is_served(served):
    me = signed_in(served)
    sweeps = json.loads(ask(served, "/api/sweeps", headers=me)[2])
    assert [(e["sweep"], e["runs"]) for e in sweeps["sweeps"]] == [("demo", 2)]
    status = json.loads(ask(served, "/api/sweeps/demo", headers=me)[2])
    assert [r["name"] for r in status["runs"]] == ["x-1", "x-2"] and status["program"] == "command"
    last = json.loads(ask(served, "/api/sweeps/demo/metrics", headers=me)[2])
    assert last == {"x-1": {"loss": [3, 1 / 3]}, "x-2": {}}  # (each run's last point: a sweep may have thousands)
    series = json.loads(ask(served, "/api/sweeps/demo/metrics?run=x-1", headers=me)[2])
    assert series == {"x-1": {"loss": [[1, 1.0], [2, 0.5], [3, 1 / 3]]}}  # (the curves drawn, whole)
    assert json.loads(ask(served, "/api/sweeps/demo/runs/x-2", headers=me)[2]) == {
        "run": "x-2", "logs": [], "samples": None, "attention": None, "efficiency": None, "problems": []}
    for path in ("/api/sweeps/nope", "/api/sweeps/demo/metrics?run=nope", "/api/sweeps/..%2F..%2Fetc",
                 "/api/sweeps/demo/runs/nope", "/api/sweeps/demo/runs/x-1/log", "/sweep/nope", "/assets/..%2Fserver.py",
                 "/assets/README.md", "/etc/passwd"):
        assert ask(served, path, headers=me)[0] == 404, path
    assert ask(served, "/assets/uPlot.iife.min.js", headers=me)[1]["Content-Type"].startswith("text/javascript")


def test_the_page_asks_one_question_answered_in_the_size_of_a_page_not_of_the_sweep(served, monkeypatch):
    """A table page of the runs (the counts of all), `run`'s row, the named values and the curves drawn: the
    best runs by the metric shown and the one chosen, whichever page it is on."""
    monkeypatch.setattr(reading, "PAGE", 1)
    monkeypatch.setattr(reading, "PLOTTED", 1)
    (served.reader.workdir / "runs" / "demo" / "x-2").mkdir()
    (served.reader.workdir / "runs" / "demo" / "x-2" / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "loss": 0.1, "acc": 0.5}) + "\n")
    me = signed_in(served)
    view = json.loads(ask(served, "/api/sweeps/demo/view?page=1&metric=loss&run=x-1", headers=me)[2])
    assert [r["name"] for r in view["status"]["runs"]] == ["x-2"] and view["status"]["counts"] == {"STARTED": 2}
    assert (view["total"], view["page"], view["pages"], view["per_page"]) == (2, 1, 2, 1)
    assert view["run"]["name"] == "x-1" and (view["metrics"], view["metric"]) == (["acc", "loss"], "loss")
    assert view["curves"] == {"x-2": [[1, 0.1]], "x-1": [[1, 1.0], [2, 0.5], [3, 1 / 3]]}
    view = json.loads(ask(served, "/api/sweeps/demo/view?page=9&metric=nope", headers=me)[2])
    assert (view["page"], view["metric"], view["run"], view["curves"]) == (1, "acc", None, {"x-2": [[1, 0.5]]})
    for query in ("page=-1", "page=one", "run=nope"):
        status, _, body = ask(served, f"/api/sweeps/demo/view?{query}", headers=me)
        assert status in (400, 404) and json.loads(body)["error"], query


def test_a_searchs_page_holds_its_best_trials_first_and_how_many_it_has(served, monkeypatch, tmp_path):
    """An Optuna search's trials as its study's journal has them: a page of the best (the lowest value; failed
    ones, which have none, last) and the number of all."""
    import optuna

    from tinygpt.launch import manifest as manifest_mod
    from tinygpt.launch.node import study_journal

    monkeypatch.setattr(reading, "PAGE", 3)
    spec = tmp_path / "hunt.yaml"
    spec.write_text(yaml.safe_dump({"name": "hunt", "train": {"dataset": "pydoc", "max_steps": 10, "min_lr": 1.0e-5},
                                    "search": {"method": "optuna", "trials": 5, "workers": 1, "sampler": "random",
                                               "seed": 1, "params": {"lr": {"loguniform": [1.0e-4, 1.0e-2]}}},
                                    "resources": {"time": "00:05:00"}}))
    assert launch(str(spec), "--dry-run", "--workdir", str(served.reader.workdir)).returncode == 0
    journal = manifest_mod.load(served.reader.workdir / "jobs" / "hunt" / "manifest.json").search.journal
    study = optuna.create_study(study_name="hunt", storage=study_journal.storage(journal))
    for value in (0.5, None, 0.2, 0.9, 0.1):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
        study.tell(trial, value, state=optuna.trial.TrialState.FAIL if value is None else None)
    view = json.loads(ask(served, "/api/sweeps/hunt/view", headers=signed_in(served))[2])
    assert view["trials"] == 5
    assert [(t["trial"], t["value"]) for t in view["status"]["trials"]] == [(4, 0.1), (2, 0.2), (0, 0.5)]


def test_a_runs_page_has_its_samples_and_attention_maps_and_a_damaged_file_is_said_not_drawn(served):
    """What our trainer writes as it ends (attention.json: training/attention.py's own file, from a real model),
    read without torch; a file that is not that shape is named on the page, never a failed answer."""
    import torch

    from tinygpt.base.config import ModelConfig
    from tinygpt.data import prepare_from_config
    from tinygpt.model import GPT
    from tinygpt.training import attention

    run_dir = served.reader.workdir / "runs" / "demo" / "x-1"
    prepared = prepare_from_config("pydoc", None, str(served.reader.workdir / "data"))
    torch.manual_seed(0)
    model = GPT(ModelConfig(block_size=16, n_layer=2, n_head=2, n_embd=16), prepared.vocab_size)
    attention.write(model, prepared, run_dir, step=7)
    (run_dir / "samples.txt").write_text("<b>To be</b>\n")
    me = signed_in(served)
    run = json.loads(ask(served, "/api/sweeps/demo/runs/x-1", headers=me)[2])
    maps = run["attention"]
    assert (maps["step"], len(maps["prompt"]), len(maps["layers"]), len(maps["layers"][0])) == (7, 16, 2, 2)
    assert all(abs(sum(row) - 1) < 0.01 for row in maps["layers"][1][0])  # (a query's weights: a distribution)
    assert all(w == 0 for q, row in enumerate(maps["layers"][0][1]) for w in row[q + 1:])  # (causal: no future)
    assert (run["samples"], run["problems"]) == ("<b>To be</b>\n", [])
    for damaged in ('{"step": 1, "prompt": ["a", "b"], "layers": [[[[1.0]]]]}', "{not json", ""):
        (run_dir / attention.FILE_NAME).write_text(damaged)
        run = json.loads(ask(served, "/api/sweeps/demo/runs/x-1", headers=me)[2])
        assert run["attention"] is None and run["samples"] == "<b>To be</b>\n"
        assert run["problems"][0].startswith(f"{run_dir / attention.FILE_NAME}: damaged, not drawn ("), run


def test_a_bug_of_the_servers_is_said_to_the_page_and_the_server_goes_on(served, monkeypatch, capsys):
    me = signed_in(served)
    monkeypatch.setattr(served.reader, "sweeps", lambda: 1 / 0)
    status, _, body = ask(served, "/api/sweeps", headers=me)
    assert (status, json.loads(body)) == (500, {"error": "the server failed: ZeroDivisionError: division by zero"})
    assert "ZeroDivisionError" in capsys.readouterr().err  # (its traceback, for whoever runs the server)
    assert ask(served, "/api/sweeps/demo", headers=me)[0] == 200


def test_a_refresh_reads_a_metrics_file_again_only_when_it_changed(served, monkeypatch):
    """The status (its steps and losses) and the curves, asked again and again: each file read once per change."""
    from tinygpt.training import metrics

    reads = []
    real = metrics.read
    monkeypatch.setattr(metrics, "read", lambda path: reads.append(path) or real(path))
    reader = served.reader
    refresh = lambda: ({**reader.status("demo"), "time": 0}, reader.metrics("demo"))  # noqa: E731
    first = refresh()
    assert refresh() == first
    assert len(reads) <= 2 and set(reads) == {reads[0]}  # (x-1's file, by status and by the curves; x-2 has none)
    before = len(reads)
    with Path(reads[0]).open("a") as f:
        f.write(json.dumps({"step": 4, "loss": float("nan")}) + "\n")
    status, last = refresh()
    assert last["x-1"]["loss"] == [4, None] and status["runs"][0]["step"] == 4  # (NaN: a gap, as JSON has none)
    assert len(reads) - before <= 2 and refresh() and len(reads) - before <= 2


def test_a_server_no_page_asks_stops_by_itself(tmp_path):
    server = server_mod.Server(Reader(tmp_path), idle_s=0.5)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    threading.Thread(target=server.stop_when_idle, daemon=True).start()
    wait_until(lambda: not thread.is_alive(), timeout=30, what="the idle server stopped")
    server.server_close()


def test_a_page_started_from_python_answers_at_its_url_until_stopped(tmp_path):
    page = server_mod.start(tmp_path, sweep="a b", idle_minutes=10)
    url = urlsplit(page.url)
    assert (url.hostname, url.path, url.query) == ("127.0.0.1", "/sweep/a%20b", f"token={page.server.token}")
    assert ask(page.server, f"{url.path}?{url.query}")[0] == 303  # (the token traded for the cookie)
    page.stop()
    page.stop()  # (twice: nothing more)
    with pytest.raises(ConnectionRefusedError):
        ask(page.server, "/")
    with pytest.raises(LaunchError, match="--port 70000: give a port from 1 to 65535"):
        server_mod.start(tmp_path, port=70000)
