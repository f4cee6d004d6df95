"""The lab/controller protocol (apps/control.py): file names, atomic writers, tolerant readers,
the status document, the controller's command line and its one watcher of the lab's files."""

import json
import threading

import pytest

from fabriclab.apps import APPS, control
from fabriclab.apps.control import (AppConfig, InboxWatcher, Job, RunFiles, StageStatus, SteeringPlan,
                                    SteeringStatus, Status, TeStatus)
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


@pytest.fixture
def files(tmp_path):
    return RunFiles(tmp_path)


def test_the_files_of_a_run_folder(files, tmp_path):
    assert [p.name for p in (files.fabric, files.status, files.jobs, files.steering, files.te_placement)] == \
        ["fabric.json", "controller.json", "jobs.json", "steering.json", "te-placement.json"]
    assert all(p.parent == tmp_path for p in (files.status, files.jobs))


def test_writes_replace_the_file_whole_and_leave_no_temporary(files, tmp_path):
    control.write_json(files.jobs, {"a": 1})
    control.write_json(files.jobs, {"b": 2})
    assert json.loads(files.jobs.read_text()) == {"b": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["jobs.json"]


def test_concurrent_writers_never_leave_a_half_written_file(files):
    def write(n):
        for i in range(50):
            control.write_jobs(files.jobs, {f"job{n}": Job.of([("10.1.1.1", "10.1.2.1", i)] * 50)})
    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        jobs = control.read_jobs(files.jobs)
        assert all(len(job.pairs) == 50 for job in jobs.values())
    for t in threads:
        t.join()
    assert len(control.read_jobs(files.jobs)) == 1


@pytest.mark.parametrize("content", [None, "", "{\"jobs\": {\"a\": {\"pai", "[1, 2]", "not json"])
def test_readers_are_tolerant_of_missing_partial_and_foreign_files(files, content):
    for path in (files.jobs, files.steering, files.status, files.te_placement):
        if content is not None:
            path.write_text(content)
    assert control.read_jobs(files.jobs) == {}
    assert control.read_steering(files.steering) is None
    assert control.read_status(files.status) == Status()
    assert control.read_placement(files.te_placement) is None


def test_jobs_round_trip_and_a_malformed_pair_loses_only_itself(files):
    jobs = {"ring": Job.of([("10.1.1.1", "10.1.2.1", 300), ["10.1.1.1", "10.1.1.2", 100]], when=5.0)}
    control.write_jobs(files.jobs, jobs)
    assert control.read_jobs(files.jobs) == jobs
    assert jobs["ring"].pairs[1] == ("10.1.1.1", "10.1.1.2", 100)
    files.jobs.write_text(json.dumps({"jobs": {"a": {"pairs": [["x", "y", 1], ["short"], ["x", "y", "n"]]},
                                               "b": "not a job"}}))
    assert control.read_jobs(files.jobs) == {"a": Job((("x", "y", 1),), 0.0)}


def test_a_steering_plan_round_trips_with_its_generation(files):
    plan = SteeringPlan("123-1", {"services": [{"switch": "l1"}]})
    control.write_steering(files.steering, plan)
    assert control.read_steering(files.steering) == plan
    files.steering.write_text(json.dumps({"generation": 7, "plan": "nonsense"}))
    assert control.read_steering(files.steering) == SteeringPlan("7", {})


def test_the_status_round_trips_through_its_json_document(files):
    status = Status(app="te", options={"period_s": 0.5}, pid=12, time=3.5, generation=9,
                    connected=("l1", "s1"), synced={"l1": 9, "s1": 8}, programmed=True,
                    down_links=frozenset({("l1", 3, "s1", 1)}), mismatches=("l1: port 9 missing",),
                    unknown_dpids=(77,), switch_errors=("s1: error",),
                    events=({"time": 1.0, "event": "port_down", "subject": "l1:3"},),
                    steering=SteeringStatus("g", ""), te=TeStatus(recomputes=2, jobs=("ring",), last=4.0),
                    stage=StageStatus("hash", "/sys/fs/bpf/x", 3, 8, 2.0))
    control.write_status(files.status, status)
    assert control.read_status(files.status) == status
    doc = json.loads(files.status.read_text())
    # the keys the prompt's `ctl` and older readers use
    assert doc["down_links"] == [["l1", 3, "s1", 1]] and doc["programmed"] is True
    assert doc["steering"] == {"generation": "g", "error": ""} and doc["te"]["jobs"] == ["ring"]
    control.write_status(files.status, Status(app="ecmp"))
    assert "te" not in json.loads(files.status.read_text())


def test_a_status_field_of_the_wrong_type_reads_as_its_default():
    status = Status.from_json({"generation": "7", "programmed": 1, "down_links": [["l1", 3], "x", ["a", 1, "b", 2]],
                               "connected": "l1", "steering": [], "te": 5, "time": 2})
    assert status.generation == 0 and status.programmed is False and status.connected == ()
    assert status.down_links == {("a", 1, "b", 2)} and status.steering == SteeringStatus()
    assert status.te is None and status.time == 2.0


def test_the_command_line_carries_the_app_configuration(files):
    fabric = Fabric(load_spec("tiny"))
    files.fabric.write_text(fabric.to_json())
    argv = control.command_line("flowlet", {"gap_us": 500.0, "qp": True}, files.folder, 6653, "run-7")
    args = control.argument_parser(APPS).parse_args(argv)
    config = AppConfig.from_args(args)
    assert (config.app, config.options, config.run_id, config.files) == \
        ("flowlet", {"gap_us": 500.0, "qp": True}, "run-7", files)
    assert args.port == 6653 and sorted(config.fabric.switches) == sorted(fabric.switches)
    with pytest.raises(SystemExit):
        control.argument_parser(APPS).parse_args(control.command_line("ospf", {}, files.folder, 1))


# -- the watcher ---------------------------------------------------------------------------------------
class Inbox:
    def __init__(self, files, failing=False):
        self.jobs, self.plans = [], []
        self.failing = failing
        self.errors = []
        self.watcher = InboxWatcher(files, on_jobs=self.jobs.append, on_steering=self.on_steering,
                                    on_error=lambda path, exc: self.errors.append((path.name, str(exc))))

    def on_steering(self, plan):
        if self.failing:
            raise ValueError("bad plan")
        self.plans.append(plan)


def test_the_watcher_reports_each_new_version_once(files):
    inbox = Inbox(files)
    assert inbox.watcher.poll() == 0                          # nothing written yet
    control.write_jobs(files.jobs, {"a": Job.of([("1.1.1.1", "2.2.2.2", 5)], when=1.0)})
    control.write_steering(files.steering, SteeringPlan("g1", {}))
    assert inbox.watcher.poll() == 2
    assert inbox.watcher.poll() == 0
    assert list(inbox.jobs[-1]) == ["a"] and inbox.plans == [SteeringPlan("g1", {})]
    control.write_steering(files.steering, SteeringPlan("g1", {}))   # same bytes, a new file
    assert inbox.watcher.poll() == 1 and len(inbox.plans) == 2
    files.steering.unlink()
    assert inbox.watcher.poll() == 1 and inbox.plans[-1] is None      # removed: no plan
    assert inbox.watcher.poll() == 0


def test_the_watcher_reads_what_is_there_when_it_starts(files):
    control.write_steering(files.steering, SteeringPlan("kept", {}))
    inbox = Inbox(files)
    inbox.watcher.poll()
    assert inbox.plans == [SteeringPlan("kept", {})] and inbox.jobs == []


def test_a_failing_callback_is_reported_and_the_watch_goes_on(files):
    inbox = Inbox(files, failing=True)
    control.write_steering(files.steering, SteeringPlan("g1", {}))
    control.write_jobs(files.jobs, {})
    assert inbox.watcher.poll() == 2
    assert inbox.errors == [("steering.json", "bad plan")] and inbox.jobs == [{}]


def test_the_watcher_runs_until_stopped(files):
    inbox = Inbox(files)
    stop = threading.Event()
    thread = threading.Thread(target=inbox.watcher.run, args=(stop,))
    thread.start()
    try:
        control.write_steering(files.steering, SteeringPlan("live", {}))
        for _ in range(200):
            if inbox.plans:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join(5)
    assert inbox.plans == [SteeringPlan("live", {})] and not thread.is_alive()
