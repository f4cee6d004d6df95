"""The rank agent's end of the launcher's control connection (traffic/collective.py owns the
other end): one JSON object per line over a Unix socket in the run folder, which every host
namespace reaches since they share the file system."""

from __future__ import annotations

import json
import socket

from fabriclab.errors import LabError


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
        self.buffer = b""

    def fileno(self):
        return self.sock.fileno()

    def tell(self, message):
        """Send one message, waiting for room if need be (messages are small and rare)."""
        data = (json.dumps(message) + "\n").encode()
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
        self.buffer += chunk
        lines = self.buffer.split(b"\n")
        self.buffer = lines.pop()
        return [json.loads(line) for line in lines if line]

    def close(self):
        self.sock.close()
