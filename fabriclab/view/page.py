"""The fabric view as one self-contained HTML file: the layout, every run's frames, the scale it
ran at, and the page's own script and style inlined, so it opens with no network and no server.

    fabriclab report results/20261126-001610-ar-fabric/ --html      # writes view.html there
"""

from __future__ import annotations

import html
import json
import pathlib
from importlib import resources

from fabriclab.errors import LabError
from fabriclab.results import document
from fabriclab.view import frames, layout

DEFAULT_NAME = "view.html"
LIVE_FRAMES = 600            # the live page keeps this many frames for its slider (5 min at 0.5 s)


def fabric_of(doc):
    """The fabric a results document ran on, rebuilt from its spec (no lab needed)."""
    from fabriclab.topologies.fabric import Fabric

    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise LabError("results document has no spec to draw the fabric from")
    try:
        return Fabric.from_spec_dict(spec)
    except (TypeError, ValueError, KeyError) as exc:
        raise LabError(f"results document's spec cannot be rebuilt ({type(exc).__name__})") from None


def jobs_summary(run):
    """[{name, what, busbw, cct}] of a run's jobs, first size of each, as text."""
    out = []
    for name, job in (run.get("jobs") or {}).items():
        sizes = job.get("sizes") or [{}]
        row = sizes[0] if isinstance(sizes, list) and sizes else {}
        busbw = row.get("busbw_mbps")
        cct = (row.get("cct_ms") or {}).get("p50") if isinstance(row.get("cct_ms"), dict) else None
        what = " ".join(str(v) for v in (row.get("collective") or job.get("kind", ""),
                                         row.get("size", "")) if v != "")
        out.append({"name": name, "what": what,
                    "busbw": "-" if busbw is None else f"{busbw:.2f} Mbit/s",
                    "cct": "-" if cct is None else f"{cct:.1f} ms"})
    return out


def scale_line(doc):
    """Link rates, buffers and the time scale, as every result states them."""
    scale = doc.get("scale") or {}
    buffers = ", ".join(f"{k} {v // 1024} KiB" for k, v in (scale.get("buffers_bytes") or {}).items())
    ts = scale.get("time_scale")
    return (f"host links {scale.get('host_rate_mbps', '?')} Mbit/s, fabric links "
            f"{scale.get('fabric_rate_mbps', '?')} Mbit/s; buffers {buffers or 'not stated'}; time scale "
            + (f"x{ts:.0f} (1 s of lab time stands for {1e6 / ts:.1f} us)" if ts else "none (real time)"))


def page_data(folder, doc):
    """What the page's script reads: {"layout", "runs": [frames + jobs]}."""
    fabric = fabric_of(doc)
    runs = []
    for run in doc.get("runs") or ():
        data = frames.run_frames(folder, run, fabric)
        if data is not None:
            data["jobs"] = jobs_summary(run)
            runs.append(data)
    if not runs:
        raise LabError(f"{pathlib.Path(folder).name}: no run with a links CSV to draw")
    return {"layout": layout.layout(fabric), "runs": runs}


def _asset(name):
    return resources.files("fabriclab.view").joinpath("static", name).read_text()


def render(folder, doc=None):
    """The page's HTML for a results folder."""
    folder = pathlib.Path(folder)
    doc = doc or document.load(folder)
    fabric = doc.get("fabric") or {}
    title = f"{doc.get('name') or doc.get('kind', 'run')} on {fabric.get('name', '?')}"
    data = dict(page_data(folder, doc), mode="report")
    return _html(title, f"{scale_line(doc)}; created {doc.get('created', '?')}", data)


def live_scale(fabric):
    """A running fabric's scale, as scale_line reads it from a results document."""
    spec = fabric.spec
    return {"scale": {"host_rate_mbps": spec.host_rate_mbps, "fabric_rate_mbps": spec.fabric_rate_mbps,
                      "buffers_bytes": fabric.summary()["buffers_bytes"], "time_scale": spec.time_scale}}


def render_live(lab, token, refresh_s, max_frames=LIVE_FRAMES):
    """The live page of a running lab: the layout now, frames pushed by the server
    (view/server.py) at /events, buttons posting to /action; both carry the page's token."""
    fabric = lab.fabric
    data = {"mode": "live", "layout": layout.layout(fabric), "runs": [],
            "live": {"events": f"events?token={token}", "action": f"action?token={token}",
                     "refresh_s": refresh_s, "max_frames": max_frames, "routing": str(lab.routing)}}
    title = f"{fabric.spec.name} with {lab.routing}, live"
    return _html(title, scale_line(live_scale(fabric)), data)


def _html(title, subtitle, data):
    """The page around `data` (read by view.js from <script id="fabric-data">)."""
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    live = data["mode"] == "live"
    actions = """<div id="status" class="status">connecting ...</div>
<h2>Selected</h2><div id="selected">click a link or a switch to break or repair it</div>
<div id="result" role="status"></div>
<h2>Fault timeline</h2><textarea id="timeline" rows="4" spellcheck="false"
aria-label="fault timeline"></textarea>
<div><button type="button" id="timeline-start">start</button>
<button type="button" id="timeline-stop">stop</button>
<button type="button" id="restore">restore every fault</button></div>
<div id="timeline-state"></div>""" if live else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fabriclab: {html.escape(title)}</title>
<style>{_asset("view.css")}</style></head>
<body class="{data["mode"]}">
<header><h1>fabriclab: {html.escape(title)}</h1>
<div class="scale">{html.escape(subtitle)}</div></header>
<div id="controls"><label>run <select id="run"></select></label>
<button id="play" type="button">play</button>
<input id="frame" type="range" min="0" max="0" value="0" aria-label="time">
<span id="clock"></span>
<span class="legend">utilization <span style="background:#cfd8dc"></span> idle
<span style="background:hsl(120,80%,45%)"></span> low <span style="background:hsl(60,80%,40%)"></span>
half <span style="background:hsl(0,80%,35%)"></span> line rate; dashed: down</span></div>
<main><div id="fabric"><svg id="fabric-svg" xmlns="http://www.w3.org/2000/svg" role="img"
aria-label="the fabric"></svg></div>
<aside>{actions}<h2>Jobs</h2><table><thead><tr><th>job</th><th>what</th><th>busbw</th><th>CCT p50</th></tr></thead>
<tbody id="jobs"></tbody></table>
<h2>Faults and links down</h2><ul id="faults"></ul></aside></main>
<div id="tip"></div>
<script type="application/json" id="fabric-data">{blob}</script>
<script>{_asset("view.js")}</script>
</body></html>
"""


def write(folder, out=None, doc=None):
    """Write the page (default FOLDER/view.html); returns its path."""
    folder = pathlib.Path(folder)
    path = pathlib.Path(out) if out else folder / DEFAULT_NAME
    text = render(folder, doc)
    try:
        path.write_text(text)
    except OSError as exc:
        raise LabError(f"cannot write {path}: {exc.strerror}") from None
    return path
