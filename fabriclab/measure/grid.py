"""The samplers' clock: a thread that calls sample() at t0 + k * interval until it is stopped or
has taken enough samples. Both the port sampler and the queue sampler run on it."""

from __future__ import annotations

import threading
import time

# A port series's limits, here and on a cluster's other machines (fabriclab/cluster/remotesampler.py)
MIN_INTERVAL_S = 0.001
MAX_SAMPLES = 500_000


class SamplingThread:
    """`sample()` on a fixed grid from `t0` (time.monotonic()), in a daemon thread named `name`,
    while `more()` holds. An exception in sample() ends the thread; stop() returns it."""

    def __init__(self, sample, interval_s, name, more=lambda: True):
        self.sample, self.interval_s, self.name, self.more = sample, interval_s, name, more
        self._stop = threading.Event()
        self._thread = None
        self.error = None

    def start(self, t0):
        self._thread = threading.Thread(target=self._run, args=(t0,), name=self.name, daemon=True)
        self._thread.start()
        return self

    def _run(self, t0):
        next_at = t0 + self.interval_s
        try:
            while not self._stop.is_set() and self.more():
                delay = next_at - time.monotonic()
                if delay > 0 and self._stop.wait(delay):
                    break
                self.sample()
                # Fixed grid; after a stall, resume from now rather than bursting to catch up.
                next_at = max(next_at + self.interval_s, time.monotonic())
        except Exception as exc:               # noqa: BLE001 - returned by stop()
            self.error = exc

    @property
    def running(self):
        return self._thread is not None

    def stop(self):
        """End the thread (waiting for a sample under way); returns the exception that ended it
        early, or None."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
            self._thread = None
        return self.error


def onto(times_here, wall0_here, remote_walls, remote_rows):
    """A remote series' cumulative counters at this machine's sample times (series seconds from
    `wall0_here`), interpolated by wall clock; held at its first and last values outside it."""
    import numpy as np

    walls = np.asarray(remote_walls, dtype=float)
    data = np.asarray(remote_rows, dtype=float).reshape(len(walls), -1)
    at = wall0_here + np.asarray(times_here, dtype=float)
    return np.stack([np.interp(at, walls, data[:, i]) for i in range(data.shape[1])], axis=1).round().astype(np.int64)
