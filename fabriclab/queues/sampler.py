"""Queue counters over time: a thread reads every port's counters from the eBPF maps at a fixed
interval, so an experiment can plot occupancy, marks and pauses as they happened, not only as
totals.

    sampler = QueueSampler(lab.queues, interval_s=0.005).start()
    ...                                    # run traffic
    series = sampler.stop()                # a QueueSeries
    series.write_csv(folder / "queues.csv")
    series.summary()                       # per port and class: peak occupancy, paused share, ...

Reading one port class is one bpf(2) lookup (a few microseconds from Python), so a 48-port fabric
is read in well under a millisecond; the interval actually reached is measured and recorded
(`timing()`), because a loaded 2-core machine can stretch it. On a fabric split over machines
each other machine samples its own maps on its own grid (its queue-model helper runs a sampler
there, cluster/remotequeues.py) and sends its series back at the end; each of its samples is merged
into the sample here nearest in time (by wall clock, its offset measured at start), so no sample
waits for an SSH round trip.
"""

from __future__ import annotations

import csv
import io
import time

from fabriclab.errors import LabError
from fabriclab.measure.grid import SamplingThread
from fabriclab.queues import config
from fabriclab.queues.datapath import NCLASS, QStat

# What each sample records per port and class. Counters (cumulative) and levels (instantaneous).
FIELDS = ("occ", "held", "tx_bytes", "marks", "drops", "pause_tx", "paused")
COUNTERS = ("tx_bytes", "marks", "drops", "pause_tx")
MIN_INTERVAL_S = 0.001
MAX_SAMPLES = 200_000


class QueueSampler:
    def __init__(self, model, interval_s=0.005, max_samples=MAX_SAMPLES):
        if not interval_s >= MIN_INTERVAL_S:
            raise LabError(f"sampling interval must be >= {MIN_INTERVAL_S * 1e3:g} ms, got {interval_s!r} s")
        if model is None or model.datapath is None:
            raise LabError("queue sampling needs the queue model running (a queues: section in the spec)")
        self.model, self.interval_s, self.max_samples = model, interval_s, max_samples
        # Map rows are port index x class, and model.ports is in port index order.
        self.rows = [(p, cls) for p in model.ports for cls in range(NCLASS)]
        self.times = []
        self.chunks = []
        self.bias_chunks = []        # the leak repair's bias per row (queues/leaks.py), per sample
        self.thread = SamplingThread(self._sample, interval_s, "queue-sampler",
                                     lambda: len(self.times) < self.max_samples)
        self.t0 = self.wall0 = None
        self.peers = dict(getattr(model, "peers", None) or {})     # machine -> RemoteQueues

    def start(self):
        for peer in self.peers.values():
            peer.start_sampling(self.interval_s)
        self.t0, self.wall0 = time.monotonic(), time.time()
        self._sample()                 # a first sample at t=0, before any traffic
        self.thread.start(self.t0)
        return self

    def _sample(self):
        values, bias = self.model.mine.read_rows()  # this machine's maps (others: sampled there)
        self.times.append(time.monotonic() - self.t0)
        self.chunks.append(bytes(values))
        self.bias_chunks.append(bytes(bias))

    def halt(self):
        """End the sampling thread and take the last sample (after the traffic)."""
        if self.thread.running:
            error = self.thread.stop()
            if error is not None:
                raise LabError(f"queue sampler failed: {error}")
            self._sample()

    def stop(self):
        import numpy as np

        self.halt()
        raw = np.frombuffer(b"".join(self.chunks), dtype=np.dtype(QStat)).reshape(len(self.chunks), len(self.rows))
        bias = np.frombuffer(b"".join(self.bias_chunks), dtype=np.int64).reshape(len(self.chunks), len(self.rows))
        if self.peers:
            raw, bias = self._with_peers(raw, bias)
        data = np.stack([raw[f].astype(np.int64) for f in FIELDS], axis=-1)
        data[:, :, FIELDS.index("held")] -= bias
        rows = [RowInfo(p.name, p.node, p.role, p.peer_node, self.model.ports[p.peer].name,
                        self.model.ports[p.peer].role, config.CLASSES[cls], p.rate_mbps)
                for p, cls in self.rows]
        return QueueSeries(self.interval_s, self.times, rows, data, self.wall0)

    def _with_peers(self, raw, bias):
        """Every other machine's series merged in: at each sample here, its sample nearest in time."""
        from fabriclab.queues.model import merge_stats

        here = [t + self.wall0 for t in self.times]
        stats, biases = [raw], [bias]
        for peer in self.peers.values():
            walls, their_stats, their_bias = peer.samples(len(self.rows))
            if not walls:
                raise LabError(f"queue sampler: no samples from {peer.machine.name}")
            pick = nearest(walls, here)
            stats.append(their_stats[pick])
            biases.append(their_bias[pick])
        return merge_stats(stats), sum(biases)


def nearest(times, wanted):
    """For each of `wanted`, the index of the nearest of `times` (both ascending): a numpy array."""
    import numpy as np

    times, wanted = np.asarray(times, dtype=float), np.asarray(wanted, dtype=float)
    after = np.clip(np.searchsorted(times, wanted), 0, len(times) - 1)
    before = np.clip(after - 1, 0, len(times) - 1)
    return np.where(np.abs(times[before] - wanted) <= np.abs(times[after] - wanted), before, after)


class RowInfo:
    """One port and class: `port` on `node` faces `peer_port` on `peer`. Its egress queue is
    node -> peer; its pause fields say whether `node` holds `peer` paused."""

    __slots__ = ("port", "node", "role", "peer", "peer_port", "peer_role", "cls", "rate_mbps")

    def __init__(self, port, node, role, peer, peer_port, peer_role, cls, rate_mbps):
        self.port, self.node, self.role, self.peer = port, node, role, peer
        self.peer_port, self.peer_role, self.cls, self.rate_mbps = peer_port, peer_role, cls, rate_mbps

    @property
    def key(self):
        return f"{self.port}/{self.cls}"

    @property
    def peer_key(self):
        """The row of the same class at the other end of the cable."""
        return f"{self.peer_port}/{self.cls}"


class QueueSeries:
    """Samples x rows x FIELDS. Counters are cumulative since the model started; `delta` gives
    the change per sample interval."""

    def __init__(self, interval_s, times, rows, data, wall0=None):
        self.interval_s, self.rows, self.data, self.wall0 = interval_s, rows, data, wall0
        self.index = {r.key: i for i, r in enumerate(rows)}
        self.samples = data.shape[0]
        self.times = list(times)[:self.samples]

    def window(self, start_wall, end_wall):
        """The samples between two wall-clock times (time.time()), with the sample just before
        the start so counters' changes over the window are exact: a new QueueSeries."""
        import bisect

        a = max(0, bisect.bisect_right(self.times, start_wall - self.wall0) - 1)
        b = bisect.bisect_left(self.times, end_wall - self.wall0) + 1
        return QueueSeries(self.interval_s, self.times[a:b], self.rows, self.data[a:b], self.wall0)

    def level(self, key, field):
        """One row's field at every sample (a numpy array)."""
        return self.data[:, self.index[key], FIELDS.index(field)]

    def delta(self, key, field):
        """Change of a counter over each interval (first sample: 0)."""
        import numpy as np

        return np.diff(self.level(key, field), prepend=self.level(key, field)[:1])

    def active(self):
        """Rows where anything happened: traffic sent, a queue, marks, drops or a pause."""
        if not self.samples:
            return []
        counters = [FIELDS.index(f) for f in COUNTERS]
        levels = [FIELDS.index(f) for f in ("occ", "held", "paused")]
        moved = (self.data[-1, :, counters] != self.data[0, :, counters]).any(axis=0)
        nonzero = (self.data[:, :, levels] != 0).any(axis=(0, 2))
        return [r for r, m, n in zip(self.rows, moved, nonzero) if m or n]

    def timing(self):
        """The sampling interval asked for and reached (median, p99 and largest gap)."""
        gaps = sorted(b - a for a, b in zip(self.times, self.times[1:]))
        if not gaps:
            return {"interval_s": self.interval_s, "samples": self.samples}
        pick = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))]    # noqa: E731
        return {"interval_s": self.interval_s, "samples": self.samples,
                "duration_s": round(self.times[-1] - self.times[0], 4),
                "reached_median_s": round(pick(0.5), 6), "reached_p99_s": round(pick(0.99), 6),
                "largest_gap_s": round(gaps[-1], 6)}

    def summary(self):
        """Per active row: peak and mean occupancy, the share of samples it held a pause, and the
        counters' change over the series."""
        out = []
        for r in self.active():
            occ, paused = self.level(r.key, "occ"), self.level(r.key, "paused")
            row = {"port": r.port, "node": r.node, "peer": r.peer, "role": r.role, "class": r.cls,
                   "occ_max": int(occ.max()), "occ_mean": round(float(occ.mean()), 1),
                   "held_max": int(self.level(r.key, "held").max()),
                   "paused_share": round(float((paused != 0).mean()), 4)}
            for f in COUNTERS:
                values = self.level(r.key, f)
                row[f] = int(values[-1] - values[0])
            out.append(row)
        return out

    def write_csv(self, path, rows=None):
        """Long format, one line per sample and active row: easy to load in pandas or a sheet."""
        rows = rows if rows is not None else self.active()
        # The row's names go through the csv module once (its quoting), the integers are joined
        # as they are: per-element csv rows took half a second of the main thread a full run
        # (pfc-incast, py-spy, 2026-11-28).
        heads = []
        for r in rows:
            line = io.StringIO()
            csv.writer(line, lineterminator="").writerow((r.port, r.node, r.peer, r.role, r.cls))
            heads.append(line.getvalue())
        block = self.data[:, [self.index[r.key] for r in rows], :].tolist()
        with open(path, "w", newline="") as fh:
            fh.write(",".join(("t_s", "port", "node", "peer", "role", "class", *FIELDS)) + "\r\n")
            for t, sample in zip(self.times, block):
                stamp = f"{t:.6f},"
                fh.writelines(f"{stamp}{head},{','.join(map(str, values))}\r\n"
                              for head, values in zip(heads, sample))
        return path

    # -- by hop: every port grouped by the roles at its two ends ----------------------------------
    def hop_series(self, field, cls="lossless"):
        """{hop: values per sample summed over the hop's ports} for `cls`; counters start at 0.
        A hop is `node role->peer role` (NIC, leaf, spine): its queues are the egress queues in
        that direction, its pauses the ones its nodes hold on their peers."""
        import numpy as np

        out = {}
        for r in self.rows:
            if r.cls != cls:
                continue
            values = self.level(r.key, field)
            if field in COUNTERS:
                values = values - values[0]
            name = hop_name(r)
            out[name] = out[name] + values if name in out else np.array(values)
        return {k: v for k, v in sorted(out.items()) if v.any()}

    def hops(self, cls="lossless"):
        """Per hop, over the ports that carried `cls` traffic in the series: their queues (peak
        and mean occupancy, marks) and the pauses they sent upstream (count, per second, and the
        mean share of time a port held its upstream paused)."""
        duration = (self.times[-1] - self.times[0]) if self.samples > 1 else 0.0
        out = {}
        for r in self.rows:
            if r.cls != cls:
                continue
            sent = self._change(r.key, "tx_bytes")
            received = self._change(r.peer_key, "tx_bytes") if r.peer_key in self.index else 0
            if not sent and not received:
                continue
            g = out.setdefault(hop_name(r), {"queues": 0, "occ_max": 0, "occ_mean_sum": 0.0, "marks": 0,
                                             "drops": 0, "ingress_ports": 0, "pauses": 0, "paused_sum": 0.0})
            if sent:
                occ = self.level(r.key, "occ")
                g["queues"] += 1
                g["occ_max"] = max(g["occ_max"], int(occ.max()))
                g["occ_mean_sum"] += float(occ.mean())
                g["marks"] += self._change(r.key, "marks")
                g["drops"] += self._change(r.key, "drops")
            if received:
                g["ingress_ports"] += 1
                g["pauses"] += self._change(r.key, "pause_tx")
                g["paused_sum"] += float((self.level(r.key, "paused") != 0).mean())
        result = {}
        for name, g in sorted(out.items()):
            result[name] = {
                "queues": g["queues"], "occ_max": g["occ_max"],
                "occ_mean": round(g["occ_mean_sum"] / g["queues"], 1) if g["queues"] else 0.0,
                "marks": g["marks"], "drops": g["drops"], "ingress_ports": g["ingress_ports"],
                "pauses": g["pauses"],
                "pauses_per_s": round(g["pauses"] / duration, 2) if duration else None,
                "paused_share": round(g["paused_sum"] / g["ingress_ports"], 4) if g["ingress_ports"] else 0.0}
        return result

    def _change(self, key, field):
        values = self.level(key, field)
        return int(values[-1] - values[0]) if len(values) else 0


ROLE_NAMES = {"host": "NIC", "leaf": "leaf", "spine": "spine", "super_spine": "super-spine"}


def hop_name(row):
    return f"{ROLE_NAMES.get(row.role, row.role)}->{ROLE_NAMES.get(row.peer_role, row.peer_role)}"
