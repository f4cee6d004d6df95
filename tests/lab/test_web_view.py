"""The web view in a real browser (Debian's headless Chromium, driven by its chromedriver): the
live page of a running fabric, its buttons breaking and repairing it through the lab, the page
after the lab stops, and the HTML report of the run it watched, opened from disk."""

import pathlib

import pytest

from fabriclab.traffic.collective import CollectiveSpec
from fabriclab.view import page
from fabriclab.view.layout import link_id
from fabriclab.view.server import WebServer
from fabriclab.workflows.plan import Job, single_run
from fabriclab.workflows.session import Session

from . import browser as chromium

pytestmark = pytest.mark.lab

# Where the screenshot taken during traffic is kept (results/ is the lab's output folder).
ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "results" / "tests"
IDLE = "#cfd8dc"
# the busiest direction of the cables arguments[0] names, as the page drew it (0..1 of line rate)
FABRIC_UTIL = """Math.max(0, ...[...document.querySelectorAll('g.link')]
    .filter(g => arguments[0].includes(g.dataset.id))
    .flatMap(g => [...g.querySelectorAll('line:not(.hit)')])
    .map(l => Number(l.getAttribute('data-util') || 0)))"""
STROKES = """return [...document.querySelectorAll('g.link line:not(.hit)')].map(l => l.getAttribute('stroke'));"""
IDS = "return [...document.querySelectorAll(arguments[0])].map(g => g.dataset.id).sort();"


@pytest.fixture
def browser(tmp_path):
    why = chromium.missing()
    if why:
        pytest.fail(f"web view test: {why}", pytrace=False)
    with chromium.Browser.start(tmp_path / "profile") as b:
        yield b


def faults_text(b):
    return b.run("return document.getElementById('faults').textContent;")


def test_live_page_draws_colours_breaks_and_outlives_the_lab(lab_for, browser, tmp_path, figure):
    lab = lab_for("tiny")
    session = Session(lab)
    session.web = web = WebServer(lab, session, "127.0.0.1:0", refresh_s=0.25).start()
    try:
        browser.open(web.url)
        browser.wait_for("document.body.dataset.connection === 'live'", what="a live connection")
        browser.wait_for("document.getElementById('clock').textContent !== ''", what="a first frame")
        # every switch, host and cable of the spec, once
        assert browser.run(IDS, "g.node") == sorted([*lab.fabric.switches, *lab.fabric.hosts])
        assert browser.run(IDS, "g.link") == sorted(link_id(link) for link in lab.fabric.links)
        fabric_ids = [link_id(link) for link in lab.fabric.fabric_links]
        idle_util = browser.run(f"return {FABRIC_UTIL};", fabric_ids)
        assert figure("busiest fabric link utilization drawn, idle", idle_util) < 0.05, "idle fabric drawn as busy"
        idle = browser.run(STROKES)
        assert set(idle) == {IDLE}

        # traffic colours the cables it crosses
        ring = CollectiveSpec("allreduce", sizes=(1 << 20,), iterations=6)
        plan = single_run("web-view", "prompt", lab.fabric.spec, Job("ring", ring), routing=lab.routing)
        record = session.run(plan, "allreduce 1M x6", background=True, out=tmp_path / "run")
        browser.wait_for(f"{FABRIC_UTIL} > 0.3", fabric_ids, timeout=30, what="a fabric link over 30% busy")
        assert browser.run(STROKES) != idle
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = browser.screenshot(ARTIFACTS / "web-view-during-traffic.png")
        assert shot.stat().st_size > 10_000
        assert "running" in browser.run("return document.getElementById('jobs').textContent;")

        # a click takes a cable down, through the lab: its state and fault log say so
        browser.click("g.link[data-id='l1-s1']")
        browser.wait_for("document.querySelector(\"#selected button[data-action='link_down']\")")
        browser.click("#selected button[data-action='link_down']")
        browser.wait_for("document.getElementById('result').className === 'ok'", what="the action's answer")
        assert "l1-s1" in lab.injected()["links_down"]
        assert (lab.events[-1]["event"], lab.events[-1]["target"]) == ("link_down", "l1-s1")
        browser.wait_for("document.querySelector(\"g.link[data-id='l1-s1']\").classList.contains('down')",
                         what="l1-s1 drawn down")
        browser.wait_for("document.getElementById('faults').textContent.includes('link down l1-s1')",
                         what="the fault in the page's log")

        # what the lab refuses is refused on the page, with its reason, and changes nothing
        browser.run("document.getElementById('degrade-rate').value = '50';")
        browser.click("#selected button[data-action='degrade']")
        browser.wait_for("document.getElementById('result').className === 'refused'")
        assert "not below the link's 10 Mbit/s" in browser.run("return document.getElementById('result').textContent;")
        assert lab.injected()["reshaped"] == []

        browser.click("#selected button[data-action='link_up']")
        browser.wait_for("document.getElementById('result').className === 'ok'")
        assert lab.injected()["links_down"] == []

        # a switch from its box, and a timeline typed into the page
        browser.click("g.node[data-id='s2']")
        browser.click("#selected button[data-action='switch_down']")
        browser.wait_for("document.getElementById('result').textContent.startsWith('s2 down')")
        assert {"l1-s2", "l2-s2"} <= set(lab.injected()["links_down"])
        browser.click("#selected button[data-action='switch_up']")
        browser.wait_for("document.getElementById('result').textContent.startsWith('s2 up')")
        browser.run("document.getElementById('timeline').value = arguments[0];",
                    "- {at: 0.2, link_down: l2-s1, for: 0.5}")
        browser.click("#timeline-start")
        browser.wait_for("document.getElementById('result').className === 'ok'")
        browser.wait_for("document.getElementById('timeline-state').textContent.startsWith('finished: 2 of 2')",
                         what="the timeline finished")
        assert [e["event"] for e in lab.events if e["target"] == "l2-s1"][-2:] == ["link_down", "link_up"]

        # the job's busbw and CCT beside the fabric once it is done
        record.thread.join(60)
        assert record.doc is not None, record.error
        browser.wait_for("document.getElementById('jobs').textContent.includes('Mbit/s')", what="the job's busbw")

        # the lab stops: the page says so and keeps the fabric and its last frames
        session.close()
        browser.wait_for("document.body.dataset.connection === 'stopped'", what="the stopped banner")
        assert "the lab stopped" in browser.run("return document.getElementById('status').textContent;")
        assert browser.run(IDS, "g.link") == sorted(link_id(link) for link in lab.fabric.links)
        assert browser.run("return [...document.querySelectorAll('aside button')].every(b => b.disabled);")
    finally:
        session.close()

    # the run's HTML report, opened from disk: no request leaves the page, the same elements
    view = page.write(record.doc["folder"])
    browser.open(view.as_uri())
    browser.wait_for("document.body.dataset.ready === '1'")
    assert browser.run("return performance.getEntriesByType('resource').length;") == 0
    assert browser.run(IDS, "g.node") == sorted([*lab.fabric.switches, *lab.fabric.hosts])
    assert browser.run(IDS, "g.link") == sorted(link_id(link) for link in lab.fabric.links)
    frames = int(browser.run("return document.getElementById('frame').max;")) + 1
    assert figure("frames in the HTML report", frames) > 3
    busiest = max(browser.run("document.getElementById('frame').value = arguments[1];"
                              "document.getElementById('frame').dispatchEvent(new Event('input'));"
                              f"return {FABRIC_UTIL};", fabric_ids, i) for i in range(frames))
    assert figure("busiest fabric link utilization over the report frames", busiest) > 0.3


def test_up_web_serves_until_the_prompt_ends_and_leaves_nothing(fabriclab_pool):
    import subprocess
    import sys
    import urllib.request

    from tests.lab import labutil

    fabriclab_pool.close()              # `up` builds its own fabric; names are global on a machine
    fabriclab = [sys.executable, "-m", "fabriclab.cli.main"]
    bad = subprocess.run(fabriclab + ["up", "tiny", "--web", "127.0.0.1:http"], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "web address '127.0.0.1:http' must be HOST:PORT" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "bringing up" not in bad.stdout

    before = labutil.resources()
    proc = subprocess.Popen(fabriclab + ["up", "tiny", "--web", "127.0.0.1:0"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        url, seen = None, []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("web view: "):
                url = line.split()[2]
                break
        assert url and url.startswith("http://127.0.0.1:") and "?token=" in url, "".join(seen[-10:])
        base, token = url.split("?token=")
        assert b'"mode":"live"' in urllib.request.urlopen(url, timeout=10).read()
        proc.stdin.write("web\nlinkdown l1 s2\nweb stop\nweb 127.0.0.1:0\nexit\n")
        proc.stdin.flush()
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, out
    assert "(already running; `web stop` ends it)" in out and "web view stopped" in out
    # the start banner was read above: `web` repeats it, `web 127.0.0.1:0` prints a new one
    assert out.count("web view: http://127.0.0.1:") == 2 and "fabric torn down" in out
    with pytest.raises(OSError):                  # the page's server went with the lab
        urllib.request.urlopen(f"{base}state?token={token}", timeout=5)
    assert labutil.leaked(before, labutil.resources()) == {}
