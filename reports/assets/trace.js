/* Trace explorer: per-step confidence traces of every predictor for one trajectory, with the step's action and
 * observation on hover. Data: the JSON in <script id="trace-data">. Selection: the two <select>s or the URL hash
 * "#trace=<run index>/<episode id>". No network, no libraries. */
(function () {
  "use strict";
  var SVG_NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#d95f02", "#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#2c7fb8", "#a6761d", "#666666"];
  var dataEl = document.getElementById("trace-data");
  if (!dataEl) { return; }
  var DATA = JSON.parse(dataEl.textContent);
  var runSel = document.getElementById("trace-run");
  var epSel = document.getElementById("trace-episode");
  var plot = document.getElementById("trace-plot");
  var legend = document.getElementById("trace-legend");
  var summary = document.getElementById("trace-summary");
  var tip = document.getElementById("trace-tooltip");
  var stepsBody = document.querySelector("#trace-steps tbody");
  var failedBox = document.getElementById("trace-failed");
  var hidden = {};  // predictor key -> true when switched off in the legend (kept across trajectories)

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG_NS, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function fmt(v) { return (v === null || v === undefined) ? "missing" : Number(v).toFixed(3); }
  function clip(s, n) { s = String(s === null || s === undefined ? "" : s); return s.length > n ? s.slice(0, n) + "…" : s; }

  function fillRuns() {
    DATA.runs.forEach(function (run, i) {
      var o = document.createElement("option");
      o.value = String(i);
      o.textContent = run.label + " (" + run.episodes.length + " trajectories" + (run.truncated ? ", first shown" : "") + ")";
      runSel.appendChild(o);
    });
  }
  function fillEpisodes(runIndex) {
    epSel.innerHTML = "";
    DATA.runs[runIndex].episodes.forEach(function (ep) {
      var o = document.createElement("option");
      o.value = ep.id;
      o.textContent = ep.id + " · " + ep.stop + (ep.y === null ? "" : " · Y=" + ep.y) + " · " + ep.steps.length + " steps";
      epSel.appendChild(o);
    });
  }

  function draw(runIndex, episodeId) {
    var run = DATA.runs[runIndex];
    var ep = run.episodes.filter(function (e) { return e.id === episodeId; })[0] || run.episodes[0];
    if (!ep) { summary.textContent = "This run has no trajectories."; return; }
    epSel.value = ep.id;
    while (plot.firstChild) { plot.removeChild(plot.firstChild); }
    legend.innerHTML = "";
    var W = 920, H = 380, m = { l: 56, r: 18, t: 14, b: 36 };
    plot.setAttribute("viewBox", "0 0 " + W + " " + H);
    plot.setAttribute("width", W);
    plot.setAttribute("height", H);
    var T = ep.steps.length;
    var iw = W - m.l - m.r, ih = H - m.t - m.b;
    function x(t) { return m.l + (T <= 1 ? iw / 2 : (t - 1) / (T - 1) * iw); }
    function y(v) { return m.t + (1 - v) * ih; }
    var grid = el("g", { "class": "grid" }, plot);
    var axis = el("g", { "class": "axis" }, plot);
    [0, 0.25, 0.5, 0.75, 1].forEach(function (v) {
      el("line", { x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }, grid);
      el("text", { x: m.l - 8, y: y(v) + 4, "text-anchor": "end" }, axis).textContent = v.toFixed(2);
    });
    el("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b, stroke: "#999" }, axis);
    el("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, stroke: "#999" }, axis);
    var every = Math.max(1, Math.ceil(T / 20));
    ep.steps.forEach(function (s, i) {
      if (i % every === 0 || i === T - 1) {
        el("text", { x: x(s.t), y: H - m.b + 16, "text-anchor": "middle" }, axis).textContent = String(s.t);
      }
    });
    el("text", { x: m.l + iw / 2, y: H - 4, "text-anchor": "middle" }, axis).textContent = "step t";
    el("text", { x: 10, y: m.t + ih / 2, "text-anchor": "middle", transform: "rotate(-90 10 " + (m.t + ih / 2) + ")" }, axis)
      .textContent = "F_t";

    run.predictors.forEach(function (p, k) {
      var color = COLORS[k % COLORS.length];
      var vals = ep.values[p.key] || [];
      var g = el("g", { "class": "series", "data-predictor": p.key }, plot);
      if (hidden[p.key]) { g.style.display = "none"; }
      var pts = [];
      function flush() {
        if (pts.length > 1) {
          el("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 2,
                           "stroke-dasharray": p.dashed ? "6 4" : "none" }, g);
        }
        pts = [];
      }
      vals.forEach(function (v, i) {
        if (v === null) { flush(); return; }
        pts.push(x(i + 1).toFixed(1) + "," + y(v).toFixed(1));
        el("circle", { cx: x(i + 1), cy: y(v), r: 3.2, fill: color }, g);
      });
      flush();
      var item = document.createElement("span");
      var sw = document.createElement("span");
      sw.className = "sw" + (p.dashed ? " dashed" : "");
      sw.style.background = color;
      sw.style.borderColor = color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(p.label + (p.available === false ? " (no values)" : "")));
      item.className = "legend-item" + (hidden[p.key] ? " off" : "");
      item.setAttribute("data-predictor", p.key);
      item.title = "click to show or hide";
      item.addEventListener("click", function () {
        hidden[p.key] = !hidden[p.key];
        g.style.display = hidden[p.key] ? "none" : "";
        item.className = "legend-item" + (hidden[p.key] ? " off" : "");
      });
      legend.appendChild(item);
    });

    ep.steps.forEach(function (s, i) {
      var half = T <= 1 ? iw / 2 : iw / (T - 1) / 2;
      var band = el("rect", { "class": "band", x: x(s.t) - half, y: m.t, width: 2 * half, height: ih, "data-t": s.t }, plot);
      band.addEventListener("mousemove", function (ev) { showTip(ev, run, ep, i); });
      band.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    });

    summary.textContent = run.label + " · " + ep.id + " · task " + ep.task + " · stop " + ep.stop +
      (ep.y === null ? " · outcome unobserved" : " · Y = " + ep.y) + " · " + T + " steps";
    failedBox.innerHTML = "";
    (ep.failed || []).forEach(function (f) {
      var p = document.createElement("div");
      p.className = "failed-attempt";
      p.textContent = "unparsed step " + (T + 1) + ", attempt " + f.attempt + ": " + (f.error || "rejected") +
        " — output: " + clip(f.raw, 300);
      failedBox.appendChild(p);
    });
    stepsBody.innerHTML = "";
    ep.steps.forEach(function (s, i) {
      var tr = document.createElement("tr");
      var cells = [String(s.t), s.action, s.obs].concat(run.predictors.map(function (p) {
        return fmt((ep.values[p.key] || [])[i]);
      }));
      cells.forEach(function (c, j) {
        var td = document.createElement("td");
        td.textContent = j === 0 || j > 2 ? c : clip(c, 240);
        if (j === 1 || j === 2) { td.className = "text"; }
        tr.appendChild(td);
      });
      stepsBody.appendChild(tr);
    });
    plot.setAttribute("data-episode", ep.id);
    plot.setAttribute("data-run", String(runIndex));
    document.body.setAttribute("data-trace-ready", "1");
  }

  function showTip(ev, run, ep, i) {
    var s = ep.steps[i];
    tip.innerHTML = "";
    function line(label, text) {
      var b = document.createElement("b");
      b.textContent = label + " ";
      tip.appendChild(b);
      tip.appendChild(document.createTextNode(text + "\n"));
    }
    line("step", String(s.t));
    line("action", clip(s.action, 300));
    line("observation", clip(s.obs, 420));
    if (s.conf_raw !== null && s.conf_raw !== undefined) { line("<confidence>", s.conf_raw); }
    run.predictors.forEach(function (p) { line(p.label + ":", fmt((ep.values[p.key] || [])[i])); });
    tip.style.display = "block";
    var left = Math.min(ev.clientX + 14, window.innerWidth - 480);
    tip.style.left = Math.max(0, left) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  }

  function fromHash() {
    var m = /trace=(\d+)\/(.+)$/.exec(decodeURIComponent(location.hash.slice(1)));
    if (!m) { return null; }
    var r = parseInt(m[1], 10);
    return (r >= 0 && r < DATA.runs.length) ? { run: r, ep: m[2] } : null;
  }
  function select(runIndex, episodeId) {
    runSel.value = String(runIndex);
    fillEpisodes(runIndex);
    draw(runIndex, episodeId);
  }

  fillRuns();
  runSel.addEventListener("change", function () {
    var r = parseInt(runSel.value, 10);
    var first = DATA.runs[r].episodes[0];
    select(r, first ? first.id : null);
  });
  epSel.addEventListener("change", function () {
    var r = parseInt(runSel.value, 10);
    history.replaceState(null, "", "#trace=" + r + "/" + encodeURIComponent(epSel.value));
    draw(r, epSel.value);
  });
  window.addEventListener("hashchange", function () { var h = fromHash(); if (h) { select(h.run, h.ep); } });
  if (DATA.runs.length) {
    var h = fromHash();
    if (h) {
      select(h.run, h.ep);
    } else {
      var eps = DATA.runs[0].episodes;
      var withSteps = eps.filter(function (e) { return e.steps.length > 0; })[0] || eps[0];
      select(0, withSteps ? withSteps.id : null);
    }
  } else {
    summary.textContent = "No trajectories.";
    document.body.setAttribute("data-trace-ready", "1");
  }
})();
