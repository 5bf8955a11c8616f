// stagedoor-jobs dashboard: live refresh. Polls the page's JSON endpoint every 2 s and
// updates the counts in place (textContent only: nothing from the server becomes markup,
// except the chart, which the server renders and escapes). No framework, no CDN.
(function () {
  "use strict";
  var section = document.querySelector("[data-live]");
  if (!section || !window.fetch) { return; }
  var kind = section.getAttribute("data-live");
  var base = document.body.getAttribute("data-base") || "";
  var status = section.querySelector(".live-status");

  function setText(el, value) {
    if (el && el.textContent !== String(value)) { el.textContent = String(value); }
  }

  function rowsBy(attr) {
    var out = {};
    var rows = section.querySelectorAll("tr[" + attr + "]");
    for (var i = 0; i < rows.length; i++) { out[rows[i].getAttribute(attr)] = rows[i]; }
    return out;
  }

  function sameSet(have, names) {
    var keys = Object.keys(have);
    if (keys.length !== names.length) { return false; }
    for (var i = 0; i < names.length; i++) { if (!have.hasOwnProperty(names[i])) { return false; } }
    return true;
  }

  function queues(data) {
    var rows = rowsBy("data-queue");
    if (data.error) { throw new Error(data.error); }
    var names = (data.queues || []).map(function (q) { return q.queue; });
    // A queue came or went: the page is drawn again.
    if (!sameSet(rows, names)) { window.location.reload(); return false; }
    (data.queues || []).forEach(function (q) {
      var row = rows[q.queue];
      ["ready", "running", "delayed", "dead", "oldest"].forEach(function (f) {
        var cell = row.querySelector("[data-field=" + f + "]");
        var target = cell && (cell.querySelector("a") || cell);
        setText(target, q[f]);
      });
    });
    var chart = document.getElementById("chart");
    if (chart && typeof data.chart === "string") { chart.innerHTML = data.chart; }
    return true;
  }

  function workers(data) {
    var rows = rowsBy("data-worker");
    if (data.error) { throw new Error(data.error); }
    var ids = (data.workers || []).map(function (w) { return w.id; });
    // A worker came or went: the page is drawn again.
    if (!sameSet(rows, ids)) { window.location.reload(); return false; }
    (data.workers || []).forEach(function (w) {
      var row = rows[w.id];
      ["host", "pid", "app", "queues", "in_flight", "started", "heartbeat"].forEach(function (f) {
        setText(row.querySelector("[data-field=" + f + "]"), w[f]);
      });
    });
    return true;
  }

  // A job's result page: the progress bar and message; the page is drawn again once the
  // result is there (and then no longer polls).
  function result(data) {
    if (data.error) { throw new Error(data.error); }
    if (data.found) { window.location.reload(); return false; }
    var p = data.progress;
    if (p) {
      var bar = section.querySelector("[data-field=bar]");
      if (bar) { bar.value = p.fraction; }
      setText(section.querySelector("[data-field=percent]"), p.percent);
      setText(section.querySelector("[data-field=message]"), p.message);
      setText(section.querySelector("[data-field=at]"), "(" + p.at + ")");
    }
    return true;
  }

  var src = section.getAttribute("data-src") || (base + "/api/" + kind);

  function tick() {
    fetch(src, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (data) {
        var ok = kind === "queues" ? queues(data) : kind === "result" ? result(data) : workers(data);
        if (ok && status) {
          status.classList.remove("stale");
          setText(status, "Refreshed every 2 s; last at " + new Date().toLocaleTimeString() + ".");
        }
        if (ok) { window.setTimeout(tick, 2000); }
      })
      .catch(function (e) {
        if (status) {
          status.classList.add("stale");
          setText(status, "Not refreshed (" + e.message + "); retrying.");
        }
        window.setTimeout(tick, 2000);
      });
  }

  window.setTimeout(tick, 2000);
})();
