"""The control connection between the collective launcher and its rank agents: one JSON object
per line over a Unix socket in the run folder, which every host namespace reaches since they
share the file system. `frame` and `Lines` are the wire format, used by both ends; ControlChannel
is the agent's end (traffic/collective.py holds the launcher's)."""

from __future__ import annotations

import json
import socket

from fabriclab.errors import LabError


def frame(message):
    """One message as the bytes that go on the connection."""
    return (json.dumps(message) + "\n").encode()


class Lines:
    """Messages out of a byte stream that arrives in pieces: feed() returns the complete ones."""

    def __init__(self, pending=b""):
        self.pending = pending

    def feed(self, chunk):
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        return [json.loads(line) for line in lines if line]


class LauncherGone(Exception):
    """The launcher closed the connection: the agent's job is over."""


class ControlChannel:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise LabError(f"cannot reach the launcher at {path}: {exc.strerror}") from None
        self.sock.setblocking(False)
        self.lines = Lines()

    def fileno(self):
        return self.sock.fileno()

    def tell(self, message):
        """Send one message, waiting for room if need be (messages are small and rare)."""
        data = frame(message)
        self.sock.setblocking(True)
        try:
            self.sock.sendall(data)
        finally:
            self.sock.setblocking(False)

    def messages(self):
        """The complete messages that arrived; LauncherGone when the launcher hung up."""
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        if not chunk:
            raise LauncherGone()
        return self.lines.feed(chunk)

    def close(self):
        self.sock.close()
