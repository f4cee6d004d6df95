// The fabric view: draws the layout once, then recolours every cable for the chosen frame.
// Its data is the page's <script id="fabric-data">. Two sources feed the same drawing: a finished
// run's frames (report mode, no network at all) and a running lab's frames pushed by the lab's
// own server (live mode, with buttons that break and repair the fabric through the lab).
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("fabric-data").textContent);
  const live = data.mode === "live";
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.getElementById("fabric-svg");
  const tip = document.getElementById("tip");
  const slider = document.getElementById("frame");
  const runSelect = document.getElementById("run");
  const clock = document.getElementById("clock");
  const pos = {};
  const drawn = {};            // link id -> {g, up line, down line, link}
  let source = null, frame = 0, timer = null, selected = null;

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  // Utilization 0..1 -> colour: grey when idle, green through yellow to red at line rate.
  function colour(util) {
    if (!(util > 0.005)) return "#cfd8dc";
    const u = Math.min(util, 1);
    return "hsl(" + Math.round(120 * (1 - u)) + ",80%," + Math.round(45 - 10 * u) + "%)";
  }

  // A finished run: per-link series, links down as [id, from, until] intervals.
  function reportSource(run) {
    const at = (series, i) => (series && i < series.length ? series[i] : null);
    return {
      length: () => run.t.length,
      time: i => run.t[i] || 0,
      rate: (i, id, way) => at((run.rates[id] || {})[way], i),
      queue(i, id, way) {
        const q = (run.queues[id] || {})[way];
        if (!q) return null;
        const out = {};
        for (const k in q) out[k] = at(q[k], i);
        return out;
      },
      down(i, id) {
        const t = run.t[i];
        return run.down.some(d => d[0] === id && d[1] <= t && (d[2] === null || t < d[2]));
      },
      degraded: () => null,
      faults: () => run.faults.map(f => [f[0], f[1]]).concat(run.down.map(d =>
        [d[1], d[0] + " down" + (d[2] === null ? "" : " until " + d[2].toFixed(2) + " s")])),
      jobs: () => run.jobs,
    };
  }

  // A running lab: the frames pushed so far, the latest `max_frames` of them.
  function liveSource() {
    const frames = [];
    return {
      frames: frames,
      length: () => frames.length,
      time: i => (frames[i] ? frames[i].t : 0),
      rate: (i, id, way) => (frames[i] && frames[i].rates[id] ? frames[i].rates[id][way] : null),
      queue: (i, id, way) => (frames[i] && frames[i].queues[id] ? frames[i].queues[id][way] || null : null),
      down: (i, id) => !!frames[i] && frames[i].down.indexOf(id) >= 0,
      degraded: (i, id) => (frames[i] ? frames[i].degraded[id] || null : null),
      faults: () => (frames.length ? frames[frames.length - 1].events : []),
      jobs() {
        const last = frames[frames.length - 1];
        return last ? last.jobs.map(j => ({name: "[" + j.number + "]", what: j.label + " (" + j.state + ")",
                                           busbw: j.busbw, cct: j.cct})) : [];
      },
    };
  }

  function draw() {
    const L = data.layout;
    svg.setAttribute("viewBox", "0 0 " + L.width + " " + L.height);
    L.nodes.forEach(n => { pos[n.id] = n; });
    const linksLayer = el("g", {}, svg), nodesLayer = el("g", {}, svg);
    L.links.forEach(link => {
      const a = pos[link.a], b = pos[link.b];
      if (!a || !b) return;
      // parallel members side by side; each direction its own half-width line
      const dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1;
      const nx = -dy / len, ny = dx / len, off = (link.member || 0) * 6;
      const g = el("g", {class: "link", "data-id": link.id}, linksLayer);
      const lines = {};
      [["up", off - 1.5], ["down", off + 1.5]].forEach(([way, o]) => {
        lines[way] = el("line", {x1: a.x + nx * o, y1: a.y + ny * o, x2: b.x + nx * o, y2: b.y + ny * o}, g);
      });
      // a wide invisible line over both, so a thin cable is easy to point at and click
      el("line", {class: "hit", x1: a.x + nx * off, y1: a.y + ny * off, x2: b.x + nx * off, y2: b.y + ny * off}, g);
      g.addEventListener("mousemove", ev => showTip(ev, linkText(link)));
      g.addEventListener("mouseleave", hideTip);
      if (live) g.addEventListener("click", () => select({kind: "link", item: link}));
      drawn[link.id] = {g: g, up: lines.up, down: lines.down, link: link};
    });
    L.nodes.forEach(n => {
      const g = el("g", {class: "node " + n.role, "data-id": n.id}, nodesLayer);
      if (n.role === "host") el("circle", {cx: n.x, cy: n.y, r: 9}, g);
      else el("rect", {x: n.x - 18, y: n.y - 10, width: 36, height: 20, rx: 3}, g);
      const t = el("text", {x: n.x, y: n.y + (n.role === "host" ? 22 : 4)}, g);
      t.textContent = n.id;
      g.addEventListener("mousemove", ev => showTip(ev, nodeText(n)));
      g.addEventListener("mouseleave", hideTip);
      if (live && n.role !== "host") g.addEventListener("click", () => select({kind: "switch", item: n}));
    });
  }

  function queueLine(q) {
    return "   queue " + q.occ + " B (high " + q.high + " B), marks " + q.marks + ", drops " + q.drops +
           ", pauses sent " + q.pause_tx + (q.paused ? ", PAUSED" : "");
  }

  function linkText(link) {
    if (!source || !source.length()) return link.id;
    const state = source.down(frame, link.id) ? "  (down)" : "";
    const worse = source.degraded(frame, link.id);
    const lines = [link.id + state + "  " + link.rate_mbps + " Mbit/s" + (worse ? "; " + worse : "")];
    const names = {up: link.a + " -> " + link.b, down: link.b + " -> " + link.a};
    ["up", "down"].forEach(way => {
      const mbps = source.rate(frame, link.id, way);
      let line = names[way] + ": " + (mbps === null ? "-" : mbps.toFixed(3) + " Mbit/s, " +
                 Math.round(100 * mbps / link.rate_mbps) + "%");
      const q = source.queue(frame, link.id, way);
      if (q) line += "\n" + queueLine(q);
      lines.push(line);
    });
    if (live) lines.push("click to take it down or up, degrade it or make it lossy");
    return lines.join("\n");
  }

  function nodeText(n) {
    if (!source || !source.length()) return n.id;
    let out = 0, got = 0;
    const q = {occ: 0, high: 0, marks: 0, drops: 0, pause_tx: 0, paused: 0};
    let queued = false;
    data.layout.links.forEach(link => {
      // a node sends on, and queues at, the "up" direction of cables it is the a end of
      const mine = link.a === n.id ? "up" : link.b === n.id ? "down" : null;
      if (!mine) return;
      const theirs = mine === "up" ? "down" : "up";
      out += source.rate(frame, link.id, mine) || 0;
      got += source.rate(frame, link.id, theirs) || 0;
      const p = source.queue(frame, link.id, mine);
      if (p) {
        queued = true;
        for (const k in q) q[k] = k === "paused" ? q[k] || p[k] : q[k] + (p[k] || 0);
      }
    });
    return n.id + " (" + n.role + (n.plane ? ", plane " + n.plane : "") + ")\nsends " +
           out.toFixed(2) + " Mbit/s, receives " + got.toFixed(2) + " Mbit/s" +
           (queued ? "\nits ports:" + queueLine(q).slice(2) : "") +
           (live && n.role !== "host" ? "\nclick to take it down or up" : "");
  }

  function showTip(ev, text) {
    tip.textContent = text;
    tip.style.display = "block";
    tip.style.left = (ev.clientX + 14) + "px";
    tip.style.top = (ev.clientY + 10) + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  function paint() {
    const count = source.length();
    const t = source.time(frame);
    clock.textContent = count ? "t = " + t.toFixed(2) + " s (frame " + (frame + 1) + " of " + count + ")" : "";
    for (const id in drawn) {
      const d = drawn[id], down = count > 0 && source.down(frame, id);
      d.g.classList.toggle("down", down);
      d.g.classList.toggle("degraded", count > 0 && !!source.degraded(frame, id));
      ["up", "down"].forEach(way => {
        const mbps = count ? source.rate(frame, id, way) : null;
        d[way].setAttribute("stroke", colour(mbps === null ? 0 : mbps / d.link.rate_mbps));
        d[way].setAttribute("data-util", mbps === null ? "" : (mbps / d.link.rate_mbps).toFixed(3));
      });
    }
    listFaults(t);
    listJobs();
  }

  function listFaults(t) {
    const faults = document.getElementById("faults");
    const items = source.faults().slice().sort((x, y) => x[0] - y[0]);
    faults.textContent = "";
    if (!items.length) { const li = document.createElement("li"); li.textContent = "none"; faults.appendChild(li); }
    items.forEach(([when, text]) => {
      const li = document.createElement("li");
      li.dataset.t = when;
      // live lines carry their own clock time; a report's are seconds into the run
      li.textContent = live ? text : (when === null ? "-" : when.toFixed(2) + " s") + ": " + text;
      li.classList.toggle("now", when !== null && when <= t);
      faults.appendChild(li);
    });
  }

  function listJobs() {
    const jobs = document.getElementById("jobs");
    jobs.textContent = "";
    source.jobs().forEach(j => {
      const tr = document.createElement("tr");
      [j.name, j.what, j.busbw, j.cct].forEach(v => {
        const td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
      });
      jobs.appendChild(tr);
    });
  }

  function setFrame(i) {
    frame = i;
    slider.value = i;
    paint();
  }

  // -- report mode: a run chooser, a slider over the run's frames, play/pause --------------------
  function startReport() {
    data.runs.forEach((r, i) => {
      const o = document.createElement("option");
      o.value = i; o.textContent = r.label || ("run " + (i + 1));
      runSelect.appendChild(o);
    });
    const choose = index => {
      source = reportSource(data.runs[index]);
      slider.max = Math.max(0, source.length() - 1);
      setFrame(Math.min(frame, Number(slider.max)));
    };
    runSelect.addEventListener("change", () => choose(Number(runSelect.value)));
    document.getElementById("play").addEventListener("click", ev => {
      if (timer) { clearInterval(timer); timer = null; ev.target.textContent = "play"; return; }
      ev.target.textContent = "pause";
      timer = setInterval(() => setFrame(frame + 1 >= source.length() ? 0 : frame + 1), 100);
    });
    if (data.runs.length) choose(0);
  }

  // -- live mode: frames pushed by the lab, the slider follows the newest unless moved back -----
  function status(text, kind) {
    const s = document.getElementById("status");
    s.textContent = text;
    s.className = "status " + kind;
    document.body.dataset.connection = kind;
  }

  function post(request) {
    const result = document.getElementById("result");
    result.className = "busy";
    result.textContent = request.action.replace(/_/g, " ") + " ...";
    return fetch(data.live.action, {method: "POST", headers: {"Content-Type": "application/json"},
                                    body: JSON.stringify(request)})
      .then(r => r.json().catch(() => ({ok: false, error: "HTTP " + r.status})))
      .catch(() => ({ok: false, error: "the lab did not answer (stopped?)"}))
      .then(answer => {
        result.className = answer.ok ? "ok" : "refused";
        result.textContent = answer.ok ? answer.message : "refused: " + answer.error;
        return answer;
      });
  }

  function button(parent, text, request, name) {
    const b = document.createElement("button");
    b.type = "button"; b.textContent = text; b.dataset.action = name || request().action;
    b.addEventListener("click", () => { const r = request(); if (r) post(r); });
    parent.appendChild(b);
    return b;
  }

  function select(what) {
    selected = what;
    const box = document.getElementById("selected");
    box.textContent = "";
    const head = document.createElement("div");
    head.className = "what";
    box.appendChild(head);
    if (what.kind === "switch") {
      head.textContent = what.item.id + " (" + what.item.role + ")";
      button(box, "switch down", () => ({action: "switch_down", switch: what.item.id}));
      button(box, "switch up", () => ({action: "switch_up", switch: what.item.id}));
      const cut = document.createElement("div");
      const share = document.createElement("input");
      share.type = "number"; share.min = "0"; share.max = "1"; share.step = "any"; share.id = "buffer-fraction";
      share.value = "0.5"; share.setAttribute("aria-label", "buffer fraction");
      cut.appendChild(share);
      cut.appendChild(document.createTextNode(" of its buffer "));
      button(cut, "cut buffer", () => ({action: "buffer", switch: what.item.id, fraction: Number(share.value)}));
      button(cut, "whole buffer", () => ({action: "buffer", switch: what.item.id, fraction: 1}), "buffer_whole");
      box.appendChild(cut);
      latencyRow(box, "switch", what.item.id);
      return;
    }
    const link = what.item;
    head.textContent = link.id + " (" + link.rate_mbps + " Mbit/s)";
    button(box, "down", () => ({action: "link_down", link: link.id}));
    button(box, "up", () => ({action: "link_up", link: link.id}));
    const row = document.createElement("div");
    const rate = document.createElement("input");
    rate.type = "number"; rate.min = "0"; rate.step = "any"; rate.id = "degrade-rate";
    rate.value = String(link.rate_mbps / 4); rate.setAttribute("aria-label", "Mbit/s");
    row.appendChild(rate);
    row.appendChild(document.createTextNode(" Mbit/s "));
    button(row, "degrade", () => ({action: "degrade", link: link.id, rate_mbps: Number(rate.value)}));
    button(row, "spec rate", () => ({action: "restore_rate", link: link.id}));
    box.appendChild(row);
    const row2 = document.createElement("div");
    const loss = document.createElement("input");
    loss.type = "number"; loss.min = "0"; loss.max = "0.99"; loss.step = "any"; loss.id = "loss-fraction";
    loss.value = "0.01"; loss.setAttribute("aria-label", "loss fraction");
    row2.appendChild(loss);
    row2.appendChild(document.createTextNode(" of packets "));
    button(row2, "lossy", () => ({action: "loss", link: link.id, fraction: Number(loss.value)}));
    button(row2, "no loss", () => ({action: "loss", link: link.id, fraction: 0}), "loss_off");
    box.appendChild(row2);
    latencyRow(box, "link", link.id);
  }

  // A latency fault: microseconds of the real fabric's time (the lab stretches them); needs netem.
  function latencyRow(box, key, id) {
    const row = document.createElement("div");
    const us = document.createElement("input");
    us.type = "number"; us.min = "0"; us.step = "any"; us.id = "latency-us";
    us.value = "2"; us.setAttribute("aria-label", "latency us");
    row.appendChild(us);
    row.appendChild(document.createTextNode(" us "));
    button(row, "slower", () => ({action: "latency", [key]: id, us: Number(us.value)}));
    button(row, "spec latency", () => ({action: "latency", [key]: id, us: 0}), "latency_off");
    box.appendChild(row);
  }

  function push(f) {
    if (f.error && !f.rates) {                   // nothing read yet: no frame to show
      status("could not read the lab: " + f.error + "; trying again", "lost");
      return;
    }
    const frames = source.frames;
    const following = frame >= frames.length - 1;
    frames.push(f);
    if (frames.length > data.live.max_frames) {
      frames.shift();
      if (!following) frame = Math.max(0, frame - 1);
    }
    slider.max = frames.length - 1;
    const tl = f.timeline;
    document.getElementById("timeline-state").textContent = !tl ? "no timeline started" :
      (tl.running ? "running: " : "finished: ") + tl.applied + " of " + tl.steps + " step(s) applied" +
      (tl.error ? "; failed: " + tl.error : "");
    if (f.error) status("could not read the lab: " + f.error + "; trying again", "lost");
    else if (document.body.dataset.connection === "lost") status(liveText(), "live");
    setFrame(following ? frames.length - 1 : frame);
  }

  function liveText() {
    return "live: " + data.live.routing + ", a frame every " + data.live.refresh_s + " s";
  }

  function startLive() {
    source = liveSource();
    runSelect.parentNode.style.display = "none";
    document.getElementById("play").style.display = "none";
    slider.max = 0;
    paint();
    // an example timeline on this fabric's first fabric cable (the scenario files' syntax)
    const first = data.layout.links.find(l => l.kind === "fabric");
    if (first) {
      document.getElementById("timeline").value = "- {at: 0, link_down: " + first.label + ", for: 2}\n" +
        "- {at: 3, degrade: " + first.label + ", rate_mbps: " + first.rate_mbps / 4 + ", for: 2}";
    }
    document.getElementById("timeline-start").addEventListener("click", () =>
      post({action: "timeline_start", faults: document.getElementById("timeline").value}));
    document.getElementById("timeline-stop").addEventListener("click", () => post({action: "timeline_stop"}));
    document.getElementById("restore").addEventListener("click", () => post({action: "restore"}));
    const events = new EventSource(data.live.events);
    events.onopen = () => status(liveText(), "live");
    events.onmessage = ev => push(JSON.parse(ev.data));
    events.addEventListener("bye", ev => {
      const bye = JSON.parse(ev.data);
      events.close();
      status(bye.reason + " at " + bye.clock + "; this page keeps its last " + source.length() +
             " frame(s)", "stopped");
      document.querySelectorAll("aside button").forEach(b => { b.disabled = true; });
    });
    events.onerror = () => {
      if (events.readyState === EventSource.CLOSED) {
        status("the lab is gone and this page's token with it: open the URL a new lab prints", "stopped");
      } else if (document.body.dataset.connection !== "stopped") {
        status("lost the lab; retrying (the last frame stays on screen)", "lost");
      }
    };
  }

  draw();
  slider.addEventListener("input", () => setFrame(Number(slider.value)));
  if (live) startLive(); else startReport();
  document.body.dataset.ready = "1";
})();
