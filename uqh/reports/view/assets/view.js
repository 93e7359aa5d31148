/* `uqh view` pages: fill the page named by <body data-page> from the JSON routes of uqh/reports/view/app.py and
 * poll them every data-poll ms. Only what changed is redrawn: the run list replaces a row whose values changed; the
 * run page asks for the trajectories it has not got (?since=N) and appends them; the trajectory page redraws its
 * chart when the Platt stream arrives. The chart and the transcript are trace_chart.js's (shared with the report).
 * When a page has drawn its data, <body data-ready="1">. */
(function () {
  "use strict";
  var U = window.UQHTrace;
  var html = U.html, fmt = U.fmt, clip = U.clip;
  var body = document.body;
  var POLL = parseInt(body.getAttribute("data-poll"), 10) || 2000;
  var $ = function (id) { return document.getElementById(id); };
  var status = $("status");

  function getJSON(url) {
    return fetch(url, { cache: "no-store" }).then(function (r) {
      if (!r.ok) { return r.text().then(function (t) { throw new Error(t || (r.status + " " + r.statusText)); }); }
      return r.json();
    });
  }
  function stamp(text) { status.textContent = text + " · updated " + new Date().toLocaleTimeString(); }
  function fail(err) { status.textContent = "error: " + err.message; status.className = "meta error"; }
  function num(v, digits) { return (v === null || v === undefined) ? "—" : Number(v).toFixed(digits); }
  function notes(list) {
    var box = $("view-notes");
    if (!box) { return; }
    box.innerHTML = "";
    (list || []).forEach(function (n) { box.appendChild(html("p", n, "note")); });
  }

  // ------------------------------------------------------------------ the run list
  function runCells(r) {
    var link = html("a", r.path.split("/").pop());
    link.href = "/run/" + r.key;
    link.title = r.path;
    if (r.error) { return [link, html("span", r.error, "error")]; }
    var stops = Object.keys(r.stops).sort().map(function (k) { return k + " " + r.stops[k]; }).join(" · ");
    var done = r.done + " / " + r.planned + (r.in_progress ? " (+" + r.in_progress + " in progress)" : "");
    return [link, r.kind, r.domain, r.model, done, stops || "—", num(r.base_rate, 3),
            r.cost_usd === null ? "—" : "$" + r.cost_usd.toFixed(4), r.state];
  }
  function drawRuns(data) {
    var tbody = document.querySelector("#run-list tbody");
    var listed = {};
    data.runs.forEach(function (r) { listed[r.key] = true; });
    Array.prototype.slice.call(tbody.querySelectorAll("tr[data-key]")).forEach(function (tr) {
      if (!listed[tr.getAttribute("data-key")]) { tbody.removeChild(tr); }  // its directory was deleted
    });
    data.runs.forEach(function (r) {
      var sig = JSON.stringify(r);
      var tr = tbody.querySelector("tr[data-key='" + r.key + "']");
      if (tr && tr.getAttribute("data-sig") === sig) { return; }  // unchanged: left alone
      var fresh = html("tr");
      fresh.setAttribute("data-key", r.key);
      fresh.setAttribute("data-sig", sig);
      fresh.setAttribute("data-state", r.error ? "error" : r.state);
      runCells(r).forEach(function (c, j) {
        var td = typeof c === "string" ? html("td", c) : html("td");
        if (typeof c !== "string") { td.appendChild(c); }
        td.className = (j === 4 || j === 6 || j === 7) ? "" : "text";
        if (r.error && j === 1) { td.colSpan = 8; }
        fresh.appendChild(td);
      });
      if (tr) { tbody.replaceChild(fresh, tr); } else { tbody.appendChild(fresh); }
    });
    notes(data.notes.concat([].concat.apply([], data.runs.map(function (r) {
      return (r.notes || []).map(function (n) { return r.path + ": " + n; });
    }))));
    stamp(data.runs.length + " runs");
    body.setAttribute("data-ready", "1");
  }
  function pollRuns() {
    getJSON("/api/runs").then(drawRuns, fail).then(function () { setTimeout(pollRuns, POLL); });
  }

  // ------------------------------------------------------------------ one run: the trajectory list
  var SHOWN = 500;  // rows drawn at most; filters narrow the rest
  // items: the finished trajectories (appended as they are read); running: the episodes in progress, replaced on
  // every poll (an episode leaves it when its line lands and it is read among the finished ones)
  var run = { items: [], running: [], predictors: [], stops: {}, sort: null, desc: true };
  function shownItems() {
    var finished = {};
    run.items.forEach(function (it) { finished[it.id] = true; });
    return run.items.concat(run.running.filter(function (it) { return !finished[it.id]; }));
  }
  function failed(it) { return it.y !== 1; }  // no observed success, as the report's filter
  function matches(it) {
    var stop = $("filter-stop").value, o = $("filter-outcome").value, text = $("filter-text").value.toLowerCase();
    if (stop && it.stop !== stop) { return false; }
    if (o === "none" && it.y !== null) { return false; }
    if ((o === "0" || o === "1") && it.y !== parseInt(o, 10)) { return false; }
    if ($("filter-failed").checked && !failed(it)) { return false; }
    if (text && (it.task + " " + it.text).toLowerCase().indexOf(text) < 0) { return false; }
    return true;
  }
  function sortValue(it) {
    if (run.sort === "steps") { return it.steps; }
    var v = it.last[run.sort];
    return v === null || v === undefined ? null : v;
  }
  function header() {
    var head = document.querySelector("#trajectory-list thead tr");
    head.innerHTML = "";
    var cols = [["id", "trajectory"], ["task", "task"], ["stop", "stop reason"], ["y", "Y"], ["steps", "steps"]]
      .concat(run.predictors.map(function (p) { return [p.key, "last " + p.label]; }));
    cols.forEach(function (c, j) {
      var th = html("th", c[1] + (run.sort === c[0] ? (run.desc ? " ▾" : " ▴") : ""), j < 3 ? "text" : "");
      th.setAttribute("data-col", c[0]);
      if (j >= 4) {
        th.className += " sortable";
        th.title = "click to sort";
        th.addEventListener("click", function () {
          run.desc = run.sort === c[0] ? !run.desc : true;
          run.sort = c[0];
          header();
          drawList();
        });
      }
      head.appendChild(th);
    });
  }
  function drawList() {
    var all = shownItems();
    var items = all.filter(matches);
    if (run.sort) {
      var sign = run.desc ? -1 : 1;
      items = items.slice().sort(function (a, b) {
        var x = sortValue(a), y = sortValue(b);
        if (x === null) { return y === null ? 0 : 1; }  // missing values last
        if (y === null) { return -1; }
        return sign * (x - y);
      });
    }
    var tbody = document.querySelector("#trajectory-list tbody");
    tbody.innerHTML = "";
    items.slice(0, SHOWN).forEach(function (it) {
      var tr = html("tr");
      tr.setAttribute("data-episode", it.id);
      tr.setAttribute("data-stop", it.stop);
      var link = html("a", it.id);
      link.href = "/run/" + body.getAttribute("data-key") + "/trajectory?id=" + encodeURIComponent(it.id);
      var td = html("td", null, "text");
      td.appendChild(link);
      tr.appendChild(td);
      tr.appendChild(html("td", clip(it.task, 60), "text"));
      tr.appendChild(html("td", it.stop, "text"));
      tr.appendChild(html("td", it.y === null ? "—" : String(it.y)));
      tr.appendChild(html("td", String(it.steps)));
      run.predictors.forEach(function (p) { tr.appendChild(html("td", num(it.last[p.key], 3))); });
      tbody.appendChild(tr);
    });
    $("trace-count").textContent = items.length + " of " + all.length + " trajectories";
    $("list-more").textContent = items.length > SHOWN ? "Showing the first " + SHOWN + " of " + items.length +
      " matching; narrow the filters to see the others." : "";
  }
  function addStops(items) {
    var select = $("filter-stop");
    items.forEach(function (it) {
      if (!run.stops[it.stop]) {
        run.stops[it.stop] = true;
        var o = html("option", it.stop);
        o.value = it.stop;
        select.appendChild(o);
      }
    });
  }
  function pollRun() {
    var key = body.getAttribute("data-key");
    getJSON("/api/run/" + key + "/trajectories?since=" + run.items.length).then(function (data) {
      if (!run.predictors.length) { run.predictors = data.predictors; header(); }
      var runningSig = JSON.stringify(data.running);
      if (data.items.length || runningSig !== JSON.stringify(run.running)) {
        run.items = run.items.concat(data.items);
        run.running = data.running;
        addStops(data.items.concat(data.running));
        drawList();
      }
      notes(data.notes);
      stamp(run.items.length + " of " + data.done + " finished trajectories read" +
            (data.running.length ? ", " + data.running.length + " in progress" : ""));
      if (data.read === data.done) { body.setAttribute("data-ready", "1"); }
      setTimeout(pollRun, data.read < data.done ? 0 : POLL);  // the rest at once, then poll
    }, function (err) { fail(err); setTimeout(pollRun, POLL); });
  }
  function startRun() {
    ["filter-stop", "filter-outcome", "filter-failed"].forEach(function (id) { $(id).addEventListener("change", drawList); });
    $("filter-text").addEventListener("input", drawList);
    pollRun();
  }

  // ------------------------------------------------------------------ one trajectory
  var hidden = {};
  function showStepTip(ev, data, i) {
    var tip = $("trace-tooltip");
    if (!ev) { tip.style.display = "none"; return; }
    var s = data.ep.steps[i];
    tip.innerHTML = "";
    function line(label, text) { tip.appendChild(html("b", label + " ")); tip.appendChild(document.createTextNode(text + "\n")); }
    line("step", String(s.t));
    line("action", clip(s.action, 300));
    line("observation", clip(s.obs, 420));
    if (s.conf_raw !== null && s.conf_raw !== undefined) { line("<confidence>", s.conf_raw); }
    data.run.predictors.forEach(function (p) { line(p.label + ":", fmt((data.ep.values[p.key] || [])[i])); });
    place(tip, ev);
  }
  function place(tip, ev) {
    tip.style.display = "block";
    tip.style.left = Math.max(0, Math.min(ev.clientX + 14, window.innerWidth - 480)) + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  }
  function facts(data) {
    var ep = data.ep, box = $("trajectory-facts");
    box.innerHTML = "";
    var items = [["stop reason", ep.stop], ["Y", ep.y === null ? "unobserved" : String(ep.y)],
                 ["reward", ep.reward === null ? "—" : String(ep.reward)], ["steps", String(ep.steps.length)]];
    if (data.q_hat_z !== null && data.q_hat_z !== undefined) { items.push(["q̂_Z", data.q_hat_z.toFixed(3)]); }
    Object.keys(data.judged || {}).sort().forEach(function (m) { items.push(["judge " + m, data.judged[m].toFixed(2)]); });
    items.forEach(function (kv) {
      var span = html("span", null, "fact");
      span.setAttribute("data-fact", kv[0]);
      span.appendChild(html("b", kv[0] + " "));
      span.appendChild(document.createTextNode(kv[1]));
      box.appendChild(span);
    });
  }
  function rejected(ep) {
    var box = $("rejected-attempts");
    box.innerHTML = "";
    ep.steps.forEach(function (s) {
      (s.rejected || []).forEach(function (a) {
        box.appendChild(html("div", "step " + s.t + ", attempt " + a.attempt + " (repaired): " + a.error +
          " — output: " + clip(a.raw, 300), "failed-attempt"));
      });
    });
  }
  function tokenTip(ev, tok) {
    var tip = $("token-tooltip");
    tip.innerHTML = "";
    tip.appendChild(html("div", "p = " + tok.p.toFixed(4) + " for " + JSON.stringify(tok.s), "chosen"));
    var table = html("table");
    tok.top.forEach(function (alt) {
      var tr = html("tr", null, alt[0] === tok.s ? "is-chosen" : "");
      tr.appendChild(html("td", JSON.stringify(alt[0])));
      tr.appendChild(html("td", alt[1].toFixed(4)));
      table.appendChild(tr);
    });
    tip.appendChild(table);
    place(tip, ev);
  }
  function heatmap(data) {
    var box = $("token-heatmap");
    box.innerHTML = "";
    if (!data.tokens.length) { box.appendChild(html("p", "No sidecar rows: no token probabilities recorded.", "note")); }
    data.tokens.forEach(function (row) {
      var user = row.role === "user";
      var block = html("div", null, "token-step" + (user ? " user" : ""));
      block.setAttribute("data-t", String(row.t));
      block.setAttribute("data-role", row.role);
      var head = user ? (row.t === 0 ? "user, opening turn" : "user, reply to step " + row.t)
                      : "step " + row.t + (row.attempt ? " (accepted repair " + row.attempt + ")" : "");
      block.appendChild(html("div", head, "token-head"));
      var line = html("div", null, "token-line");
      if (row.tokens === null) { line.appendChild(html("span", "the provider returned no logprobs for this call", "note")); }
      (row.tokens || []).forEach(function (tok, i) {
        var inAction = row.action && i >= row.action[0] && i < row.action[1];
        var span = html("span", tok.s, "tok" + (inAction ? " action" : ""));
        span.setAttribute("data-i", String(i));
        span.setAttribute("data-p", String(tok.p));
        span.style.backgroundColor = "rgba(213, 94, 0, " + (1 - tok.p).toFixed(3) + ")";  // unlikely = strong
        span.addEventListener("mouseenter", function (ev) { tokenTip(ev, tok); });
        span.addEventListener("mouseleave", function () { $("token-tooltip").style.display = "none"; });
        line.appendChild(span);
      });
      block.appendChild(line);
      box.appendChild(block);
    });
  }
  var drawnSig = null;
  function drawTrajectory(data) {
    // the transcript, facts and tokens are redrawn only when the episode changed (a step more, or it finished)
    var sig = data.ep.stop + ":" + data.ep.steps.length + ":" + data.tokens.length;
    var first = sig !== drawnSig;
    drawnSig = sig;
    U.drawChart($("trace-plot"), $("trace-legend"), $("trace-missing"), data.run, data.ep, hidden,
                function (ev, i) { showStepTip(ev, data, i); });
    $("trace-summary").textContent = data.ep.id + " · task " + data.ep.task + " · stop " + data.ep.stop +
      (data.running ? " · " + data.ep.steps.length + " steps so far (from its checkpoint; updated live)" :
       data.platt_pending ? " · Platt stream: being fitted on the run's trajectories" :
       (data.ep.values.verbal_platt ? "" : " · no Platt value: the map is fitted and applied on complete trajectories"));
    if (!first) { return; }
    $("task-text").textContent = data.ep.text;
    facts(data);
    notes(data.notes);
    U.stepTable(document.querySelector("#trace-steps thead tr"), document.querySelector("#trace-steps tbody"),
                data.run, data.ep);
    U.failedAttempts($("trace-failed"), data.ep);
    rejected(data.ep);
    heatmap(data);
  }
  function pollTrajectory() {
    var url = "/api/run/" + body.getAttribute("data-key") + "/trajectory?id=" +
      encodeURIComponent(body.getAttribute("data-episode"));
    getJSON(url).then(function (data) {
      drawTrajectory(data);
      body.setAttribute("data-stop", data.ep.stop);
      stamp(data.ep.steps.length + " steps" + (data.running ? " so far (" + data.ep.stop + ")" : ""));
      body.setAttribute("data-ready", "1");
      if (data.platt_pending || (data.running && data.ep.stop === "running")) { setTimeout(pollTrajectory, POLL); }
    }, fail);
  }

  var PAGES = { runs: pollRuns, run: startRun, trajectory: pollTrajectory };
  (PAGES[body.getAttribute("data-page")] || function () {})();
})();
