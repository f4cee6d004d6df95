// The fabric view: draws the layout once, then recolours every cable for the chosen run and
// frame. Reads its data from the page's <script id="fabric-data">; needs no network.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("fabric-data").textContent);
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.getElementById("fabric-svg");
  const tip = document.getElementById("tip");
  const slider = document.getElementById("frame");
  const runSelect = document.getElementById("run");
  const clock = document.getElementById("clock");
  const pos = {};
  const drawn = {};            // link id -> {group, up line, down line, link}
  let run = null, frame = 0, timer = null;

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
      g.addEventListener("mousemove", ev => showTip(ev, linkText(link)));
      g.addEventListener("mouseleave", hideTip);
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
    });
  }

  function value(series) { return series && frame < series.length ? series[frame] : null; }

  function isDown(id) {
    const t = run.t[frame];
    return run.down.some(d => d[0] === id && d[1] <= t && (d[2] === null || t < d[2]));
  }

  function linkText(link) {
    if (!run) return link.id;
    const lines = [link.id + (isDown(link.id) ? "  (down)" : "") + "  " + link.rate_mbps + " Mbit/s"];
    const names = {up: link.a + " -> " + link.b, down: link.b + " -> " + link.a};
    ["up", "down"].forEach(way => {
      const mbps = value((run.rates[link.id] || {})[way]);
      let line = names[way] + ": " + (mbps === null ? "-" : mbps.toFixed(3) + " Mbit/s, " +
                 Math.round(100 * mbps / link.rate_mbps) + "%");
      const q = (run.queues[link.id] || {})[way];
      if (q) line += "\n   queue " + value(q.occ) + " B (high " + value(q.high) + " B), marks " +
                     value(q.marks) + ", drops " + value(q.drops) + ", pauses sent " + value(q.pause_tx) +
                     (value(q.paused) ? ", PAUSED" : "");
      lines.push(line);
    });
    return lines.join("\n");
  }

  function nodeText(n) {
    if (!run) return n.id;
    let out = 0, got = 0;
    data.layout.links.forEach(link => {
      const r = run.rates[link.id] || {};
      if (link.a === n.id) { out += value(r.up) || 0; got += value(r.down) || 0; }
      if (link.b === n.id) { out += value(r.down) || 0; got += value(r.up) || 0; }
    });
    return n.id + " (" + n.role + (n.plane ? ", plane " + n.plane : "") + ")\nsends " +
           out.toFixed(2) + " Mbit/s, receives " + got.toFixed(2) + " Mbit/s";
  }

  function showTip(ev, text) {
    tip.textContent = text;
    tip.style.display = "block";
    tip.style.left = (ev.clientX + 14) + "px";
    tip.style.top = (ev.clientY + 10) + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  function paint() {
    const t = run.t[frame] || 0;
    clock.textContent = "t = " + t.toFixed(2) + " s (frame " + (frame + 1) + " of " + run.t.length + ")";
    for (const id in drawn) {
      const d = drawn[id], r = run.rates[id] || {}, down = isDown(id);
      d.g.classList.toggle("down", down);
      ["up", "down"].forEach(way => {
        const mbps = value(r[way]);
        d[way].setAttribute("stroke", colour(mbps === null ? 0 : mbps / d.link.rate_mbps));
        d[way].setAttribute("data-util", mbps === null ? "" : (mbps / d.link.rate_mbps).toFixed(3));
      });
    }
    document.querySelectorAll("#faults li").forEach(li => {
      li.classList.toggle("now", Number(li.dataset.t) <= t);
    });
  }

  function choose(index) {
    run = data.runs[index];
    slider.max = Math.max(0, run.t.length - 1);
    frame = Math.min(frame, Number(slider.max));
    slider.value = frame;
    const faults = document.getElementById("faults");
    faults.textContent = "";
    const items = run.faults.map(f => [f[0], f[1]]).concat(run.down.map(d =>
      [d[1], d[0] + " down" + (d[2] === null ? "" : " until " + d[2].toFixed(2) + " s")]));
    items.sort((x, y) => x[0] - y[0]);
    if (!items.length) faults.innerHTML = "<li>none</li>";
    items.forEach(([t, text]) => {
      const li = document.createElement("li");
      li.dataset.t = t;
      li.textContent = (t === null ? "-" : t.toFixed(2) + " s") + ": " + text;
      faults.appendChild(li);
    });
    const jobs = document.getElementById("jobs");
    jobs.textContent = "";
    run.jobs.forEach(j => {
      const tr = document.createElement("tr");
      [j.name, j.what, j.busbw, j.cct].forEach(v => {
        const td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
      });
      jobs.appendChild(tr);
    });
    paint();
  }

  draw();
  data.runs.forEach((r, i) => {
    const o = document.createElement("option");
    o.value = i; o.textContent = r.label || ("run " + (i + 1));
    runSelect.appendChild(o);
  });
  runSelect.addEventListener("change", () => choose(Number(runSelect.value)));
  slider.addEventListener("input", () => { frame = Number(slider.value); paint(); });
  document.getElementById("play").addEventListener("click", ev => {
    if (timer) { clearInterval(timer); timer = null; ev.target.textContent = "play"; return; }
    ev.target.textContent = "pause";
    timer = setInterval(() => {
      frame = frame + 1 >= run.t.length ? 0 : frame + 1;
      slider.value = frame; paint();
    }, 100);
  });
  if (data.runs.length) choose(0);
  document.body.dataset.ready = "1";
})();
