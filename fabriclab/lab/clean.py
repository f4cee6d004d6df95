"""`fabriclab clean`: remove what killed runs left behind, exactly as their run records say.

For each run whose owning process is gone: stop the processes it recorded (only if the PID still
runs the recorded command), delete its OVS bridges and its root-namespace interfaces, and drop
the record. Bridges tagged with a run id that has no live run are deleted too, so a record lost
mid-write still gets repaired. Killing the Mininet shells is what frees the hosts' namespaces.
Network namespaces left by a killed `doctor` probe (flprobe-<pid>, pid gone) go too, and so do the
queue model's pinned eBPF programs (/sys/fs/bpf/fabriclab/<run id>) of runs that are gone, and
soft-RoCE leftovers of collectives (rdma devices on interfaces no live run owns, policy rules of
ours whose table is empty).
Processes started with a file of a gone run's folder in their arguments (agents a kill caught
before the record did) are stopped too. Nothing is matched by name alone, and live runs are left
alone unless --all is given.
"""

from __future__ import annotations

import os
import subprocess
import shutil

from fabriclab.system.doctor import cleanup_stale_probes
from fabriclab.queues.datapath import pinned_runs, remove_pins
from fabriclab.queues.model import WIRE_PRIO
from fabriclab.lab.runstate import FOLDER_MARK, RUN_ROOT, RunState, is_lab_link_group
from fabriclab.lab.teardown import delete_bridges, delete_link_group, interfaces_in_group, tagged_bridges
from fabriclab.system.procs import pid_alive, stop_recorded, with_argument_under
from fabriclab.traffic import softroce


def remove_run(run):
    """Remove what `run`'s record names (its owner is gone); one line saying what."""
    stopped = len(stop_recorded(run.data.get("processes", [])))
    # Only what carries the run's marks: its bridges by their OVS tag, its interfaces by the
    # link group it allocated. An object that merely has a recorded name (a user's own `s1`
    # after a killed run) is left alone, and so is a group outside the lab's range.
    group = run.data.get("link_group")
    ours = is_lab_link_group(group)
    intfs = interfaces_in_group(group, run.data.get("interfaces", [])) if ours else []
    if ours:
        delete_link_group(group)
        for dev in run.data.get("wire", []):
            # its handle is the run's link group: another run's filter there is left alone
            subprocess.run(["tc", "filter", "del", "dev", dev, "egress", "prio", str(WIRE_PRIO),
                            "handle", str(group), "bpf"], capture_output=True)
    tagged = tagged_bridges()
    bridges = [b for b in run.data.get("bridges", []) if tagged.get(b, (None,))[0] == run.id]
    delete_bridges(bridges)
    remove_pins(run.id)
    folders = remove_folders(run)
    run.remove()
    return (f"run {run.id}: stopped {stopped} processes, deleted {len(bridges)} bridges "
            f"and {len(intfs)} interfaces" + (f" and {folders} folders" if folders else "")
            + ("" if ours or group is None else f" (link group {group} is not the lab's: "
                                                "its interfaces were left alone)"))


def remove_folders(run):
    """Delete the folders `run` made outside its run folder that still carry its mark (a folder
    since reused, or never marked, is left alone); how many went."""
    gone = 0
    for path in run.data.get("folders", []):
        try:
            with open(os.path.join(path, FOLDER_MARK)) as f:
                if f.read(80).strip() != run.id:
                    continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        gone += 1
    return gone


def clean(all_runs=False):
    """Returns one line per action taken, for the user."""
    report = []
    live_ids = set()
    live_interfaces = set()
    for run in RunState.all():
        if run.live and not all_runs:
            live_ids.add(run.id)
            live_interfaces.update(run.data.get("interfaces", []))
            report.append(f"run {run.id} is live (pid {run.data['pid']}): left alone (use --all)")
            continue
        report.append(remove_run(run))
    # Agents started just before a kill may never have reached the record; they were started
    # with their run's folder in their arguments, which marks them as that run's.
    runs_dir = f"{RUN_ROOT / 'runs'}/"
    for pid, arg in with_argument_under(runs_dir):
        run_id = arg[len(runs_dir):].split("/", 1)[0]
        if run_id not in live_ids and pid != os.getpid() and stop_recorded([{"pid": pid, "match": arg}]):
            report.append(f"process {pid} of vanished run {run_id}: stopped")
    for bridge, (run_id, pid) in sorted(tagged_bridges().items()):
        if run_id in live_ids:
            continue
        if pid and pid_alive(pid) and not all_runs:
            report.append(f"bridge {bridge} of run {run_id} belongs to live process {pid} (a lab "
                          f"under another run root?): left alone (use --all)")
            continue
        delete_bridges([bridge])
        report.append(f"bridge {bridge} of vanished run {run_id}: deleted")
    for run_id in pinned_runs():
        if run_id not in live_ids:
            remove_pins(run_id)
            report.append(f"eBPF programs and maps (queue model, routing stage) of vanished run {run_id}: unpinned")
    for name in cleanup_stale_probes():
        report.append(f"namespace {name} of a killed `doctor` probe: deleted")
    report += softroce.remove_leftovers(live_interfaces)
    return report
