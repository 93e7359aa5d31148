/* Trace explorer: filter the trajectories of every run (run, domain, stop reason, outcome, failed only), pick one in
 * the list, see the per-step confidence traces of every predictor, and the step's action and observation on hover.
 * Data: the JSON in <script id="trace-data">. Selection: a click in the list or the URL hash
 * "#trace=<run index>/<episode id>". No network, no libraries. */
(function () {
  "use strict";
  var U = window.UQHTrace;  // the chart and the step transcript (trace_chart.js, shared with `uqh view`)
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

  var html = U.html, fmt = U.fmt, clip = U.clip;
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
    U.drawChart(plot, legend, missingBox, run, ep, hidden, function (ev, i) {
      if (ev) { showTip(ev, run, ep, i); } else { tip.style.display = "none"; }
    });
    summary.textContent = run.label + " · " + ep.id + " · task " + ep.task + " · stop " + ep.stop +
      (ep.y === null ? " · outcome unobserved" : " · Y = " + ep.y) + " · " + ep.steps.length + " steps";
    U.failedAttempts(failedBox, ep);
    drawJudgments(ep);
    U.stepTable(stepsHead, stepsBody, run, ep);
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
