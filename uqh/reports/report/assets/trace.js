/* Trace explorer: filter the trajectories of every run (run, domain, stop reason, outcome, failed only), pick one in
 * the list, see the per-step confidence traces of every predictor, and the step's action and observation on hover.
 * Data: the JSON in <script id="trace-data">. Selection: a click in the list or the URL hash
 * "#trace=<run index>/<episode id>". No network, no libraries. */
(function () {
  "use strict";
  var SVG_NS = "http://www.w3.org/2000/svg";
  var dataEl = document.getElementById("trace-data");
  if (!dataEl) { return; }
  var DATA = JSON.parse(dataEl.textContent);
  var $ = function (id) { return document.getElementById(id); };
  var filters = { run: $("filter-run"), domain: $("filter-domain"), stop: $("filter-stop"), outcome: $("filter-outcome"),
                  failed: $("filter-failed") };
  var listBody = document.querySelector("#trace-list tbody");
  var count = $("trace-count");
  var plot = $("trace-plot");
  var legend = $("trace-legend");
  var summary = $("trace-summary");
  var missingBox = $("trace-missing");
  var tip = $("trace-tooltip");
  var stepsHead = document.querySelector("#trace-steps thead tr");
  var stepsBody = document.querySelector("#trace-steps tbody");
  var failedBox = $("trace-failed");
  var judgmentsBox = $("trace-judgments");
  var hidden = {};  // predictor key -> true when switched off in the legend (kept across trajectories)
  var current = null;  // {run, id}

  function svg(name, attrs, parent) {
    var node = document.createElementNS(SVG_NS, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(node); }
    return node;
  }
  function html(name, text, cls) {
    var node = document.createElement(name);
    if (text !== undefined && text !== null) { node.textContent = text; }
    if (cls) { node.className = cls; }
    return node;
  }
  function fmt(v) { return (v === null || v === undefined) ? "missing" : Number(v).toFixed(3); }
  function clip(s, n) { s = String(s === null || s === undefined ? "" : s); return s.length > n ? s.slice(0, n) + "…" : s; }
  function failed(ep) { return ep.y !== 1; }  // no observed success: Y = 0, or any ending without an outcome

  // ------------------------------------------------------------------ filters and the trajectory list
  function addOptions(select, values) {
    values.forEach(function (v) { var o = html("option", v.label); o.value = v.value; select.appendChild(o); });
  }
  function unique(xs) { return xs.filter(function (x, i) { return xs.indexOf(x) === i; }).sort(); }
  addOptions(filters.run, DATA.runs.map(function (r, i) {
    return { value: String(i), label: r.label + " (" + r.episodes.length + (r.truncated ? ", first shown" : "") + ")" };
  }));
  addOptions(filters.domain, unique(DATA.runs.map(function (r) { return r.domain; })).map(function (d) {
    return { value: d, label: d };
  }));
  var stops = [];
  DATA.runs.forEach(function (r) { r.episodes.forEach(function (e) { stops.push(e.stop); }); });
  addOptions(filters.stop, unique(stops).map(function (s) { return { value: s, label: s }; }));

  function matches(runIndex, ep) {
    var run = DATA.runs[runIndex];
    if (filters.run.value !== "" && filters.run.value !== String(runIndex)) { return false; }
    if (filters.domain.value !== "" && filters.domain.value !== run.domain) { return false; }
    if (filters.stop.value !== "" && filters.stop.value !== ep.stop) { return false; }
    var o = filters.outcome.value;
    if (o === "none" && ep.y !== null) { return false; }
    if ((o === "0" || o === "1") && ep.y !== parseInt(o, 10)) { return false; }
    if (filters.failed.checked && !failed(ep)) { return false; }
    return true;
  }
  function visible() {
    var out = [];
    DATA.runs.forEach(function (run, r) {
      run.episodes.forEach(function (ep) { if (matches(r, ep)) { out.push({ run: r, ep: ep }); } });
    });
    return out;
  }
  function lastVerbal(ep) {
    var v = (ep.values.verbal || []).filter(function (x) { return x !== null; });
    return v.length ? v[v.length - 1].toFixed(2) : "—";
  }
  function fillList() {
    var items = visible();
    var total = DATA.runs.reduce(function (n, r) { return n + r.episodes.length; }, 0);
    count.textContent = items.length + " of " + total + " trajectories";
    listBody.innerHTML = "";
    items.forEach(function (it) {
      var tr = html("tr");
      tr.setAttribute("data-run", String(it.run));
      tr.setAttribute("data-episode", it.ep.id);
      [DATA.runs[it.run].label, it.ep.id, it.ep.task, it.ep.stop, it.ep.y === null ? "—" : String(it.ep.y),
       String(it.ep.steps.length), lastVerbal(it.ep)].forEach(function (c, j) {
        tr.appendChild(html("td", c, j < 4 ? "text" : ""));
      });
      tr.addEventListener("click", function () { choose(it.run, it.ep.id); });
      listBody.appendChild(tr);
    });
    var stillShown = current && items.some(function (it) { return it.run === current.run && it.ep.id === current.id; });
    if (!stillShown) {
      if (items.length) { draw(items[0].run, items[0].ep.id); } else { clear("No trajectory matches the filters."); }
    } else {
      mark();
    }
  }
  function mark() {
    Array.prototype.forEach.call(listBody.children, function (tr) {
      var on = current && tr.getAttribute("data-run") === String(current.run) && tr.getAttribute("data-episode") === current.id;
      tr.className = on ? "selected" : "";
    });
  }
  Object.keys(filters).forEach(function (k) { filters[k].addEventListener("change", fillList); });

  // ------------------------------------------------------------------ one trajectory
  function clear(message) {
    while (plot.firstChild) { plot.removeChild(plot.firstChild); }
    legend.innerHTML = ""; stepsHead.innerHTML = ""; stepsBody.innerHTML = ""; failedBox.innerHTML = "";
    judgmentsBox.innerHTML = "";
    missingBox.textContent = "";
    summary.textContent = message;
    current = null;
    plot.removeAttribute("data-episode");
    document.body.setAttribute("data-trace-ready", "1");
  }

  function draw(runIndex, episodeId) {
    var run = DATA.runs[runIndex];
    var ep = run.episodes.filter(function (e) { return e.id === episodeId; })[0] || run.episodes[0];
    if (!ep) { clear("This run has no trajectories."); return; }
    current = { run: runIndex, id: ep.id };
    mark();
    while (plot.firstChild) { plot.removeChild(plot.firstChild); }
    legend.innerHTML = "";
    var W = 920, H = 340, m = { l: 56, r: 18, t: 14, b: 36 };
    plot.setAttribute("viewBox", "0 0 " + W + " " + H);
    plot.setAttribute("width", W);
    plot.setAttribute("height", H);
    var T = ep.steps.length;
    var iw = W - m.l - m.r, ih = H - m.t - m.b;
    function x(t) { return m.l + (T <= 1 ? iw / 2 : (t - 1) / (T - 1) * iw); }
    function y(v) { return m.t + (1 - v) * ih; }
    var grid = svg("g", { "class": "grid" }, plot);
    var axis = svg("g", { "class": "axis" }, plot);
    [0, 0.25, 0.5, 0.75, 1].forEach(function (v) {
      svg("line", { x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }, grid);
      svg("text", { x: m.l - 8, y: y(v) + 4, "text-anchor": "end" }, axis).textContent = v.toFixed(2);
    });
    svg("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b, stroke: "#999" }, axis);
    svg("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, stroke: "#999" }, axis);
    var every = Math.max(1, Math.ceil(T / 20));
    ep.steps.forEach(function (s, i) {
      if (i % every === 0 || i === T - 1) {
        svg("text", { x: x(s.t), y: H - m.b + 16, "text-anchor": "middle" }, axis).textContent = String(s.t);
      }
    });
    svg("text", { x: m.l + iw / 2, y: H - 4, "text-anchor": "middle" }, axis).textContent = "step t";
    svg("text", { x: 10, y: m.t + ih / 2, "text-anchor": "middle", transform: "rotate(-90 10 " + (m.t + ih / 2) + ")" },
        axis).textContent = "F_t";

    var absent = [];
    run.predictors.forEach(function (p) {
      var vals = ep.values[p.key] || [];
      if (!vals.some(function (v) { return v !== null; })) { absent.push(p.label); return; }  // nothing to draw
      var g = svg("g", { "class": "series", "data-predictor": p.key }, plot);
      if (hidden[p.key]) { g.style.display = "none"; }
      var pts = [];
      function flush() {
        if (pts.length > 1) {
          svg("polyline", { points: pts.join(" "), fill: "none", stroke: p.color, "stroke-width": 2,
                            "stroke-dasharray": p.dash || "none" }, g);
        }
        pts = [];
      }
      vals.forEach(function (v, i) {
        if (v === null) { flush(); return; }
        pts.push(x(i + 1).toFixed(1) + "," + y(v).toFixed(1));
        svg("circle", { cx: x(i + 1), cy: y(v), r: 3.2, fill: p.color }, g);
      });
      flush();
      var item = html("span", null, "legend-item" + (hidden[p.key] ? " off" : ""));
      var sw = svg("svg", { width: 26, height: 8, "class": "sw" }, item);
      svg("line", { x1: 0, x2: 26, y1: 4, y2: 4, stroke: p.color, "stroke-width": 2.5,
                    "stroke-dasharray": p.dash || "none" }, sw);
      item.appendChild(document.createTextNode(p.label));
      item.setAttribute("data-predictor", p.key);
      item.title = "click to show or hide";
      item.addEventListener("click", function () {
        hidden[p.key] = !hidden[p.key];
        g.style.display = hidden[p.key] ? "none" : "";
        item.className = "legend-item" + (hidden[p.key] ? " off" : "");
      });
      legend.appendChild(item);
    });
    var none = (run.missing || []).concat(absent);
    missingBox.textContent = none.length ? "No values (not drawn): " + none.join(", ") + "." : "";

    ep.steps.forEach(function (s, i) {
      var half = T <= 1 ? iw / 2 : iw / (T - 1) / 2;
      var band = svg("rect", { "class": "band", x: x(s.t) - half, y: m.t, width: 2 * half, height: ih, "data-t": s.t }, plot);
      band.addEventListener("mousemove", function (ev) { showTip(ev, run, ep, i); });
      band.addEventListener("mouseleave", function () { tip.style.display = "none"; });
    });

    summary.textContent = run.label + " · " + ep.id + " · task " + ep.task + " · stop " + ep.stop +
      (ep.y === null ? " · outcome unobserved" : " · Y = " + ep.y) + " · " + T + " steps";
    failedBox.innerHTML = "";
    (ep.failed || []).forEach(function (f) {
      failedBox.appendChild(html("div", "unparsed step " + (T + 1) + ", attempt " + f.attempt + ": " +
        (f.error || "rejected") + " — output: " + clip(f.raw, 300), "failed-attempt"));
    });
    drawJudgments(ep);
    // the step table: one column per predictor, headed by its name and line style
    stepsHead.innerHTML = "";
    ["t", "action", "observation"].forEach(function (h, j) { stepsHead.appendChild(html("th", h, j ? "text" : "")); });
    run.predictors.forEach(function (p) {
      var th = html("th");
      th.setAttribute("data-predictor", p.key);
      var sw = svg("svg", { width: 18, height: 6, "class": "sw" }, th);
      svg("line", { x1: 0, x2: 18, y1: 3, y2: 3, stroke: p.color, "stroke-width": 2.5, "stroke-dasharray": p.dash || "none" }, sw);
      th.appendChild(document.createTextNode(p.label));
      stepsHead.appendChild(th);
    });
    stepsBody.innerHTML = "";
    ep.steps.forEach(function (s, i) {
      var tr = html("tr");
      tr.appendChild(html("td", String(s.t)));
      tr.appendChild(html("td", clip(s.action, 240), "text"));
      tr.appendChild(html("td", clip(s.obs, 240), "text"));
      run.predictors.forEach(function (p) { tr.appendChild(html("td", fmt((ep.values[p.key] || [])[i]))); });
      stepsBody.appendChild(tr);
    });
    plot.setAttribute("data-episode", ep.id);
    plot.setAttribute("data-run", String(runIndex));
    document.body.setAttribute("data-trace-ready", "1");
  }

  // the trajectory's judgments (uqh report --judgments DIR): judge, repeat, score or why missing, cited steps
  function drawJudgments(ep) {
    judgmentsBox.innerHTML = "";
    var js = ep.judgments || [];
    if (!js.length) { return; }
    var head = html("div", "Judgments (" + js.length + ") — ", "judgments-head");
    var link = html("a", "judge analysis");
    link.setAttribute("href", "#judges");
    head.appendChild(link);
    judgmentsBox.appendChild(head);
    js.forEach(function (j) {
      var score = j.score === null ? "missing (" + (j.missing || "unparsed") + ")" : j.score + "/3";
      var cited = j.cited.length ? " · cited steps " + j.cited.join(", ") : "";
      var row = html("div", j.metric + " " + j.label + " · repeat " + j.repeat + " · " + score + cited +
        (j.rationale ? " — " + clip(j.rationale, 300) : ""), "judgment");
      row.setAttribute("data-metric", j.metric);
      judgmentsBox.appendChild(row);
    });
  }

  function showTip(ev, run, ep, i) {
    var s = ep.steps[i];
    tip.innerHTML = "";
    function line(label, text) {
      tip.appendChild(html("b", label + " "));
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

  function choose(runIndex, episodeId) {
    history.replaceState(null, "", "#trace=" + runIndex + "/" + encodeURIComponent(episodeId));
    draw(runIndex, episodeId);
  }
  function fromHash() {
    var m = /trace=(\d+)\/(.+)$/.exec(decodeURIComponent(location.hash.slice(1)));
    if (!m) { return null; }
    var r = parseInt(m[1], 10);
    return (r >= 0 && r < DATA.runs.length) ? { run: r, ep: m[2] } : null;
  }
  function openSection() {  // a link to a collapsed section opens it
    var target = location.hash.length > 1 ? document.getElementById(location.hash.slice(1)) : null;
    var details = target ? target.querySelector("details") : null;
    if (details) { details.open = true; }
  }
  window.addEventListener("hashchange", function () {
    var h = fromHash();
    if (h) { draw(h.run, h.ep); } else { openSection(); }
  });

  openSection();
  fillList();
  var h = fromHash();
  if (h) { draw(h.run, h.ep); }
  if (!DATA.runs.length) { clear("No trajectories."); }
})();
