/* The run page's live Gantt (EdgePipe.run, run.js): the window of the newest events with the
   chosen plan's ghosts beneath, the fault marks, zoom and follow, and the flow arrow from a
   send to its receive on hover. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const R = EP.run;
  const cfg = R.cfg;
  const labels = R.labels;
  const $ = R.$;
  const view = { span: "auto", follow: true, userRange: null };
  const ghosts = { plan: null, lo: 0, hi: -1, events: [], loading: false, error: "" };

  /* ---------------------------------------------------------------- live Gantt */

  /* In "auto", the span shows the newest MAX_BARS events at most (a nice 1, 2 or 5 x 10^k
     seconds): drawing is what holds the page's thread, and while it draws, the next deltas
     wait. The timeline is in start order, so the MAX_BARS-th newest start bounds the span. */
  const MAX_BARS = 1000;

  function niceCeil(x) {
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }

  function spanSeconds(hi) {
    if (view.span !== "auto") return Number(view.span);
    const n = R.snap.timeline.length;
    if (n <= MAX_BARS) return R.snap.window_s;
    return Math.min(R.snap.window_s, niceCeil(Math.max(0.1, hi - R.snap.timeline[n - MAX_BARS].start)));
  }

  function timelineRange() {
    let hi = 0;
    for (const e of R.snap.timeline) if (e.end > hi) hi = e.end;
    const span = spanSeconds(hi);
    const lo = Math.max(0, hi - span);
    return [lo, Math.max(hi, lo + Math.min(1, span))];
  }

  async function loadGhosts(lo, hi) {
    const plan = R.snap.run.chosen_plan;
    if (!plan || ghosts.loading) return;
    if (ghosts.plan === plan && lo >= ghosts.lo && hi <= ghosts.hi) return;
    ghosts.loading = true;
    const from = Math.max(0, lo - 5);
    const to = hi + 30;
    const answer = await EP.api("GET", cfg.urls.ghost + "?start=" + from.toFixed(3) + "&end=" + to.toFixed(3));
    ghosts.loading = false;
    if (!answer.ok) {
      ghosts.error = answer.data.detail;
      ghosts.plan = plan; ghosts.lo = from; ghosts.hi = to; ghosts.events = [];
      return;
    }
    Object.assign(ghosts, { plan: plan, lo: from, hi: to, events: answer.data.events, error: "" });
    R.dirty.add("timeline");
    R.render();
  }

  function renderGantt() {
    const chart = $("gantt");
    const empty = $("gantt-empty");
    const hasData = R.snap.timeline.length > 0;
    empty.hidden = hasData;
    chart.hidden = !hasData;
    $("gantt-tools").hidden = !hasData;
    if (!hasData) return;
    const range = view.follow ? timelineRange() : view.userRange;
    loadGhosts(range[0], range[1]);
    const gantt = R.ganttRows();
    const px = EP.charts.rowHeight(gantt.rows.length);
    const opts = { rowPx: px, labels: gantt.labels, xmin: range[0], xmax: range[1] };
    const traces = EP.charts.ganttTraces(ghosts.events, gantt.index, Object.assign({ ghost: true }, opts))
      .concat(EP.charts.ganttTraces(R.snap.timeline, gantt.index, opts));
    const layout = EP.charts.ganttLayout(gantt.rows, {
      height: px * gantt.rows.length + 90, xrange: range, uirevision: "live", width: chart.clientWidth,
    });
    const marks = R.snap.faults.filter(function (f) { return f.at >= range[0] && f.at <= range[1]; });
    const labelled = marks.filter(function (f) { return f.kind in MARK_LABELS; });
    layout.annotations = [];
    for (const f of marks) {
      const style = markStyle(f.kind);
      layout.shapes.push({ type: "line", x0: f.at, x1: f.at, yref: "paper", y0: 0, y1: 1,
                           line: { color: style.color, width: 1.5, dash: style.dash } });
    }
    if (flow && flow.send.device in gantt.index && flow.recv.device in gantt.index) {
      layout.annotations.push(EP.charts.flowArrow(flow.send, flow.recv, gantt.index));
    }
    if (labelled.length <= MAX_MARK_LABELS) {
      for (const f of labelled) {
        layout.annotations.push({
          x: f.at, xref: "x", y: 1, yref: "paper", yanchor: "top", xanchor: "left", xshift: 1,
          textangle: -90, showarrow: false, text: EP.esc(markLabel(f)),
          font: { size: 10, color: markStyle(f.kind).color }, bgcolor: "rgba(255,255,255,0.8)",
        });
      }
    }
    if (marks.length) {
      traces.push({
        type: "scatter", mode: "markers", name: "fault / control event",
        x: marks.map(function (f) { return f.at; }),
        y: marks.map(function () { return -0.55; }),
        marker: { symbol: "triangle-down", size: 12,
                  color: marks.map(function (f) { return markStyle(f.kind).color; }) },
        text: marks.map(function (f) {
          return "<b>" + EP.esc(f.kind) + "</b>" + (f.device ? " · " + EP.esc(labels[f.device] || f.device) : "") +
            "<br>at " + f.at.toFixed(3) + " s" + (f.detail && Object.keys(f.detail).length
              ? "<br>" + EP.esc(JSON.stringify(f.detail)) : "");
        }),
        hovertemplate: "%{text}<extra></extra>",
      });
    }
    $("ghost-note").textContent = ghosts.error ? "planned bars unavailable: " + ghosts.error
      : R.snap.run.chosen_plan ? "faint bars: the chosen plan, as simulated from the first measured event"
        : "";
    Plotly.react(chart, traces, layout, EP.plotConfig).then(bindGanttZoom);
  }

  /* the Gantt's fault marks: a dashed line at each loss (red), re-partition (purple) and
     resumption (green), labelled; a dotted grey one at other control events */
  const MARK_STYLES = {
    device_lost: { color: "#dc2626", dash: "dash" },
    recovery_started: { color: "#f97316", dash: "dot" },
    repartitioned: { color: "#7c3aed", dash: "dash" },
    repartition_skipped: { color: "#94a3b8", dash: "dot" },
    weights_redistributed: { color: "#0d9488", dash: "dot" },
    recovered: { color: "#16a34a", dash: "dash" },
    run_failed: { color: "#dc2626", dash: "dot" },
  };
  const MARK_LABELS = { device_lost: "lost", repartitioned: "re-planned", recovered: "resumed" };
  const MAX_MARK_LABELS = 40;
  // a label runs down from the top of the Gantt: a long device name would run off its foot
  // (the mark's hover names it whole)
  const MARK_NAME_CHARS = 20;

  function markStyle(kind) { return MARK_STYLES[kind] || { color: "#64748b", dash: "dot" }; }

  function markLabel(f) {
    const d = f.detail || {};
    if (f.kind === "device_lost") return "lost " + R.shortened(labels[f.device] || f.device || "a device", MARK_NAME_CHARS);
    const generation = d.generation === undefined ? "" : " · gen " + d.generation;
    if (f.kind === "repartitioned") return "re-planned" + (d.cause === "dynamic" ? " (dynamic)" : "") + generation;
    return MARK_LABELS[f.kind] + generation;
  }

  /* hovering a send or a receive on the live Gantt: an arrow from the send to its receive
     (found among the events the page holds), kept through redraws until the pointer leaves
     the bar. Moving from one bar to another unhovers the first, then hovers the second: both
     only set `flow`, and one relayout on the next frame draws whichever came last. */
  let flow = null;
  let flowFrame = 0;

  function showFlow(ev) {
    const point = ev.points && ev.points[0];
    const events = point && point.data.meta && point.data.meta.events;
    const e = events ? events[point.pointNumber] : null;
    const other = EP.charts.flowOf(e, R.snap.timeline);
    flow = !other ? null : e.kind === "send" ? { send: e, recv: other } : { send: other, recv: e };
    scheduleFlow();
  }

  function hideFlow() {
    flow = null;
    scheduleFlow();
  }

  function scheduleFlow() {
    if (!flowFrame) flowFrame = window.requestAnimationFrame(drawFlow);
  }

  function drawFlow() {
    flowFrame = 0;
    const gd = $("gantt");
    const annotations = gd.layout.annotations || [];
    const kept = annotations.filter(function (a) { return a.name !== "flow"; });
    const arrow = flow ? [EP.charts.flowArrow(flow.send, flow.recv, R.ganttRows().index)] : [];
    if (kept.length === annotations.length && arrow.length === 0) return;
    Plotly.relayout(gd, { annotations: kept.concat(arrow) });
  }

  let zoomBound = false;
  function bindGanttZoom() {
    if (zoomBound) return;
    zoomBound = true;
    $("gantt").on("plotly_hover", showFlow);
    $("gantt").on("plotly_unhover", hideFlow);
    $("gantt").on("plotly_relayout", function (ev) {
      if (ev["xaxis.range[0]"] !== undefined) {
        view.follow = false;
        view.userRange = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
        $("follow").hidden = false;
      } else if (ev["xaxis.autorange"]) {
        view.follow = true;
        $("follow").hidden = true;
        R.dirty.add("timeline");
        R.render();
      }
    });
  }

  $("follow").addEventListener("click", function () {
    view.follow = true;
    $("follow").hidden = true;
    R.dirty.add("timeline");
    R.render();
  });
  $("span").addEventListener("change", function (ev) {
    view.span = ev.target.value;
    view.follow = true;
    $("follow").hidden = true;
    R.dirty.add("timeline");
    R.render();
  });

  R.renderGantt = renderGantt;
})();
