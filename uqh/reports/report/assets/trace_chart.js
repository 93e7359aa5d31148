/* The trace chart and the step transcript of one trajectory, shared by the report's trace explorer (trace.js, inlined
 * into report.html) and `uqh view`'s trajectory page (view.js, served by uqh/reports/view). Defines window.UQHTrace.
 *
 * A run is {predictors: [{key, label, color, dash}], missing: [labels]}; a trajectory is
 * {steps: [{t, action, obs, conf_raw, think?, explanation?, confidence?, repairs?}], values: {key: [v|null]},
 *  failed: [{attempt, error, raw}]}. Optional step fields (think, explanation, confidence, repairs) get a column
 * when the trajectory has them. No network, no libraries. */
(function () {
  "use strict";
  var SVG_NS = "http://www.w3.org/2000/svg";

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
  function swatch(parent, p, w, h) {
    var sw = svg("svg", { width: w, height: h, "class": "sw" }, parent);
    svg("line", { x1: 0, x2: w, y1: h / 2, y2: h / 2, stroke: p.color, "stroke-width": 2.5,
                  "stroke-dasharray": p.dash || "none" }, sw);
  }

  function axes(plot, ep, geom) {
    var grid = svg("g", { "class": "grid" }, plot);
    var axis = svg("g", { "class": "axis" }, plot);
    var m = geom.m, W = geom.W, H = geom.H, T = ep.steps.length;
    [0, 0.25, 0.5, 0.75, 1].forEach(function (v) {
      svg("line", { x1: m.l, x2: W - m.r, y1: geom.y(v), y2: geom.y(v) }, grid);
      svg("text", { x: m.l - 8, y: geom.y(v) + 4, "text-anchor": "end" }, axis).textContent = v.toFixed(2);
    });
    svg("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b, stroke: "#999" }, axis);
    svg("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, stroke: "#999" }, axis);
    var every = Math.max(1, Math.ceil(T / 20));
    ep.steps.forEach(function (s, i) {
      if (i % every === 0 || i === T - 1) {
        svg("text", { x: geom.x(s.t), y: H - m.b + 16, "text-anchor": "middle" }, axis).textContent = String(s.t);
      }
    });
    svg("text", { x: m.l + geom.iw / 2, y: H - 4, "text-anchor": "middle" }, axis).textContent = "step t";
    svg("text", { x: 10, y: m.t + geom.ih / 2, "text-anchor": "middle",
                  transform: "rotate(-90 10 " + (m.t + geom.ih / 2) + ")" }, axis).textContent = "F_t";
  }

  function series(plot, legend, p, vals, geom, hidden) {
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
      pts.push(geom.x(i + 1).toFixed(1) + "," + geom.y(v).toFixed(1));
      svg("circle", { cx: geom.x(i + 1), cy: geom.y(v), r: 3.2, fill: p.color }, g);
    });
    flush();
    var item = html("span", null, "legend-item" + (hidden[p.key] ? " off" : ""));
    swatch(item, p, 26, 8);
    item.appendChild(document.createTextNode(p.label));
    item.setAttribute("data-predictor", p.key);
    item.title = "click to show or hide";
    item.addEventListener("click", function () {
      hidden[p.key] = !hidden[p.key];
      g.style.display = hidden[p.key] ? "none" : "";
      item.className = "legend-item" + (hidden[p.key] ? " off" : "");
    });
    legend.appendChild(item);
  }

  /* Draw every predictor's per-step values of ``ep`` into the <svg> ``plot`` with a clickable ``legend``;
   * ``hidden`` (predictor key -> true) survives across trajectories; ``onStep(event, stepIndex)`` is called while
   * the pointer is over a step's band (null on leave). Predictors without a value are listed in ``missingBox``. */
  function drawChart(plot, legend, missingBox, run, ep, hidden, onStep) {
    while (plot.firstChild) { plot.removeChild(plot.firstChild); }
    legend.innerHTML = "";
    var W = 920, H = 340, m = { l: 56, r: 18, t: 14, b: 36 };
    plot.setAttribute("viewBox", "0 0 " + W + " " + H);
    plot.setAttribute("width", W);
    plot.setAttribute("height", H);
    var T = ep.steps.length, iw = W - m.l - m.r, ih = H - m.t - m.b;
    var geom = { W: W, H: H, m: m, iw: iw, ih: ih,
                 x: function (t) { return m.l + (T <= 1 ? iw / 2 : (t - 1) / (T - 1) * iw); },
                 y: function (v) { return m.t + (1 - v) * ih; } };
    axes(plot, ep, geom);
    var absent = [];
    run.predictors.forEach(function (p) {
      var vals = ep.values[p.key] || [];
      if (!vals.some(function (v) { return v !== null; })) { absent.push(p.label); return; }  // nothing to draw
      series(plot, legend, p, vals, geom, hidden);
    });
    var none = (run.missing || []).concat(absent);
    missingBox.textContent = none.length ? "No values (not drawn): " + none.join(", ") + "." : "";
    ep.steps.forEach(function (s, i) {
      var half = T <= 1 ? iw / 2 : iw / (T - 1) / 2;
      var band = svg("rect", { "class": "band", x: geom.x(s.t) - half, y: m.t, width: 2 * half, height: ih,
                               "data-t": s.t }, plot);
      band.addEventListener("mousemove", function (ev) { onStep(ev, i); });
      band.addEventListener("mouseleave", function () { onStep(null, i); });
    });
    plot.setAttribute("data-episode", ep.id);
  }

  var OPTIONAL = [["think", "think", 240], ["explanation", "explanation", 240], ["confidence", "<confidence>", 40],
                  ["repairs", "repairs", 10]];

  /* The step transcript: t, action, observation, the optional fields the trajectory has, then one column per
   * predictor headed by its name and line style. */
  function stepTable(head, body, run, ep) {
    var extra = OPTIONAL.filter(function (o) { return ep.steps.some(function (s) { return o[0] in s; }); });
    head.innerHTML = "";
    ["t", "action", "observation"].concat(extra.map(function (o) { return o[1]; })).forEach(function (h, j) {
      head.appendChild(html("th", h, j ? "text" : ""));
    });
    run.predictors.forEach(function (p) {
      var th = html("th");
      th.setAttribute("data-predictor", p.key);
      swatch(th, p, 18, 6);
      th.appendChild(document.createTextNode(p.label));
      head.appendChild(th);
    });
    body.innerHTML = "";
    ep.steps.forEach(function (s, i) {
      var tr = html("tr");
      tr.setAttribute("data-t", String(s.t));
      tr.appendChild(html("td", String(s.t)));
      tr.appendChild(html("td", clip(s.action, 240), "text"));
      tr.appendChild(html("td", clip(s.obs, 240), "text"));
      extra.forEach(function (o) {
        var v = s[o[0]];
        tr.appendChild(html("td", v === null || v === undefined ? "—" : clip(v, o[2]), "text"));
      });
      run.predictors.forEach(function (p) { tr.appendChild(html("td", fmt((ep.values[p.key] || [])[i]))); });
      body.appendChild(tr);
    });
  }

  /* The attempts after the last parsed step that no repair could parse (kept, never dropped). */
  function failedAttempts(box, ep) {
    box.innerHTML = "";
    (ep.failed || []).forEach(function (f) {
      box.appendChild(html("div", "unparsed step " + (ep.steps.length + 1) + ", attempt " + f.attempt + ": " +
        (f.error || "rejected") + " — output: " + clip(f.raw, 300), "failed-attempt"));
    });
  }

  window.UQHTrace = { svg: svg, html: html, fmt: fmt, clip: clip, drawChart: drawChart, stepTable: stepTable,
                      failedAttempts: failedAttempts };
})();
