"""`launch.py serve`: the sweeps of a work directory as live pages in a browser, served on this machine's loopback
to whoever holds the token it prints.

Who may read or act: the printed URL carries a random token; opening it trades the token for a cookie (HttpOnly,
SameSite=Strict) and every other request must bring that cookie, so another user of the login node who finds
the port reads nothing. The Host header must name the loopback (a site that points a name of its own at
127.0.0.1, DNS rebinding, is refused), an action (POST) must come from the served origin with a JSON body, and
the pages are static: their script builds them from JSON with textContent, so what a program wrote (logs, run
names) is shown as text and never read as HTML. From a laptop it is reached through an SSH forward. With no
request for `idle_s` seconds (no page open: an open page asks every few seconds) it stops by itself.
"""

from __future__ import annotations

import hmac
import http.server
import json
import math
import os
import re
import secrets
import threading
import time
import traceback
from http import HTTPStatus
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tinygpt.launch.errors import LaunchError, SlurmAway, SweepBusy
from tinygpt.launch.serve.reading import NotFound, Reader

ASSETS = Path(__file__).with_name("assets")
IDLE_MAX_MIN = 7 * 24 * 60  # the longest a server waits for a page: a week
BODY_MAX = 65536  # an action's JSON body; more is refused unread
LOOPBACK = {"127.0.0.1", "localhost", "[::1]"}
URL = re.compile(r"http://127\.0\.0\.1:(\d+)(/\S*)")  # the link `serve` prints first: its port, then the page
FROM_A_LAPTOP = "  from a laptop:"  # the printed hint that a laptop's own `serve --cluster` leaves out
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
HEADERS = {  # on every answer: nothing but this origin's own files, never framed, never cached
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
ERRORS = ((NotFound, HTTPStatus.NOT_FOUND), (SweepBusy, HTTPStatus.CONFLICT),  # (the first kind that fits)
          (SlurmAway, HTTPStatus.SERVICE_UNAVAILABLE), (LaunchError, HTTPStatus.BAD_REQUEST))


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, reader: Reader, port: int = 0, idle_s: float = 3600.0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.reader, self.idle_s = reader, idle_s
        self.token = secrets.token_urlsafe(32)
        self.cookie = f"tinygpt_{self.port}"  # (cookies are kept by host, not port: one name per server)
        self.last = time.monotonic()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}?token={self.token}"

    def stop_when_idle(self) -> None:
        """Shut the server down once no request came for idle_s seconds (run in a thread of its own)."""
        while time.monotonic() - self.last < self.idle_s:
            time.sleep(min(5.0, self.idle_s))
        print(f"serve: no request for {self.idle_s / 60:g} min; stopped", flush=True)
        self.shutdown()


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._answer("POST")

    def log_message(self, format: str, *args: Any) -> None:  # (quiet: a page asks every few seconds)
        pass

    def _answer(self, method: str) -> None:
        self.server.last = time.monotonic()
        url = urlsplit(self.path)
        host = self.headers.get("Host", "")
        if host.rpartition(":")[0] not in LOOPBACK:
            return self._text(HTTPStatus.MISDIRECTED_REQUEST, f"this server answers only to 127.0.0.1 or localhost, "
                                                              f"not {host!r}")
        if method == "GET" and "token" in parse_qs(url.query):
            return self._sign_in(url.path, parse_qs(url.query)["token"][0])
        if not self._signed_in():
            return self._text(HTTPStatus.FORBIDDEN, "not signed in: open the link that `launch.py serve` printed")
        if method == "POST" and not self._same_origin(host):
            return self._text(HTTPStatus.FORBIDDEN, "an action must come from this server's own page")
        if method == "POST" and not self._body_read():
            return self._text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"an action's body is at most {BODY_MAX} bytes")
        try:
            parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path != "/" else []
            self._route(method, parts, parse_qs(url.query))
        except tuple(kind for kind, _ in ERRORS) as err:
            status = next(code for kind, code in ERRORS if isinstance(err, kind))
            self._json({"error": str(err)}, status)
        except Exception as err:  # noqa: BLE001 (a bug of ours: said to the page, its traceback here; serving goes on)
            traceback.print_exc()
            self._json({"error": f"the server failed: {type(err).__name__}: {err}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _body_read(self) -> bool:
        """The request's body read (left unread, it would be taken for the next request on this connection)."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return False
        if not 0 <= length <= BODY_MAX:
            self.close_connection = True
            return False
        self.rfile.read(length)
        return True

    def _sign_in(self, path: str, token: str) -> None:
        if not hmac.compare_digest(token.encode(), self.server.token.encode()):
            return self._text(HTTPStatus.FORBIDDEN, "wrong token: open the link that `launch.py serve` printed")
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Set-Cookie", f"{self.server.cookie}={self.server.token}; HttpOnly; SameSite=Strict; Path=/")
        # (the token leaves the address bar and the history; a path of this server only, never `//elsewhere`)
        self.send_header("Location", path if path.startswith("/") and not path.startswith("//") else "/")
        self._end(b"", "text/plain")

    def _signed_in(self) -> bool:
        cookie = SimpleCookie(self.headers.get("Cookie", "")).get(self.server.cookie)
        return cookie is not None and hmac.compare_digest(cookie.value.encode(), self.server.token.encode())

    def _same_origin(self, host: str) -> bool:
        return (self.headers.get("Origin") == f"http://{host}"
                and self.headers.get("Content-Type", "").startswith("application/json"))

    def _route(self, method: str, parts: list[str], query: dict[str, list[str]]) -> None:
        reader = self.server.reader
        if method == "POST":
            if len(parts) == 4 and parts[:2] == ["api", "sweeps"] and parts[3] == "cancel":
                return self._json({"cancelled": reader.sweep(parts[2]).cancel()})
            if len(parts) == 6 and parts[:2] == ["api", "sweeps"] and parts[3] == "runs" and parts[5] == "cancel":
                return self._json({"cancelled": reader.sweep(parts[2]).cancel([parts[4]])})
            if len(parts) == 4 and parts[:2] == ["api", "sweeps"] and parts[3] == "resubmit":
                return self._json({"resubmitted": reader.sweep(parts[2]).resubmit()})  # (`launch.py resubmit`'s runs)
            return self._text(HTTPStatus.NOT_FOUND, "no such action")
        if not parts:
            return self._file("index.html")
        if parts[0] == "sweep" and len(parts) == 2:
            reader.sweep(parts[1])  # (404 for a sweep there is not)
            return self._file("sweep.html")
        if parts[0] == "assets" and len(parts) == 2:
            return self._file(parts[1])
        if parts[:2] == ["api", "sweeps"]:
            return self._json(self._asked(parts[2:], query))
        return self._text(HTTPStatus.NOT_FOUND, "no such page")

    def _asked(self, parts: list[str], query: dict[str, list[str]]) -> Any:
        reader = self.server.reader
        if not parts:
            return reader.sweeps()
        if len(parts) == 1:
            return reader.status(parts[0])
        if parts[1:] == ["view"]:  # (?page=K&metric=M&run=R: what the sweep's page shows)
            return reader.view(parts[0], _number(query, "page"), _one(query, "metric"), _one(query, "run"))
        if parts[1:] == ["metrics"]:  # (?run=A&run=B: those runs' whole series)
            return reader.metrics(parts[0], query.get("run"))
        if len(parts) == 3 and parts[1] == "runs":
            return reader.run(parts[0], parts[2])
        raise NotFound("no such question")

    def _file(self, name: str) -> None:
        files = {p.name: p for p in ASSETS.iterdir()}  # (only the package's own files: no path reaches past them)
        if name not in files or files[name].suffix not in TYPES:
            return self._text(HTTPStatus.NOT_FOUND, "no such file")
        self.send_response(HTTPStatus.OK)
        self._end(files[name].read_bytes(), TYPES[files[name].suffix])

    def _json(self, value: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        self.send_response(status)
        self._end(json.dumps(value, allow_nan=False).encode(), "application/json")

    def _text(self, status: HTTPStatus, text: str) -> None:
        self.send_response(status)
        self._end(text.encode() + b"\n", "text/plain; charset=utf-8")

    def _end(self, body: bytes, content_type: str) -> None:
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


def _one(query: dict[str, list[str]], key: str) -> str | None:
    return query[key][-1] if query.get(key) else None


def _number(query: dict[str, list[str]], key: str) -> int:
    text = _one(query, key) or "0"
    if not (text.isascii() and text.isdigit()):
        raise LaunchError(f"{key}: a page's number (0, 1, ...), not {text!r}")
    return int(text)


def check_options(port: int, idle_minutes: float) -> None:
    """`--port` and `--idle-minutes` as given, or a LaunchError that names the fix."""
    if not 0 <= port <= 65535:
        raise LaunchError(f"--port {port}: give a port from 1 to 65535, or 0 for a free one")
    if not (math.isfinite(idle_minutes) and 0 < idle_minutes <= IDLE_MAX_MIN):
        raise LaunchError(f"--idle-minutes {idle_minutes}: give minutes above 0 and at most {IDLE_MAX_MIN} (a week)")


def open_server(workdir: Path, port: int = 0, idle_s: float = 3600.0) -> Server:
    """A server of `workdir`'s sweeps listening on the loopback (not yet answering), or a LaunchError naming the
    port to give instead."""
    try:
        return Server(Reader(workdir), port, idle_s)
    except OSError as err:
        raise LaunchError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({err.strerror}); give another port, "
                          f"or 0 for a free one") from None


def page_path(sweep: str | None) -> str:
    """The page of sweep `sweep`, or the list of the sweeps."""
    return f"/sweep/{quote(sweep)}" if sweep else "/"


def serve(workdir: Path, port: int = 0, idle_s: float = 3600.0, sweep: str | None = None) -> int:
    """Serve `workdir`'s sweeps until idle for idle_s seconds or Ctrl-C; print the URL to open first."""
    server = open_server(workdir, port, idle_s)
    print(f"serving the sweeps of {server.reader.workdir} at {server.url(page_path(sweep))}\n"
          f"  stops after {idle_s / 60:g} min with no page open (Ctrl-C: now)\n"
          f"{FROM_A_LAPTOP} `launch.py serve --cluster NAME` there forwards a port itself; or by hand: "
          f"ssh -N -L {server.port}:127.0.0.1:{server.port} LOGIN_NODE, then open the same link", flush=True)
    threading.Thread(target=server.stop_when_idle, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


class Page:
    """A server of a work directory's sweeps answering from threads of this process (`start`): its `url`, with
    the token, to open; `stop()` ends it (as do `idle_minutes` with no page open, and the end of the process)."""

    def __init__(self, server: Server, path: str) -> None:
        self.server, self.url = server, server.url(path)
        self._serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
        self._serving.start()
        threading.Thread(target=server.stop_when_idle, daemon=True).start()

    def __repr__(self) -> str:
        return f"Page({self.url!r})"

    def stop(self) -> None:
        """Stop answering and close the port (nothing happens the second time)."""
        if self._serving.is_alive():
            self.server.shutdown()
        self._serving.join()
        self.server.server_close()


def start(workdir: str | os.PathLike[str] = ".", *, sweep: str | None = None, port: int = 0,
          idle_minutes: float = 60.0) -> Page:
    """`launch.py serve` from Python (a notebook's cell returns at once): the sweeps of `workdir` served on this
    machine's loopback from threads of this process, the page of sweep `sweep` (else the list) at the returned
    Page's `url`. The command's checks and errors (`LaunchError`); on a login node, reach it from the laptop with
    `launch.py serve --cluster NAME` or an SSH forward of its port."""
    check_options(port, idle_minutes)
    return Page(open_server(Path(workdir), port, idle_minutes * 60), page_path(sweep))
