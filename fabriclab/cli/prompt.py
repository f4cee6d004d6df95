"""The lab prompt: Mininet's CLI (every Mininet command still works) plus the lab's own commands.

    fabriclab> linkdown l1 s1          fabriclab> paths h1 h5
    fabriclab> flap l1 s2 3 1 1         fabriclab> uplinks 2
    fabriclab> ports l1                 fabriclab> traffic 5 0.8 2
"""

from __future__ import annotations

import argparse
import json
import time

from mininet.cli import CLI
from mininet.log import lg, setLogLevel

from fabriclab.apps.paths import path_nodes
from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.measure import telemetry
from fabriclab.results import tables
from fabriclab.table import format_table

LAB_HELP = """Lab commands (Mininet's own commands work too: pingall, h1 ping h2, nodes, net, ...):
  linkdown A B [N]            take the link(s) A-B down (N: only parallel member N), wait for reroute
  linkup A B [N]              bring it back up, wait for reroute
  flap A B [COUNT [DOWN_S [UP_S]]]   down/up COUNT times, holding each state
  paths SRC DST               equal-cost paths between two hosts/ports, given the links that are up
  ports SWITCH                port counters of a switch (bytes, packets, drops, link state)
  uplinks [SECONDS]           fabric link utilization over SECONDS (default 2) and max/mean
  traffic [SECONDS [LOAD [FLOWS]]]   run all-pairs RoCEv2 traffic and show the balance
  collective [OPTIONS]        run a collective nccl-tests style (`collective -h` for options), e.g.
                              collective -c alltoall --sizes 64K,1M --qps 4 --verify
  rate A B MBPS|default       degrade link A-B to MBPS (it stays up), or restore the spec's rate
  ctl                         controller status: generation, links it sees down, recent events
  routing APP[:OPT=V,...]     swap the controller app on the live fabric (ecmp, eecmp, te, flowlet, ar)
  te [json FILE]              the TE app's current placement (or dump it as JSON to FILE)
  stage                       the E-ECMP/flowlet selection stage's counters and flowlet gaps
  queues [NODE|PORT] [all]    queue model counters per port and class (occupancy, marks, drops,
                              pauses); `all` also lists idle ports. Needs a spec with queues:
  ecn TARGET MODE [KMIN KMAX [PMAX]]   change ECN marking live: TARGET leaf|spine|SWITCH|PORT,
                              MODE red|step|off (default: back to the spec), sizes like 20K
  storm HOST SECONDS          HOST's NIC streams PFC pauses at its leaf for SECONDS (0 stops it)
  buffer SW FRACTION|default  cut SW's usable buffer to FRACTION of each port's; what would queue
                              past it is tail-dropped, lossless class too (seed 000, 6.4.2)
  latency SW|A-B US|default    every packet through switch SW (or each way over link A-B) waits US
                              microseconds (real, scaled like the spec's delay) more; needs netem
Failures and watching (every fault is logged with its time; `faults` shows the log):
  switchdown SW / switchup SW  fail a switch (all its cables at once) / bring it back
  slow HOST FRACTION|default  HOST's NICs receive at FRACTION of their rate (a slow receiver)
  restartctl                  stop and restart the controller app; prints how long reprogramming took
  inject FILE                 run the `faults:` timeline of a scenario file in the background, from now
  faults [stop|restore]       the fault log; stop a running timeline; undo every fault still in place
  top [SECONDS [REFRESH]]     live view: uplinks per leaf, downlinks per spine, NICs, links down, faults
  collective ... &            a trailing & runs the collective in the background (see `jobs`)
  jobs                        the jobs run here: running, or their busbw and CCT
  web [ADDR:PORT|stop]        serve the live fabric view (default 127.0.0.1:8765); the URL carries a token
  capture PORT... -w FILE [--filter BPF] [--count N] [--seconds S]   ports to pcapng in the
                              background (`capture` lists them, `capture stop` ends them)"""


class LabPrompt(CLI):
    prompt = "fabriclab> "

    def __init__(self, lab, session=None, **kwargs):
        from fabriclab.workflows.session import Session

        self.lab = lab
        self.session = session or Session(lab)      # its timeline and jobs; the web view's too
        self.captures = []                          # [(lab.capture.Capture, its waiting thread)]
        try:
            super().__init__(lab.net, **kwargs)     # Mininet's CLI runs its loop in here
        finally:
            self.stop_captures()

    # cmd.Cmd calls these; errors become one line, never a traceback at the prompt.
    def onecmd(self, line):
        try:
            return super().onecmd(line)
        except LabError as exc:
            print(f"error: {exc}")
        except (TypeError, ValueError) as exc:
            print(f"error: {exc} (see `help lab`)")
        return False

    def do_help(self, line):
        if line.strip() == "lab" or not line.strip():
            print(LAB_HELP)
            if line.strip():
                return
            print()
        super().do_help(line)

    def _args(self, line, minimum, usage):
        args = line.split()
        if len(args) < minimum:
            raise LabError(f"usage: {usage}")
        return args

    def do_linkdown(self, line):
        """linkdown A B [N]: take the link(s) between A and B down."""
        self._set(line, False)

    def do_linkup(self, line):
        """linkup A B [N]: bring the link(s) between A and B up."""
        self._set(line, True)

    def _set(self, line, up):
        args = self._args(line, 2, f"link{'up' if up else 'down'} A B [N]")
        member = int(args[2]) - 1 if len(args) > 2 else None
        t0 = time.monotonic()
        links = self.lab.set_link(args[0], args[1], up, member)
        print(f"{', '.join(link.label for link in links)} {'up' if up else 'down'}; "
              f"controller reprogrammed in {time.monotonic() - t0:.2f} s")

    def do_flap(self, line):
        """flap A B [COUNT [DOWN_S [UP_S]]]: down/up the link COUNT times."""
        args = self._args(line, 2, "flap A B [COUNT [DOWN_S [UP_S]]]")
        count = int(args[2]) if len(args) > 2 else 1
        down_s = float(args[3]) if len(args) > 3 else 1.0
        up_s = float(args[4]) if len(args) > 4 else 1.0
        if count < 1 or down_s < 0 or up_s < 0:
            raise LabError("flap needs COUNT >= 1 and non-negative hold times")
        reactions = self.lab.flap(args[0], args[1], count, down_s, up_s)
        rows = [(i // 2 + 1, "up" if r["up"] else "down", r["reprogrammed_s"]) for i, r in enumerate(reactions)]
        print(format_table(("flap", "state", "reprogram s"), rows))

    def do_paths(self, line):
        """paths SRC DST: equal-cost paths between two hosts (or host ports / addresses)."""
        args = self._args(line, 2, "paths SRC DST")
        paths = self.lab.paths(args[0], args[1])
        a, b = self.lab.fabric.host_port(args[0]), self.lab.fabric.host_port(args[1])
        if not paths:
            print(f"no path from {a.intf} ({a.ip}) to {b.intf} ({b.ip})"
                  + (" (different planes)" if a.plane != b.plane else ""))
            return
        print(f"{len(paths)} equal-cost path(s) from {a.intf} ({a.ip}) to {b.intf} ({b.ip}):")
        for path in paths:
            nodes = " > ".join(path_nodes(path, a.leaf))
            print(f"  {a.intf} > {nodes} > {b.intf}    [{' '.join(link.label for link in path)}]")

    def do_ports(self, line):
        """ports SWITCH: counters of every port of a switch."""
        args = self._args(line, 1, "ports SWITCH")
        switch = args[0]
        if switch not in self.lab.fabric.switches:
            raise LabError(f"no switch {excerpt(switch)} (switches: {', '.join(sorted(self.lab.fabric.switches))})")
        ports = self.lab.fabric.switch_ports(switch)
        counters, drops, states = telemetry.switch_ports_now(self.lab, switch)
        rows = []
        for port_no, intf in ports.items():
            c = counters.get(intf, {})
            state = states.get(intf, "missing") if c else "missing"
            rows.append((port_no, intf, state, c.get("tx_bytes"), c.get("rx_bytes"), c.get("tx_packets"),
                         c.get("rx_packets"), drops.get(intf)))
        print(format_table(("port", "interface", "state", "tx bytes", "rx bytes", "tx pkts", "rx pkts",
                            "buffer drops"), rows))

    def do_uplinks(self, line):
        """uplinks [SECONDS]: fabric link utilization measured over SECONDS."""
        seconds = float(line.split()[0]) if line.split() else 2.0
        if seconds <= 0:
            raise LabError("uplinks needs SECONDS > 0")
        before = telemetry.lab_snapshot(self.lab)
        time.sleep(seconds)
        rows = telemetry.link_utilization(self.lab.fabric, before, telemetry.lab_snapshot(self.lab))
        print(tables.uplink_table(rows, title=None))
        for direction in ("up", "down"):
            b = telemetry.balance(rows, direction)
            print(f"{direction}links: mean {b['mean_mbps']} Mbit/s, max {b['max_mbps']}, "
                  f"max/mean {b['max_mean_ratio']}")

    def do_traffic(self, line):
        """traffic [SECONDS [LOAD [FLOWS]]]: all-pairs RoCEv2 traffic, then the balance."""
        from fabriclab.traffic.allpairs import AllPairsSpec
        from fabriclab.workflows.plan import Job, single_run

        args = line.split()
        seconds = float(args[0]) if args else 5.0
        load = float(args[1]) if len(args) > 1 else 0.8
        flows = int(args[2]) if len(args) > 2 else 1
        spec = self.lab.fabric.spec
        workload = AllPairsSpec(duration_s=seconds, load=load, flows_per_pair=flows)
        plan = single_run(f"{spec.name}-traffic", "prompt", spec, Job("traffic", workload),
                          routing=self.lab.routing, source={"command": f"traffic {line}".strip()})
        doc = self._run(plan, f"traffic {line}".strip())
        _run, _name, job = tables.job_of(doc, "all-pairs")
        t = job["traffic"]
        print(f"{t['flows']} flows: delivered {t['delivered_mbps']} Mbit/s, loss "
              f"{100 * (t['loss'] or 0):.2f} %, OOS {t['oos']}; uplink max/mean "
              f"{job['balance']['up'].get('max_mean_ratio')}; results {doc['folder']}")

    def _run(self, plan, label):
        """A plan on this prompt's fabric (shared: faults made here stay in place)."""
        return self.session.run(plan, label)

    def do_collective(self, line):
        """collective [OPTIONS]: a collective on this fabric; `collective -h` lists the options."""
        import shlex

        from fabriclab.cli import collective as collective_cmd

        words = shlex.split(line)
        background = bool(words) and words[-1] == "&"
        try:
            args = collective_cmd.prompt_parser().parse_args(words[:-1] if background else words)
        except SystemExit:          # argparse printed the usage or the problem
            return
        except argparse.ArgumentError as exc:
            raise LabError(str(exc)) from None
        cspec = collective_cmd.spec_from_args(args)
        plan = collective_cmd.collective_plan(self.lab.fabric.spec, self.lab.routing, cspec, args, kind="prompt")
        label = f"collective {line.replace('&', '').strip()}".strip()
        if not background:
            doc = self._run(plan, label)
            print(tables.collective_table(doc))
            print(f"results: {doc['folder']}")
            return
        record = self.session.run(plan, label, background=True)
        print(f"[{record.number}] started in the background: {label} (`jobs`, `top`)")

    def do_jobs(self, _line):
        """jobs: the collectives and traffic run here, and their results."""
        jobs = self.session.jobs()
        if not jobs:
            print("no jobs yet (start one in the background with `collective ... &`)")
        for job in jobs:
            state = job["state"]
            if state == "done":
                state = f"done: busbw {job['busbw']}, CCT p50 {job['cct']}; results {job['results']}"
            print(f"[{job['number']}] {job['label']}: {state}")

    def do_switchdown(self, line):
        """switchdown SW: fail a switch."""
        self._switch(line, False)

    def do_switchup(self, line):
        """switchup SW: bring a failed switch back."""
        self._switch(line, True)

    def _switch(self, line, up):
        name = self._args(line, 1, f"switch{'up' if up else 'down'} SW")[0]
        t0 = time.monotonic()
        links = self.lab.set_switch(name, up)
        print(f"{name} {'up' if up else 'down'} ({len(links)} cables); controller reprogrammed in "
              f"{time.monotonic() - t0:.2f} s")

    def do_slow(self, line):
        """slow HOST FRACTION|default: a slow receiver."""
        host, value = self._args(line, 2, "slow HOST FRACTION|default")[:2]
        fraction = None if value == "default" else float(value)
        self.lab.slow_receiver(host, fraction)
        print(f"{host} receives at {'its line rate' if fraction is None else f'{fraction:g} of its line rate'}")

    def do_buffer(self, line):
        """buffer SW FRACTION|default: a buffer fault (its ports tail-drop past FRACTION)."""
        switch, value = self._args(line, 2, "buffer SW FRACTION|default")[:2]
        try:
            fraction = None if value == "default" else float(value)
        except ValueError:
            raise LabError(f"buffer: {excerpt(value)} is not a fraction in (0, 1] or `default`") from None
        ports = self.lab.cut_buffer(switch, fraction)
        print(f"{switch}: {len(ports)} ports " + ("with their whole buffer" if fraction in (None, 1)
                                                  else f"tail-drop past {fraction:g} of their buffer"))

    def do_latency(self, line):
        """latency SW|A-B US|default: a latency fault on a switch or a link."""
        target, value = self._args(line, 2, "latency SW|A-B US|default")[:2]
        try:
            us = None if value == "default" else float(value)
        except ValueError:
            raise LabError(f"latency: {excerpt(value)} is not microseconds or `default`") from None
        from fabriclab.workflows.faultsteps import split_link

        where = target if target in self.lab.fabric.switches or "-" not in target else \
            self.lab.resolve_link(*split_link(target))
        ports = self.lab.set_latency(where, us)
        print(f"{target}: {len(ports)} ports " + (f"{us:g} us (real) slower" if us else "at the spec's delay"))

    def do_restartctl(self, _line):
        """restartctl: restart the controller app."""
        took = self.lab.restart_controller()
        print(f"controller {self.lab.routing} restarted; fabric programmed again after {took:.2f} s")

    def do_inject(self, line):
        """inject FILE: run a scenario file's faults: timeline in the background, from now."""
        from fabriclab.loading import load_yaml

        path = self._args(line, 1, "inject FILE")[0]
        data = load_yaml(path, "fault file")
        steps = self.session.inject(data.get("faults") if isinstance(data, dict) else data)
        last = steps[-1].t if steps else 0
        print(f"{len(steps)} fault step(s) over {last:g} s started (`faults` shows them as they happen)")

    def do_faults(self, line):
        """faults [stop|restore]: the fault log; stop the timeline; undo what is still in place."""
        arg = line.strip()
        if arg == "stop":
            print("fault timeline stopped (`faults restore` undoes what it left in place)"
                  if self.session.stop_timeline() else "no fault timeline is running")
        elif arg == "restore":
            self.lab.restore()
            print("every link up, at its spec rate and without loss")
        elif arg:
            raise LabError("usage: faults [stop|restore]")
        rows = [(time.strftime("%H:%M:%S", time.localtime(e["time"])) + f".{int(e['time'] * 1000) % 1000:03d}",
                 e["event"], e["target"], " ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event", "target")))
                for e in self.lab.events[-20:]]
        print(format_table(("time", "event", "target", "detail"), rows) if rows else "no faults so far")
        state = self.lab.injected()
        print(f"in place: links down {', '.join(state['links_down']) or 'none'}; "
              f"reshaped {', '.join(state['reshaped']) or 'none'}; lossy {', '.join(state['lossy']) or 'none'}; "
              f"buffers cut {', '.join(state['buffer_cuts']) or 'none'}; latency {', '.join(state['latency']) or 'none'}"
              + ("; a timeline is running" if self.session.timeline_running() else ""))

    def do_top(self, line):
        """top [SECONDS [REFRESH]]: the live view."""
        from fabriclab.cli import top

        args = line.split()
        seconds = float(args[0]) if args else None
        refresh = float(args[1]) if len(args) > 1 else top.REFRESH_S
        if (seconds is not None and seconds <= 0) or refresh < 0.1:
            raise LabError("top needs SECONDS > 0 and REFRESH >= 0.1")
        top.watch(self.lab, seconds, refresh)

    def do_rate(self, line):
        """rate A B MBPS|default: shape the link(s) A-B to MBPS, or back to the spec's rate."""
        a, b, value = self._args(line, 3, "rate A B MBPS|default")[:3]
        rate = None if value == "default" else float(value)
        links = self.lab.set_rate(a, b, rate)
        print(f"{', '.join(link.label for link in links)}: "
              f"{'spec rate' if rate is None else f'{rate:g} Mbit/s'}")

    def do_loss(self, line):
        """loss A B FRACTION|off, or loss fabric FRACTION|off: random loss on a link or every link."""
        args = line.split()
        if len(args) == 2 and args[0] == "fabric":
            links, value = list(self.lab.fabric.links), args[1]
        elif len(args) == 3:
            links, value = self.lab.resolve_link(args[0], args[1]), args[2]
        else:
            raise LabError("usage: loss A B FRACTION|off, or loss fabric FRACTION|off")
        try:
            fraction = 0.0 if value == "off" else float(value)
        except ValueError:
            raise LabError(f"loss: {excerpt(value)} is not a fraction (0.01 is 1 %) or `off`") from None
        if not 0 <= fraction < 1:
            raise LabError(f"loss: the fraction must be in [0, 1), got {value}")
        self.lab.set_loss(links, fraction)
        where = "every link" if args[0] == "fabric" else ", ".join(link.label for link in links)
        print(f"{where}: {'no loss' if not fraction else f'{fraction:.3%} of packets lost each way'}")

    def do_ctl(self, _line):
        """ctl: what the controller sees."""
        status = self.lab.controller.status()
        print(f"app {status.get('app')}  generation {status.get('generation')}  "
              f"programmed {status.get('programmed')}  connected {len(status.get('connected', []))}"
              f"/{len(self.lab.fabric.switches)}")
        for key in status.get("down_links", []):
            print(f"  down: {key[0]}:{key[1]} - {key[2]}:{key[3]}")
        for problem in status.get("mismatches", []):
            print(f"  mismatch: {problem}")
        for event in status.get("events", [])[-8:]:
            print(f"  {time.strftime('%H:%M:%S', time.localtime(event['time']))} {event['event']} "
                  f"{event['subject']}")


    def do_routing(self, line):
        """routing APP[:OPT=V,...]: replace the controller app on the live fabric."""
        args = self._args(line, 1, "routing APP[:OPTION=VALUE,...]")
        status = self.lab.set_routing(args[0])
        print(f"routing {status.get('app')} {status.get('options') or ''} programmed "
              f"(generation {status.get('generation')})")

    def do_te(self, line):
        """te [json FILE]: the TE placement."""
        placement = self.lab.te_placement()
        if placement is None:
            raise LabError("no TE placement: the controller is not running the te app (`routing te`)")
        args = line.split()
        if args[:1] == ["json"]:
            if len(args) != 2:
                raise LabError("usage: te json FILE")
            with open(args[1], "w") as f:
                json.dump(placement, f, indent=1)
            print(f"placement written to {args[1]}")
            return
        print(f"recomputes {placement.get('recomputes')} (every {placement.get('period_s')} s, last "
              f"{placement.get('compute_ms')} ms)  jobs {', '.join(placement.get('jobs') or []) or '-'}  "
              f"demands {len(placement.get('demands', []))}")
        rows = [(p["leaf"], p["host_port"], p["dst_prefix"], p["mbps"], p["source"], p["uplink_intf"],
                 " ".join(p["path"]), p["free_after_mbps"]) for p in placement.get("placed", [])]
        print(format_table(("leaf", "source NIC", "destination", "Mbit/s", "from", "uplink", "path",
                            "free after"), rows))
        for u in placement.get("unplaced", []):
            print(f"  unplaced: {u['host_port']} -> {u['dst_leaf']} {u['mbps']} Mbit/s: {u['reason']}")

    def do_stage(self, _line):
        """stage: the selection stage's counters."""
        stats = self.lab.stage_stats()
        if stats is None:
            raise LabError("no selection stage: the controller is not running eecmp or flowlet")
        gaps = stats.pop("gap_histogram_us")
        print("  ".join(f"{k} {v}" for k, v in stats.items()))
        if gaps:
            print("gaps between a flow's packets (us): " + "  ".join(f"{k}: {v}" for k, v in gaps.items()))

    def _queues(self):
        if self.lab.queues is None:
            raise LabError("this fabric runs without the queue model; add a queues: section to its spec")
        return self.lab.queues

    def do_queues(self, line):
        """queues [NODE|PORT] [all]: the queue model's counters."""
        args = line.split()
        show_all = "all" in args
        target = next((a for a in args if a != "all"), None)
        model = self._queues()
        rows = model.counters(nonzero=not show_all)
        if target:
            rows = [r for r in rows if target in (r["node"], r["port"])]
            if not rows and target not in model.by_name and target not in {p.node for p in model.ports}:
                raise LabError(f"no node or port {excerpt(target)}")
        print(format_table(
            ("port", "class", "tx pkts", "queue B", "max queue B", "held B", "marks", "drops",
             "XOFF sent", "paused ms", "XOFF rcvd", "gate"),
            [(r["port"], r["class"], r["tx_pkts"], r["occ"], r["occ_hwm"], r["held"], r["marks"],
              r["drops"] + r["lossless_drops"] + r["wd_drops"], r["pause_tx"], r["pause_ms"], r["pause_rx"],
              ("closed" if r.get("gate_closed") else "open") if r["class"] == "lossless" else "")
             for r in rows]))
        for alarm in model.alarms()[-5:]:
            print(f"  watchdog: {alarm['port']} paused {alarm['paused_ms']} ms -> {alarm['action']}")
        for error in model.errors()[-3:]:
            print(f"  PFC agent error: {error}")

    def do_ecn(self, line):
        """ecn TARGET MODE [KMIN KMAX [PMAX]]: change ECN marking on a running fabric."""
        from fabriclab.units import parse_size

        args = self._args(line, 2, "ecn TARGET red|step|off|default [KMIN KMAX [PMAX]]")
        if args[1] == "default":
            ports = self._queues().set_ecn(args[0], reset=True)
            print(f"ECN as the spec says on {len(ports)} port(s)")
            return
        kmin = parse_size(args[2]) if len(args) > 2 else None
        kmax = parse_size(args[3]) if len(args) > 3 else None
        pmax = float(args[4]) if len(args) > 4 else None
        ports = self._queues().set_ecn(args[0], mode=args[1], kmin=kmin, kmax=kmax, pmax=pmax)
        print(f"ECN {args[1]} on {len(ports)} port(s): {', '.join(ports[:8])}{' ...' if len(ports) > 8 else ''}")

    def do_web(self, line):
        """web [ADDR:PORT|stop]: serve the live fabric view, or stop serving it."""
        from fabriclab.view.server import DEFAULT_ADDRESS, WebServer

        arg = line.strip()
        if arg == "stop":
            stopped = self.session.web is not None
            if stopped:
                self.session.web.stop()
                self.session.web = None
            print("web view stopped" if stopped else "no web view is running")
            return
        if self.session.web is not None:
            print(self.session.web.banner() + " (already running; `web stop` ends it)")
            return
        self.session.web = WebServer(self.lab, self.session, arg or DEFAULT_ADDRESS).start()
        print(self.session.web.banner())

    def do_capture(self, line):
        """capture PORT... -w FILE [--filter BPF] [--count N] [--seconds S] | stop: ports to pcapng."""
        import shlex
        import threading

        from fabriclab.cli import capture as capture_cmd
        from fabriclab.lab import capture

        words = shlex.split(line)
        if not words or words == ["stop"]:
            for job, thread in self.captures:
                if words:
                    job.stop("capture stop")
                thread.join(timeout=10 if words else 0)
                print(f"{', '.join(n for n, _ in job.ports)}: "
                      + (capture_cmd.summary(job.result) if job.result else f"{job.packets} packets so far"))
            if words or not self.captures:
                print("no capture is running" if not self.captures else "captures stopped")
            self.captures = [c for c in self.captures if c[0].result is None]
            return
        parser = argparse.ArgumentParser(prog="capture", exit_on_error=False)
        capture_cmd.add_capture_args(parser, "pcapng file to write", write_required=True)
        try:
            args = parser.parse_args(words)
        except SystemExit:          # argparse printed the usage or the problem
            return
        except argparse.ArgumentError as exc:
            raise LabError(str(exc)) from None
        job, out = capture.start(self.lab.run, args.ports, args.write, bpf=args.filter, count=args.count,
                                 seconds=args.seconds, snaplen=args.snaplen)
        # tcpdump dies with the thread that started it (PR_SET_PDEATHSIG): started here, waited on there
        thread = threading.Thread(target=lambda: (job.wait(), out.close()), daemon=True)
        thread.start()
        self.captures.append((job, thread))
        print(f"capturing {', '.join(args.ports)} to {args.write} (`capture stop` ends it)")

    def stop_captures(self):
        for job, thread in self.captures:
            job.stop("the prompt ended")
            thread.join(timeout=10)
        self.captures = []

    def do_storm(self, line):
        """storm HOST SECONDS: a PFC pause storm from HOST's NIC at its leaf port."""
        host, seconds = self._args(line, 2, "storm HOST SECONDS")[:2]
        port = self._queues().storm(host, float(seconds))
        print(f"{port}: paused by {host} for {float(seconds):g} s" if float(seconds) else f"{port}: storm over")


def run_prompt(lab, script=None, session=None):
    # Mininet prints node commands' output (`h1 ping h2`) at its 'output' log level.
    previous = lg.getEffectiveLevel()
    if not lab.verbose:
        setLogLevel("output")
    try:
        LabPrompt(lab, session, script=script)
    finally:
        lg.setLevel(previous)
