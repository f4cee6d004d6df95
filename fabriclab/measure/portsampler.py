"""Port counters at millisecond intervals: every fabric link direction and every NIC's send and
receive, read from the switch ports' veth counters in the root namespace.

    sampler = PortSampler(lab.fabric, interval_s=0.005).start()
    ...                                      # traffic, faults
    series = sampler.stop()                  # a PortSeries
    times, mbps = series.rates(0.05)         # Mbit/s per column in 50 ms bins
    series.timing()                          # the interval actually reached

A column is one direction of one cable. Fabric links: the switch port's tx_bytes (`l1>s1` is what
l1 sent up). Host links: the leaf port's tx_bytes is what the NIC received (`l1>h1-n0`), its
rx_bytes what the NIC sent (`h1-n0>l1`). The counters stay open between samples
(measure/counters.py), so one sample of a 64-port fabric costs about 0.1 ms; the reached
interval is recorded because a loaded 2-core machine stretches it.
"""

from __future__ import annotations

import csv
import dataclasses
import time

from fabriclab.errors import LabError
from fabriclab.measure.counters import SYS_NET, PortCounters
from fabriclab.measure.grid import MAX_SAMPLES, MIN_INTERVAL_S, SamplingThread, onto


@dataclasses.dataclass(frozen=True)
class Column:
    name: str            # "l1>s1", "s1>l1#2", "h1-n0>l1", "l1>h1-n0"
    intf: str            # the root-namespace interface read
    counter: str         # tx_bytes | rx_bytes
    kind: str            # up | down (fabric) | nic_tx | nic_rx (host links)
    src: str
    dst: str
    link: str            # the cable's label, e.g. l1-s1
    plane: int
    rate_mbps: float
    host: str = ""       # host links: the host
    nic: int = -1        # host links: the NIC index (its rail)


def columns(fabric):
    """Every direction the sampler reads, fabric links first (in the fabric's link order)."""
    cols = []
    for link in fabric.fabric_links:
        suffix = f"#{link.member + 1}" if link.member else ""
        cols.append(Column(f"{link.a}>{link.b}{suffix}", link.a_intf, "tx_bytes", "up", link.a, link.b,
                           link.label, link.plane, link.rate_mbps))
        cols.append(Column(f"{link.b}>{link.a}{suffix}", link.b_intf, "tx_bytes", "down", link.b, link.a,
                           link.label, link.plane, link.rate_mbps))
    nic_of = {p.intf: p.nic for h in fabric.hosts.values() for p in h.ports}
    for link in fabric.host_links:
        port, nic = link.a_intf, nic_of[link.a_intf]
        cols.append(Column(f"{port}>{link.b}", link.b_intf, "rx_bytes", "nic_tx", port, link.b,
                           link.label, link.plane, link.rate_mbps, link.a, nic))
        cols.append(Column(f"{link.b}>{port}", link.b_intf, "tx_bytes", "nic_rx", link.b, port,
                           link.label, link.plane, link.rate_mbps, link.a, nic))
    return cols


def open_counters(cols, sys_net=SYS_NET):
    """The counters the columns read, open until closed (a counters.PortCounters)."""
    return PortCounters([(c.intf, c.counter) for c in cols], sys_net)


def machines_of_columns(fabric, cols, cluster):
    """{machine name: (Machine, [column index])} for the columns whose port is on another machine
    of `cluster` (a switch port is read where its switch runs)."""
    owner = {}
    for link in fabric.links:
        owner[link.a_intf], owner[link.b_intf] = link.a, link.b
    away = {}
    for i, col in enumerate(cols):
        machine = cluster.machine_of_name(owner[col.intf])
        if not machine.local:
            away.setdefault(machine.name, (machine, []))[1].append(i)
    return away


class ColumnReader:
    """Every column's counter now, as {column name: value} (a missing port reads 0), for views that
    refresh every second or so: columns of switches here from files kept open, those of switches
    on other machines of `cluster` by the run's counter reader there, all machines at once
    (the cluster's counter readers)."""

    def __init__(self, fabric, cols, cluster=None, sys_net=SYS_NET):
        self.cols, self.cluster = list(cols), cluster
        self.away = machines_of_columns(fabric, self.cols, cluster) if cluster is not None else {}
        elsewhere = {i for _m, idx in self.away.values() for i in idx}
        self.here = [c for i, c in enumerate(self.cols) if i not in elsewhere]
        self._wanted = {name: (machine, [(self.cols[i].intf, self.cols[i].counter) for i in idx])
                        for name, (machine, idx) in self.away.items()}
        self.counters = open_counters(self.here, sys_net)

    def read(self):
        values = {c.name: value or 0 for c, value in zip(self.here, self.counters.read())}
        away = self.cluster.read_counters_all(self._wanted) if self._wanted else {}
        for name, reading in away.items():
            for i, value in zip(self.away[name][1], reading.values):
                values[self.cols[i].name] = value or 0
        return {c.name: values[c.name] for c in self.cols}

    def close(self):
        self.counters.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PortSampler:
    """Samples every column's counter on a fixed grid. With a `cluster`, the ports of switches on
    other machines are sampled there (cluster/remotesampler.py) and set onto this grid."""

    def __init__(self, fabric, interval_s=0.005, max_samples=MAX_SAMPLES, sys_net=SYS_NET, cluster=None):
        if not interval_s >= MIN_INTERVAL_S:
            raise LabError(f"sampling interval must be >= {MIN_INTERVAL_S * 1e3:g} ms, got {interval_s!r} s")
        self.fabric, self.interval_s, self.max_samples = fabric, interval_s, max_samples
        self.sys_net = sys_net
        self.columns = columns(fabric)
        away = machines_of_columns(fabric, self.columns, cluster) if cluster is not None else {}
        self.remote = [(cluster.port_sampler(machine, [(self.columns[i].intf, self.columns[i].counter) for i in idx],
                                             interval_s), idx)
                       for machine, idx in away.values()]
        remote_idx = {i for _s, idx in self.remote for i in idx}
        self.here = [i for i in range(len(self.columns)) if i not in remote_idx]
        self.times, self.rows = [], []
        self._counters = None
        self.thread = SamplingThread(self._sample, interval_s, "port-sampler",
                                     lambda: len(self.times) < self.max_samples)
        self.error = None
        self.t0 = self.wall0 = None

    def start(self):
        self._counters = open_counters([self.columns[i] for i in self.here], self.sys_net)
        if self._counters.missing:
            missing = self._counters.missing
            self._close()
            raise LabError(f"cannot read the counters of port(s) {', '.join(missing)}: is the fabric up?")
        try:
            for sampler, _idx in self.remote:
                sampler.start()
        except BaseException:
            self._close()
            raise
        self.t0, self.wall0 = time.monotonic(), time.time()
        try:
            self._sample()
        except LabError:
            self._close()
            raise
        self.thread.start(self.t0)
        return self

    def _sample(self):
        now = time.monotonic()
        values = self._counters.read()
        if None in values:
            raise LabError(f"port {self._counters.pairs[values.index(None)][0]} disappeared during sampling")
        self.rows.append(values)
        self.times.append(now - self.t0)

    def stop(self):
        """End sampling (one last sample first) and return the PortSeries."""
        if self.thread.running:
            self.error = self.thread.stop()
            if self.error is None:
                try:
                    self._sample()
                except LabError as exc:
                    self.error = exc
        away = []
        try:
            for sampler, idx in self.remote:
                if sampler.proc is not None:
                    away.append((sampler.stop(), idx))
        except LabError as exc:
            self.error = self.error or exc
        finally:
            self._close()
        if self.error is not None:
            raise LabError(f"port sampler failed: {self.error}")
        if not self.remote:
            return PortSeries(self.interval_s, self.times, self.columns, self.rows, self.wall0)
        import numpy as np

        data = np.zeros((len(self.times), len(self.columns)), dtype=np.int64)
        if self.here:
            data[:, self.here] = np.asarray(self.rows, dtype=np.int64).reshape(len(self.times), len(self.here))
        for (walls, rows), idx in away:
            data[:, idx] = onto(self.times, self.wall0, walls, rows)
        series = PortSeries(self.interval_s, self.times, self.columns, data, self.wall0)
        series.clocks = self.clock_offsets()
        return series

    def clock_offsets(self):
        """{machine: {"offset_ms", "rtt_ms"}}: how the other machines' clocks were set onto this one."""
        return {s.machine.name: {"offset_ms": round(s.offset_s * 1e3, 3), "rtt_ms": round(s.rtt_s * 1e3, 3),
                                 "drift_ms": round((s.end_offset_s - s.offset_s) * 1e3, 3)
                                 if s.end_offset_s is not None else None}
                for s, _idx in self.remote if s.offset_s is not None}

    def _close(self):
        if self._counters is not None:
            self._counters.close()
            self._counters = None
        for sampler, _idx in self.remote:
            sampler.close()


class PortSeries:
    """Samples x columns of cumulative byte counters; times in seconds since the first sample,
    `wall0` the wall-clock time (time.time()) of that sample."""

    def __init__(self, interval_s, times, columns_, rows, wall0=0.0):
        import numpy as np

        self.interval_s, self.columns, self.wall0 = interval_s, list(columns_), wall0
        self.times = np.asarray(times, dtype=float)
        self.data = np.asarray(rows, dtype=np.int64).reshape(len(self.times), len(self.columns))
        self.index = {c.name: i for i, c in enumerate(self.columns)}
        self.clocks = {}          # other machines' ports: their clock set onto this one's

    @property
    def duration_s(self):
        return float(self.times[-1] - self.times[0]) if len(self.times) > 1 else 0.0

    def to_series_time(self, wall):
        return wall - self.wall0

    def rates(self, bin_s, start=None, end=None):
        """(bin start times, Mbit/s array bins x columns): counters interpolated at the bin edges,
        so irregular sampling does not bias a bin. Times are series seconds."""
        import numpy as np

        if not bin_s > 0:
            raise ValueError("bin must be > 0 s")
        start = self.times[0] if start is None else max(start, self.times[0])
        end = self.times[-1] if end is None else min(end, self.times[-1])
        count = int((end - start) / bin_s + 1e-9)
        if count < 1 or len(self.times) < 2:
            return np.zeros(0), np.zeros((0, len(self.columns)))
        edges = start + bin_s * np.arange(count + 1)
        at_edges = np.stack([np.interp(edges, self.times, self.data[:, i]) for i in range(len(self.columns))],
                            axis=1)
        return edges[:-1], np.diff(at_edges, axis=0) * 8 / bin_s / 1e6

    def mean_mbps(self, start=None, end=None):
        """{column name: mean Mbit/s} between two series times (default: the whole series)."""
        import numpy as np

        start = self.times[0] if start is None else max(start, self.times[0])
        end = self.times[-1] if end is None else min(end, self.times[-1])
        if end <= start:
            return {c.name: 0.0 for c in self.columns}
        a = [np.interp(start, self.times, self.data[:, i]) for i in range(len(self.columns))]
        b = [np.interp(end, self.times, self.data[:, i]) for i in range(len(self.columns))]
        return {c.name: (y - x) * 8 / (end - start) / 1e6 for c, x, y in zip(self.columns, a, b)}

    def delivered(self, bin_s, start=None, end=None):
        """(bin times, Mbit/s) the NICs received in total: what the fabric delivered to hosts."""
        times, mbps = self.rates(bin_s, start, end)
        keep = [i for i, c in enumerate(self.columns) if c.kind == "nic_rx"]
        return times, mbps[:, keep].sum(axis=1)

    def timing(self):
        """The sampling interval asked for and reached (median, p99, largest gap)."""
        import numpy as np

        out = {"interval_s": self.interval_s, "samples": len(self.times)}
        if self.clocks:
            out["other_machines"] = self.clocks
        if len(self.times) < 2:
            return out
        gaps = np.diff(self.times)
        out.update({"duration_s": round(self.duration_s, 4),
                    "reached_median_s": round(float(np.median(gaps)), 6),
                    "reached_p99_s": round(float(np.percentile(gaps, 99)), 6),
                    "largest_gap_s": round(float(gaps.max()), 6)})
        return out

    def write_csv(self, path, bin_s):
        """Wide format: one row per bin, a column per direction in Mbit/s (time 0 = first sample)."""
        times, mbps = self.rates(bin_s)
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(("t_s", *(c.name for c in self.columns)))
            for t, row in zip(times, mbps):
                w.writerow((f"{t - self.times[0]:.4f}", *(f"{v:.3f}" for v in row)))
        return path
