"""The live web view's server: the page, its push channel and its buttons, for one running lab.

    server = WebServer(lab, session, "127.0.0.1:8765").start()
    print(server.url)            # http://127.0.0.1:8765/?token=...
    ...
    server.stop()                # the page says the lab stopped; nothing is left listening

    GET  /?token=T          the page (view/page.py, live mode)
    GET  /events?token=T    server-sent events: a frame (view/live.py) per refresh; `bye` at stop
    GET  /state?token=T     the latest frame as JSON, for scripts
    POST /action?token=T    a JSON request (view/actions.py); answers {"ok", "message"|"error"}

Every path needs the token printed at start, loopback included: the buttons break a fabric as
root, and any local user (or a web page the browser opened, by a forged request) can reach
loopback. The stdlib's threaded HTTP server is enough for a few viewers; it runs in the lab's
own process, so the lab's teardown, Ctrl-C included, leaves nothing listening.
"""

from __future__ import annotations

import hmac
import http.server
import ipaddress
import json
import secrets
import socket
import threading
import time
import urllib.parse

from fabriclab.errors import LabError
from fabriclab.loading import clip, excerpt, parse_json
from fabriclab.measure.counters import SYS_NET
from fabriclab.view import DEFAULT_ADDRESS, actions, page
from fabriclab.view.live import REFRESH_S, LiveFeed

MAX_BODY_BYTES = 65_536
MAX_STREAMS = 16                 # pages watching at once
KEEPALIVE_S = 15.0
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # The page is self-contained: its own inline script and style, its own origin for data.
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
}


def parse_address(text, what="web address"):
    """"HOST:PORT" (an IPv6 host in brackets) -> (host, port); LabError in one line otherwise."""
    if not isinstance(text, str) or not 0 < len(text) <= 300:
        raise LabError(f"{what} must be HOST:PORT, e.g. {DEFAULT_ADDRESS}")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise LabError(f"{what} {excerpt(text)} must be HOST:PORT with a port in 0..65535 "
                       f"(0: any free port), e.g. {DEFAULT_ADDRESS}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or any(ch.isspace() or ch in "/?#@[]" for ch in host):
        raise LabError(f"{what} {excerpt(text)} has no usable host; e.g. {DEFAULT_ADDRESS}")
    return host, int(port)


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_server(host, port, handler, what, option):
    """A threading HTTP server bound to (host, port), IPv6 where the host is; LabError in one line
    when the address is taken or unusable (`what` is served, `option` chooses another)."""
    try:
        return (_Server6 if ":" in host else _Server)((host, port), handler)
    except OSError as exc:
        raise LabError(f"cannot serve {what} on {clip(host, 60)}:{port}: {exc.strerror or exc} "
                       f"(choose another with {option} HOST:PORT)") from None


class WebServer:
    def __init__(self, lab, session, address=DEFAULT_ADDRESS, refresh_s=REFRESH_S, token=None, sys_net=SYS_NET):
        self.lab, self.session, self.sys_net = lab, session, sys_net
        self.host, self.port = parse_address(address)
        self.refresh_s = refresh_s
        self.token = token or secrets.token_urlsafe(18)
        self.feed = None
        self.httpd = None
        self.thread = None
        self.closing = threading.Event()
        self.streams = 0
        self._streams_lock = threading.Lock()
        self.action_lock = threading.Lock()

    @property
    def url(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    @property
    def loopback(self):
        return is_loopback(self.host)

    def start(self):
        """bind() then serve()."""
        return self.bind().serve()

    def bind(self):
        """Take the address (before a fabric is built, so a busy port costs nothing)."""
        self.httpd = http_server(self.host, self.port, _Handler, "the web view", "--web")
        self.httpd.web = self
        self.port = self.httpd.server_address[1]
        return self

    def serve(self):
        """Start reading the (running) lab and answering pages."""
        self.feed = LiveFeed(self.lab, self.session, self.refresh_s, self.sys_net).start()
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="web-view", daemon=True)
        self.thread.start()
        return self

    def banner(self):
        """What the lab prints when the view starts."""
        where = "" if self.loopback else (" (not loopback: anyone who can reach this address and has the URL "
                                          "can break this fabric)")
        return f"web view: {self.url}{where}"

    def stop(self):
        """Say goodbye on every open push channel, then stop listening."""
        if self.httpd is None:
            return
        self.closing.set()
        if self.thread is None:                 # bound, never served
            self.httpd.server_close()
            self.httpd = None
            return
        if self.feed is not None:
            self.feed.stop()
        deadline = time.monotonic() + 2.0
        while self.streams and time.monotonic() < deadline:
            time.sleep(0.05)
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
        self.httpd = None

    def stream_slot(self, delta):
        with self._streams_lock:
            if delta > 0 and self.streams >= MAX_STREAMS:
                return False
            self.streams += delta
            return True


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True          # a page left open never holds the lab's exit
    web = None                     # the WebServer it answers for


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "fabriclab"
    sys_version = ""

    def log_message(self, *_args):          # the prompt's terminal is not a web log
        pass

    def _send(self, code, body, kind="application/json"):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in SECURITY_HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _json(self, code, data):
        self._send(code, json.dumps(data))

    def _route(self):
        """The path, once the token checks out; None after answering 403/404."""
        url = urllib.parse.urlsplit(self.path)
        given = urllib.parse.parse_qs(url.query).get("token", [""])[0]
        if not hmac.compare_digest(given.encode(), self.server.web.token.encode()):
            self._send(403, "fabriclab: open the URL the lab printed (it carries the page's token)\n",
                       "text/plain")
            return None
        return url.path

    def do_GET(self):
        path = self._route()
        if path is None:
            return
        if path == "/":
            self._send(200, page.render_live(self.server.web.lab, self.server.web.token, self.server.web.refresh_s), "text/html")
        elif path == "/state":
            self._json(200, self.server.web.feed.latest or {})
        elif path == "/events":
            self._events()
        else:
            self._send(404, "not found\n", "text/plain")

    def _events(self):
        if not self.server.web.stream_slot(+1):
            self._send(503, "too many pages watching this lab\n", "text/plain")
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            for key, value in SECURITY_HEADERS.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(b"retry: 2000\n\n")
            seq = 0
            while True:
                frame = None if self.server.web.closing.is_set() else self.server.web.feed.wait(seq, KEEPALIVE_S)
                if self.server.web.closing.is_set():
                    bye = {"reason": "the lab stopped", "clock": time.strftime("%H:%M:%S")}
                    self.wfile.write(f"event: bye\ndata: {json.dumps(bye)}\n\n".encode())
                    self.wfile.flush()
                    return
                if frame is None:
                    self.wfile.write(b": keepalive\n\n")
                else:
                    seq = frame["seq"]
                    self.wfile.write(f"data: {json.dumps(frame, separators=(',', ':'))}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass                            # the page went away
        finally:
            self.server.web.stream_slot(-1)

    def do_POST(self):
        path = self._route()
        if path is None:
            return
        if path != "/action":
            self._send(404, "not found\n", "text/plain")
            return
        length = self.headers.get("Content-Length", "")
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            self._json(413, {"ok": False, "error": f"a request is JSON of at most {MAX_BODY_BYTES} bytes"})
            return
        if not self.server.web.action_lock.acquire(blocking=False):
            self._json(409, {"ok": False, "error": "another action is still under way; try again"})
            return
        # The answer is sent after the lock is released: a page that acts again as soon as it has
        # the answer must not find the lock still held.
        try:
            request = parse_json(self.rfile.read(int(length)).decode("utf-8", "replace"), "request")
            code, answer = 200, {"ok": True, "message": actions.perform(self.server.web.lab,
                                                                        self.server.web.session, request)}
        except LabError as exc:
            code, answer = 400, {"ok": False, "error": str(exc)}
        except Exception as exc:            # noqa: BLE001 - the page shows it; the lab goes on
            code, answer = 500, {"ok": False, "error": f"{type(exc).__name__}: {excerpt(str(exc), 120)}"}
        finally:
            self.server.web.action_lock.release()
        self._json(code, answer)
