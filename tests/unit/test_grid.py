"""The samplers' clock without a fabric: a fixed grid, a stop, a limit, and a failure kept."""

import time

from fabriclab.measure.grid import SamplingThread


def test_samples_on_a_grid_until_stopped():
    times = []
    thread = SamplingThread(lambda: times.append(time.monotonic()), 0.01, "t")
    t0 = time.monotonic()
    thread.start(t0)
    time.sleep(0.105)
    assert thread.stop() is None and not thread.running
    assert 7 <= len(times) <= 11
    # on the grid, not drifting: the k-th sample is near t0 + k * interval
    assert all(abs((t - t0) - 0.01 * (k + 1)) < 0.008 for k, t in enumerate(times[:5]))


def test_stops_at_the_limit_and_keeps_the_failure():
    taken = []
    limited = SamplingThread(lambda: taken.append(1), 0.001, "t", more=lambda: len(taken) < 3).start(time.monotonic())
    time.sleep(0.05)
    assert limited.stop() is None and len(taken) == 3

    def broken():
        raise OSError("counter file vanished")
    failing = SamplingThread(broken, 0.001, "t").start(time.monotonic())
    time.sleep(0.02)
    error = failing.stop()
    assert isinstance(error, OSError) and "vanished" in str(error)
