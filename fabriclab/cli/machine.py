"""Verbs about the machine: provision, doctor, the full-kernel test tier, clean."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading

from fabriclab.errors import LabError
from fabriclab.lab import clean as lab_clean
from fabriclab.loading import clip
from fabriclab.system import doctor, fleet, fullkernel, provision


def register(subparsers):
    register_provision(subparsers)
    register_doctor(subparsers)
    register_fullkernel(subparsers)
    register_clean(subparsers)


# -- provision ----------------------------------------------------------------------------------
def register_provision(subparsers):
    parser = subparsers.add_parser(
        "provision",
        help="install and start what the lab needs (runs playbooks/site.yml); needs root",
        description="Install the lab's packages, start Open vSwitch and keep the lab's virtualenv "
                    "installed, by running playbooks/site.yml on this machine. Safe to re-run: "
                    "a provisioned machine reports 0 changed.")
    parser.add_argument("--check", action="store_true",
                        help="check mode: report what would change, change nothing")
    parser.add_argument("--venv", metavar="DIR",
                        help="the lab's virtualenv (default: the venv this command runs from, "
                             "else <project>/.venv)")
    parser.set_defaults(func=run_provision)


def _current_venv():
    return sys.prefix if sys.prefix != sys.base_prefix else None


def run_provision(args):
    result = provision.provision(provision.PROJECT_DIR, venv_dir=args.venv or _current_venv(), check=args.check)
    result.raise_for_failure()
    print(provision.summary_line(result))
    return 0


# -- doctor -------------------------------------------------------------------------------------
def register_doctor(subparsers):
    parser = subparsers.add_parser(
        "doctor",
        help="probe the kernel and show which mechanism the lab uses for each feature",
        description="Probe this machine (by really trying each mechanism) and show, per lab "
                    "feature, whether it works and what the lab will use. Exits 1 if something "
                    "required is missing.")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="output format (default: table)")
    parser.add_argument("--inventory", metavar="FILE",
                        help="check every lab machine of this ansible inventory instead: reachable, "
                             "the same lab version, nothing required missing (exits 1 if one is not)")
    parser.set_defaults(func=run_doctor)


def run_doctor(args):
    if getattr(args, "inventory", None):
        return _doctor_machines(args)
    caps = doctor.probe()
    mechs = doctor.mechanisms(caps)
    tier = fullkernel.probe()
    if args.format == "json":
        doc = json.loads(doctor.render_json(caps, mechs))
        doc["fullkernel_tier"] = dataclasses.asdict(tier)
        doc["lab"] = fleet.lab_identity()
        doc["addresses"] = fleet.local_addresses()
        print(json.dumps(doc, indent=2))
    else:
        print(f"kernel {caps.kernel}; OVS bridges will use datapath_type="
              f"{doctor.ovs_datapath_type(caps)}")
        print(doctor.render_table(mechs))
        state = f"available ({tier.how}, kernel {tier.kernel})" if tier.available else "unavailable"
        print(f"full-kernel test tier: {state}: {tier.note}")
    missing = doctor.missing_required(mechs)
    if missing:
        print("fabriclab doctor: " + doctor.missing_message(missing), file=sys.stderr)
        return 1
    return 0


def _doctor_machines(args):
    checks = fleet.check_machines(args.inventory)
    if args.format == "json":
        print(json.dumps([{**dataclasses.asdict(c), "ready": c.ready} for c in checks], indent=2))
    else:
        print(fleet.render_checks(checks))
    not_ready = [c.machine for c in checks if not c.ready]
    if not_ready:
        print(f"fabriclab doctor: {len(not_ready)} of {len(checks)} machine(s) not ready: "
              f"{', '.join(not_ready)}", file=sys.stderr)
        return 1
    return 0


# -- fullkernel ---------------------------------------------------------------------------------
def register_fullkernel(subparsers):
    p = subparsers.add_parser(
        "fullkernel", help="the full-kernel test tier: run tests on a kernel with OVS, RED, netem and "
                           "rdma_rxe (a virtme-ng guest when this kernel lacks them)")
    p.add_argument("action", choices=("status", "test", "machine"),
                   help="status: how the tier would run here; test: run pytest on it; machine: boot its "
                        "guest as a second lab machine (SSH over a virtual wire) until Ctrl-C")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="PYTEST_ARGS",
                   help="after `test`, everything is pytest's (so fabriclab's options go before the "
                        "action); default: -m fullkernel over the files of tests/lab that hold such "
                        "tests (collected here first) -rfEs")
    p.add_argument("--timeout", type=float, default=fullkernel.DEFAULT_TIMEOUT_S,
                   help=f"seconds before the whole run is stopped (default {fullkernel.DEFAULT_TIMEOUT_S:.0f})")
    p.add_argument("--kernel", help="a vmlinuz to boot (default: the newest in /boot with the modules)")
    p.add_argument("--guest", action="store_true",
                   help="boot a guest even when the running kernel is complete")
    p.add_argument("--kvm", action="store_true",
                   help="run the guest with KVM instead of software emulation (where nested KVM works)")
    p.add_argument("--inventory", metavar="FILE", default="guest-inventory.ini",
                   help="machine: where to write the ansible inventory of this machine and the guests "
                        "(default guest-inventory.ini)")
    p.add_argument("--guests", metavar="N", type=int, default=1,
                   help="machine: how many guests to boot on the wire (default 1, at most 4): this "
                        "machine and N guests are N+1 lab machines")
    p.set_defaults(func=cmd_fullkernel)


def cmd_fullkernel(args):
    if args.action == "status":
        tier = fullkernel.probe(args.kernel, args.guest, kvm=args.kvm)
        state = f"available ({tier.how}, kernel {tier.kernel})" if tier.available else "unavailable"
        print(f"full-kernel tier: {state}: {tier.note}")
        return 0 if tier.available else 1
    if args.action == "machine":
        # after the action argparse hands everything to pytest_args: read --inventory there too
        tail = argparse.ArgumentParser(prog="fabriclab fullkernel machine")
        tail.add_argument("--inventory", default=args.inventory)
        tail.add_argument("--guests", type=int, default=args.guests)
        rest = tail.parse_args(args.pytest_args or [])
        args.inventory, args.guests = rest.inventory, rest.guests
        return run_guest_machine(args)
    pytest_args = list(args.pytest_args or fullkernel.default_selection())
    if pytest_args and pytest_args[0] == "--":
        pytest_args = pytest_args[1:]
    from fabriclab.lab.runstate import RunState

    # a guest's vng and qemu go in a run record of their own: `clean` stops what a SIGKILL left
    result = fullkernel.run_tests(pytest_args, args.timeout, args.kernel, args.guest, kvm=args.kvm,
                                  registry=lambda: RunState.create("fullkernel-tier"))
    boot = f", guest booted in {result.boot_s:.0f} s" if result.boot_s is not None else ""
    print(f"full-kernel tier: pytest exit {result.exit_code} on {result.kernel} ({result.how}{boot}, "
          f"{result.total_s:.0f} s in all)", flush=True)
    return result.exit_code


def run_guest_machine(args):
    from fabriclab.cluster.guestmachine import GuestMachine, check_count

    # before a half-minute boot, not after it
    check_count(args.guests, "--guests")
    folder = os.path.dirname(os.path.abspath(args.inventory))
    if os.path.isdir(args.inventory) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise LabError(f"--inventory {clip(args.inventory)}: cannot write a file there")
    doctor.require_environment()
    stop = threading.Event()
    # SIGINT too, set here: a shell starts a background job with SIGINT ignored, and Python then
    # never raises KeyboardInterrupt, so `kill -INT` (Ctrl-C's signal) would not stop it
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with GuestMachine(args.kernel, kvm=args.kvm, count=args.guests) as machines:
            path = machines.inventory(args.inventory, project_dir=str(provision.PROJECT_DIR))
            where = ", ".join(f"{g.name} at {g.address}" for g in machines.guests)
            print(f"guest machine: {machines.tier.kernel}: {where}, up in {machines.boot_s:.0f} s; "
                  f"inventory: {path}", flush=True)
            print(f"  e.g. sudo .venv/bin/fabriclab doctor --inventory {path}; Ctrl-C stops it", flush=True)
            while not stop.wait(1.0) and all(g.proc.poll() is None for g in machines.guests):
                pass
            ended = [g for g in machines.guests if g.proc is not None and g.proc.poll() is not None]
            if ended:
                print(f"guest machine: {ended[0].name}'s qemu exited ({ended[0].proc.returncode})", file=sys.stderr)
                return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("guest machine: stopped, its wire removed")
    return 0


# -- clean --------------------------------------------------------------------------------------
def register_clean(subparsers):
    p = subparsers.add_parser("clean", help="remove what killed runs left (bridges, veths, "
                                            "namespaces, controller and agent processes)")
    p.add_argument("--all", action="store_true", help="also tear down runs that are still live")
    p.add_argument("--inventory", metavar="FILE",
                   help="clean every lab machine of this ansible inventory instead (exits 1 if one "
                        "cannot be reached or cleaned)")
    p.set_defaults(func=run_clean)


def run_clean(args):
    if getattr(args, "inventory", None):
        failed = 0
        for machine, ok, lines in fleet.clean_machines(args.inventory, args.all):
            failed += not ok
            print("\n".join(f"{machine}: {line}" for line in lines))
        return 1 if failed else 0
    doctor.require_environment()
    report = lab_clean.clean(all_runs=args.all)
    print("\n".join(report) if report else "nothing to clean")
    return 0
