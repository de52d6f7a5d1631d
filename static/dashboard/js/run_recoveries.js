/* The run page's faults (EdgePipe.run, run.js): the fault and control events table, the
   recoveries (phase by phase, as a table and a chart on the run's clock, with the checks that
   kept the plan), and the devices table's loss notes and status. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const R = EP.run;
  const h = EP.h;
  const fmt = EP.fmt;
  const cfg = R.cfg;
  const labels = R.labels;
  const $ = R.$;

  /* ---------------------------------------------------------------- faults */

  function renderFaults() {
    const body = $("faults");
    const faults = R.snap.faults;
    $("faults-empty").hidden = faults.length > 0;
    $("faults-table").hidden = faults.length === 0;
    $("faults-count").textContent = faults.length ? EP.plural(faults.length, "event") : "";
    body.replaceChildren();
    for (let i = faults.length - 1; i >= 0; i -= 1) {
      const f = faults[i];
      const keys = f.detail ? Object.keys(f.detail) : [];
      body.append(h("tr", null,
        h("td", { class: "at" }, f.at.toFixed(3) + " s"),
        h("td", { class: "kind-" + f.kind }, f.kind.replace(/_/g, " ")),
        h("td", null, f.device ? (labels[f.device] || f.device) : "run"),
        h("td", { class: "detail small", title: keys.length ? JSON.stringify(f.detail, null, 1) : null },
          detailView(f.detail, keys))));
    }
  }

  const SHORT_JSON = 60;

  /* a value of a fault's detail in words: device uids by name, a plan's stages as its
     pipeline, anything else nested as JSON cut short (the cell's title holds it whole) */
  function detailValue(key, value) {
    if (value === null || value === undefined) return "–";
    if (key === "stages" && Array.isArray(value)) {
      return value.map(function (st) {
        if (!st || typeof st !== "object") return String(st);
        return R.groupText(st) + (Array.isArray(st.layers) ? " [" + st.layers.join("–") + "]" : "");
      }).join(" → ");
    }
    if (typeof value === "string") return labels[value] || value;
    if (Array.isArray(value) && value.every(function (v) { return typeof v !== "object" || v === null; })) {
      return value.length ? value.map(function (v) { return labels[v] || String(v); }).join(", ") : "none";
    }
    if (typeof value !== "object") return String(value);
    return R.shortened(JSON.stringify(value), SHORT_JSON);
  }

  function detailView(detail, keys) {
    const box = h("span");
    keys.forEach(function (key, i) {
      if (i) box.append(h("span", { class: "muted" }, " · "));
      box.append(h("span", { class: "kv" }, h("span", { class: "muted" }, key + ": "), detailValue(key, detail[key])));
    });
    return box;
  }
  /* ---------------------------------------------------------------- recoveries */

  const PHASES = [
    { key: "replanning_s", from: "detected_s", to: "replanned_s", label: "lost (or decided) → re-planned", color: "#dc2626" },
    { key: "redistributing_s", from: "replanned_s", to: "weights_moved_s", label: "re-planned → weights moved", color: "#7c3aed" },
    { key: "resuming_s", from: "weights_moved_s", to: "resumed_s", label: "weights moved → resumed", color: "#16a34a" },
  ];

  /* where a phase starts: the first from the loss, or for a dynamic re-partition from its
     decision (as fault_recoveries measures replanning_s) */
  function phaseStart(r, phase) {
    if (phase.key === "replanning_s" && r.detected_s === null) return r.started_s;
    return r[phase.from];
  }

  function faint(hex) {
    const n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + ",0.35)";
  }

  function newestTime() {
    let hi = 0;
    for (const e of R.snap.timeline) if (e.end > hi) hi = e.end;
    for (const f of R.snap.faults) if (f.at > hi) hi = f.at;
    return hi;
  }

  function deviceNames(uids) {
    return uids.map(function (u) { return labels[u] || u; }).join(", ");
  }

  function recoveryLabel(r, i) {
    const head = r.generation === null ? "#" + (i + 1) : "gen " + r.generation;
    return head + " · " + (r.cause === "failure" ? "lost " + (deviceNames(r.lost) || "?") : "dynamic");
  }

  function atText(t, since) {
    if (t === null) return "–";
    return t.toFixed(3) + " s" + (since === null || since === undefined ? "" : " (+" + fmt.seconds(since) + ")");
  }

  function breakEven(r) {
    if (r.saved_s === null && r.cost_s === null) return null;
    const saved = r.saved_s === null ? "?" : fmt.seconds(r.saved_s);
    const cost = r.cost_s === null ? "?" : fmt.seconds(r.cost_s);
    const worth = r.saved_s !== null && r.cost_s !== null ? (r.saved_s > r.cost_s ? " > " : " ≤ ") : " vs ";
    return h("span", { class: r.moved ? "break-even moved" : "break-even skipped" },
      "saves " + saved + worth + "costs " + cost + ": " + (r.moved ? "moved" : "skipped"));
  }

  function newPlan(r) {
    if (r.phase === "skipped") {
      if (r.predicted_throughput_sps === null) return null;
      return "a new plan predicted " + fmt.num(r.predicted_throughput_sps) + " samples/s" +
        (r.measured_throughput_sps === null ? "" : " against " + fmt.num(r.measured_throughput_sps) + " measured");
    }
    if (!r.stages && !r.planner && r.predicted_throughput_sps === null) return null;
    const parts = [];
    if (r.planner) parts.push(r.planner);
    if (r.stages) {
      parts.push(r.stages.map(function (st) {
        return R.groupText(st) + (st.layers ? " [" + st.layers.join("–") + "]" : "");
      }).join(" → "));
    }
    if (r.predicted_throughput_sps !== null) parts.push(fmt.num(r.predicted_throughput_sps) + " samples/s predicted");
    return parts.join(" · ");
  }

  function phaseBadge(r) {
    const text = { detected: "detected", started: "halting", replanned: "re-planned", weights_moved: "weights moved",
                   resumed: "resumed", failed: "failed", skipped: "skipped" }[r.phase];
    const cls = r.phase === "resumed" ? "done" : r.phase === "failed" ? "failed" : r.phase === "skipped" ? "draft" : "running";
    return h("span", { class: "badge badge-" + cls, title: r.error || "" }, text);
  }

  const MAX_CHECK_ROWS = 5;

  function renderRecoveries() {
    const list = EP.faults.recoveries(R.snap.faults);
    EP.runPage.recoveries = list;
    R.recoveryUnderWay = list.some(function (r) {
      return ["detected", "started", "replanned", "weights_moved"].indexOf(r.phase) >= 0;
    });
    $("recoveries-empty").hidden = list.length > 0;
    $("recoveries-body").hidden = list.length === 0;
    renderLostDevices(list);
    if (!list.length) return;
    const failures = list.filter(function (r) { return r.cause === "failure"; }).length;
    const moved = list.filter(function (r) { return r.cause === "dynamic" && r.moved; }).length;
    const skipped = list.length - failures - moved;
    $("recoveries-hint").textContent = EP.plural(failures, "recovery", "recoveries") + " · " +
      EP.plural(moved, "dynamic re-partition") + " · " + skipped + " skipped";
    const table = $("recoveries-table");
    for (const old of Array.from(table.tBodies)) old.remove();
    // every recovery and re-partition; of the checks that kept the plan (one every
    // repartition_every batches), the newest few (the chart shows them all)
    const checks = list.filter(function (r) { return !r.moved; });
    const shown = new Set(checks.slice(-MAX_CHECK_ROWS));
    if (checks.length > shown.size) {
      const hidden = checks.length - shown.size;
      table.append(h("tbody", { class: "more" }, h("tr", null, h("td", { colspan: 9, class: "small muted" },
        EP.plural(hidden, "earlier check") + " kept the plan (each on the chart above)"))));
    }
    list.forEach(function (r, i) {
      if (!r.moved && !shown.has(r)) return;
      const moved = r.bytes_moved === null ? null : fmt.bytes(r.bytes_moved) +
        (r.transfers === null ? "" : " in " + EP.plural(r.transfers, "transfer"));
      const plan = newPlan(r);
      const worth = breakEven(r);
      // one tbody per recovery: its phases, then what it moved to (and why, for a dynamic one)
      table.append(h("tbody", { "data-recovery": i, "data-phase": r.phase, "data-cause": r.cause },
        h("tr", null,
          h("td", { class: "nowrap" }, r.generation === null ? "–" : "gen " + r.generation, " ", phaseBadge(r),
            h("div", { class: "muted small" }, r.cause === "failure" ? "lost device" : r.moved ? "dynamic re-partition" : "dynamic check")),
          h("td", null, r.losses.length ? r.losses.map(function (x) {
            return (labels[x.device] || x.device) + (x.detected_by ? " (" + x.detected_by + ")" : "");
          }).join(", ") : "–"),
          h("td", { class: "num" }, atText(r.detected_s)),
          h("td", { class: "num" }, r.phase === "skipped" ? atText(r.replanned_s) + " (kept)" : atText(r.replanned_s, r.replanning_s)),
          h("td", { class: "num" }, atText(r.weights_moved_s, r.redistributing_s),
            moved ? h("div", { class: "muted small" }, moved) : null),
          h("td", { class: "num" }, atText(r.resumed_s, r.resuming_s)),
          h("td", { class: "num" }, fmt.seconds(r.recovery_s)),
          h("td", { class: "num" }, r.resume_microbatch === null ? "–" : "micro-batch " + r.resume_microbatch),
          h("td", { class: "num" }, r.microbatches_redone === null ? "–" : String(r.microbatches_redone))),
        plan || worth || r.error ? h("tr", { class: "sub" }, h("td", { colspan: 9, class: "small" },
          plan ? h("span", null, h("span", { class: "muted" }, r.phase === "skipped" ? "checked: " : "new plan: "), plan) : null,
          plan && worth ? h("span", { class: "muted" }, " · ") : null,
          worth ? h("span", null, h("span", { class: "muted" }, "break-even: "), worth) : null,
          r.error ? h("div", { class: "field-error" }, r.error) : null)) : null));
    });
    renderRecoveryChart(list);
  }

  /* one row per recovery or dynamic re-partition, its phases as stacked bars on the run's
     clock (an unfinished phase drawn faint up to now); the skipped checks as points on one
     row, each with its break-even */
  function renderRecoveryChart(list) {
    const rows = [];
    const plain = [];
    const moves = list.filter(function (r) { return r.moved; });
    // category labels are markup to Plotly: escaped (device names are anyone's text)
    moves.forEach(function (r) { plain.push(recoveryLabel(r, list.indexOf(r))); });
    plain.forEach(function (label) { rows.push(EP.esc(label)); });
    const now = newestTime();
    const traces = PHASES.map(function (phase) {
      const trace = { type: "bar", orientation: "h", name: phase.label, x: [], base: [], y: [], text: [],
                      marker: { color: [], line: { width: 0 } }, hovertemplate: "%{text}<extra></extra>",
                      textposition: "none" };
      moves.forEach(function (r, i) {
        const start = phaseStart(r, phase);
        if (start === null) return;
        const end = r[phase.to];
        const open = end === null && r.phase !== "failed";
        if (end === null && !open) return;
        const stop = end === null ? Math.max(now, start) : end;
        const last = PHASES.find(function (p) { return phaseStart(r, p) !== null && r[p.to] === null; });
        if (open && last !== phase) return;
        trace.x.push(Math.max(stop - start, 1e-3));
        trace.base.push(start);
        trace.y.push(rows[i]);
        trace.marker.color.push(open ? faint(phase.color) : phase.color);
        trace.text.push(rows[i] + "<br>" + phase.label + ": " + (open ? "under way, " : "") +
          fmt.seconds(stop - start) + "<br>" + start.toFixed(3) + " – " + (open ? "now" : stop.toFixed(3) + " s"));
      });
      return trace;
    });
    const checks = list.filter(function (r) { return !r.moved; });
    if (checks.length) {
      const row = "dynamic checks (kept the plan)";
      rows.push(row);
      plain.push(row);
      traces.push({
        type: "scatter", mode: "markers", name: "re-partition not worth it",
        x: checks.map(function (r) { return r.replanned_s; }), y: checks.map(function () { return row; }),
        marker: { symbol: "x", size: 10, color: "#64748b" },
        text: checks.map(function (r) {
          return "saves " + fmt.seconds(r.saved_s) + ", costs " + fmt.seconds(r.cost_s) + ": skipped" +
            (r.measured_throughput_sps === null ? "" : "<br>measured " + fmt.num(r.measured_throughput_sps) + " samples/s") +
            (r.predicted_throughput_sps === null ? "" : ", predicted " + fmt.num(r.predicted_throughput_sps));
        }),
        hovertemplate: "%{text}<extra>at %{x:.3f} s</extra>",
      });
    }
    Plotly.react($("recoveries-chart"), traces, {
      barmode: "overlay", height: 110 + 34 * rows.length, font: EP.plotFont,
      margin: { l: EP.charts.labelMargin(plain, 4), r: 16, t: 8, b: 44 },
      xaxis: { title: { text: "seconds since the run started", font: { size: 11 } }, gridcolor: "#eef2f7",
               rangemode: "tozero" },
      yaxis: { autorange: "reversed", fixedrange: true, type: "category", categoryorder: "array", categoryarray: rows,
               automargin: true },
      legend: EP.legendAbove(),
      plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: "recoveries",
    }, Object.assign({}, EP.plotConfig, { displayModeBar: false }));
  }

  /* the devices table: when each device was lost, and when its recovery resumed */
  function renderLostDevices(list) {
    const lost = {};
    for (const r of list) {
      for (const x of r.losses) {
        lost[x.device] = "lost at " + x.detected_s.toFixed(1) + " s" + (x.detected_by ? " (" + x.detected_by + ")" : "") +
          (r.resumed_s !== null ? "; resumed without it at " + r.resumed_s.toFixed(1) + " s"
            : r.phase === "failed" ? "; the run failed" : "; recovering");
      }
    }
    for (const cell of document.querySelectorAll("[data-lost-for]")) {
      const uid = cell.getAttribute("data-lost-for");
      const back = R.membership[uid] && R.membership[uid].kind === "device_joined" ? R.membership[uid].at : null;
      cell.textContent = lost[uid] ? lost[uid] + (back === null ? "" : "; rejoined at " + back.toFixed(1) + " s") : "–";
      cell.classList.toggle("kind-device_lost", Boolean(lost[uid]) && back === null);
    }
  }

  /* The devices table's Status: the device's as the run last reported it, "lost" from its
     loss until it joins again (a device that joined reads online, whatever the run said of it
     before). */
  function renderDeviceStatus() {
    const reported = {};
    for (const d of cfg.devices) reported[d.device] = d.status;
    for (const d of R.snap.run.devices || []) reported[d.uid] = d.status;
    for (const cell of document.querySelectorAll("[data-status-for]")) {
      const uid = cell.getAttribute("data-status-for");
      const last = R.membership[uid];
      let status = reported[uid];
      if (last && last.kind === "device_lost") status = "lost";
      else if (last && status === "offline") status = "online";
      const badge = EP.badge(status);
      if (last) badge.title = (last.kind === "device_lost" ? "lost at " : "joined again at ") + last.at.toFixed(1) + " s";
      cell.replaceChildren(badge);
    }
  }

  R.renderFaults = renderFaults;
  R.renderRecoveries = renderRecoveries;
  R.renderDeviceStatus = renderDeviceStatus;
})();
