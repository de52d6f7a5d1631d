/* The run page's live Gantt (EdgePipe.run, run.js): the window of the newest events with the
   chosen plan's ghosts beneath, the fault marks, zoom and follow, and the flow arrow from a
   send to its receive on hover.

   Three ways to look: "follow" (the live tail, from the snapshot's window), the whole run
   (the overview: GET /api/runs/<id>/timeline/, downsampled by the server to about a bar per
   pixel per device and lane, the live tail after it from the window), and a window the user
   zoomed or panned to. A window the page holds (it starts after the oldest event the
   snapshot's window keeps) is drawn from the window; any other is fetched from the same API
   (its events when few enough, else bars at the window's resolution) and drawn once it comes,
   the overview (or the coarser bars it had) meanwhile. Double-click (zoom out) returns to the
   overview, *Follow live* to the tail. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const R = EP.run;
  const cfg = R.cfg;
  const labels = R.labels;
  const $ = R.$;
  const view = { span: "auto", follow: true, overview: false, userRange: null };
  const ghosts = { plan: null, lo: 0, hi: -1, events: [], loading: false, error: "" };
  /* spans fetched from the timeline API: the whole run's overview and one zoomed window's
     detail, each an answer of the API (start_s, end_s, exact, events, bars, bin_s) */
  const fetched = { overview: null, detail: null, pending: "", failed: "", error: "" };
  // what the Gantt shows now (EdgePipe.runPage.gantt(): the browser tests read it)
  let shown = { mode: "follow", range: null, source: "live", exact: true, events: [] };

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
    // a wide view (the overview of a long run) draws no ghosts: too many, and too thin to see
    if (!plan || ghosts.loading || hi - lo > GHOST_SPAN_S) return;
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

  /* ---------------------------------------------------------------- the whole run */

  const GHOST_SPAN_S = 300; // the ghosts API answers at most 600 s; the page asks for 35 s more
  const OVERVIEW_REFRESH_MS = 5000; // a live run's overview, fetched again at most this often
  const MIN_BARS = 100;
  const MAX_FETCH_BARS = 2000; // the API's limit

  /* the Gantt's plot width in pixels: the bars a fetch asks for (about one per pixel) */
  function plotBars() {
    const width = $("gantt").clientWidth || 800;
    return Math.max(MIN_BARS, Math.min(MAX_FETCH_BARS, Math.round(width)));
  }

  function newestEnd() {
    let hi = 0;
    for (const e of R.snap.timeline) if (e.end > hi) hi = e.end;
    return hi;
  }

  /* where the window the page holds starts: every event that ends after it is held (the
     window keeps the newest events by their end) */
  function heldFrom() {
    let lo = Infinity;
    for (const e of R.snap.timeline) if (e.end < lo) lo = e.end;
    return lo;
  }

  function overviewRange() {
    const hi = Math.max(newestEnd(), fetched.overview ? fetched.overview.end_s : 0);
    return [0, Math.max(hi, 1)];
  }

  /* whether an answer of the API draws [lo, hi] finely enough: its events, or bars no wider
     than two pixels of the view */
  function fine(answer, lo, hi) {
    return answer.exact || answer.bin_s <= (2 * (hi - lo)) / plotBars();
  }

  function covers(answer, lo, hi) { return answer && answer.start_s <= lo && hi <= answer.end_s; }

  async function fetchSpan(which, lo, hi) {
    const bars = plotBars();
    const query = which === "overview" ? "?max_bars=" + bars
      : "?start=" + lo.toFixed(4) + "&end=" + hi.toFixed(4) + "&max_bars=" + bars;
    if (fetched.pending || fetched.failed === query) return;
    fetched.pending = query;
    const answer = await EP.api("GET", cfg.urls.timeline + query);
    fetched.pending = "";
    if (!answer.ok) {
      fetched.failed = query;
      fetched.error = (answer.data && answer.data.detail) || "the server answered " + answer.status;
    } else {
      fetched.failed = "";
      fetched.error = "";
      fetched[which] = Object.assign({ fetched_at: Date.now() }, answer.data);
    }
    R.dirty.add("timeline");
    R.render();
  }

  /* What to draw of [lo, hi] and where it comes from: the window the page holds when it
     covers the view; else a fetched span (the zoomed window's detail, else the overview),
     followed by the events the page holds past its end; fetching what is missing. */
  function sourceFor(range) {
    const held = R.snap.timeline;
    const lo = range[0];
    const hi = range[1];
    if (view.follow || (!view.overview && lo >= heldFrom())) {
      return { source: "live", exact: true, events: held, bars: [] };
    }
    const overview = fetched.overview;
    let best = null;
    if (view.overview) {
      const stale = !overview || (newestEnd() > overview.end_s + 0.02 * overview.end_s &&
                                  Date.now() - overview.fetched_at > OVERVIEW_REFRESH_MS);
      if (stale) fetchSpan("overview", 0, hi);
      if (overview) best = { answer: overview, source: "overview" };
    } else {
      const detail = fetched.detail;
      if (detail && covers(detail, lo, Math.min(hi, detail.end_s)) && fine(detail, lo, hi)) {
        best = { answer: detail, source: "detail" };
      } else if (overview && fine(overview, lo, hi)) {
        best = { answer: overview, source: "overview" };
      } else {
        const span = hi - lo;
        fetchSpan("detail", Math.max(0, lo - span / 2), hi + span / 2);
        // meanwhile: the coarser detail or the overview, whichever covers the view
        if (detail && covers(detail, lo, Math.min(hi, detail.end_s))) best = { answer: detail, source: "detail" };
        else if (overview) best = { answer: overview, source: "overview" };
        else fetchSpan("overview", 0, hi);
      }
    }
    if (!best) return { source: "live", exact: true, events: held, bars: [] };
    const end = best.answer.end_s;
    const tail = held.filter(function (e) { return e.start > end; });
    return { source: best.source, exact: best.answer.exact, events: best.answer.events.concat(tail),
             bars: best.answer.bars };
  }

  function renderGantt() {
    const chart = $("gantt");
    const empty = $("gantt-empty");
    const hasData = R.snap.timeline.length > 0;
    empty.hidden = hasData;
    chart.hidden = !hasData;
    $("gantt-tools").hidden = !hasData;
    if (!hasData) return;
    const range = view.follow ? timelineRange() : view.overview ? overviewRange() : view.userRange;
    loadGhosts(range[0], range[1]);
    const gantt = R.ganttRows();
    const px = EP.charts.rowHeight(gantt.rows.length);
    const opts = { rowPx: px, labels: gantt.labels, xmin: range[0], xmax: range[1] };
    const drawn = sourceFor(range);
    shown = { mode: view.follow ? "follow" : view.overview ? "overview" : "range", range: range,
              source: drawn.source, exact: drawn.bars.length === 0, events: drawn.events,
              bars: drawn.bars, pending: Boolean(fetched.pending) };
    const traces = EP.charts.ganttTraces(ghosts.events, gantt.index, Object.assign({ ghost: true }, opts))
      .concat(EP.charts.overviewTraces(drawn.bars, gantt.index, opts))
      .concat(EP.charts.ganttTraces(drawn.events, gantt.index, opts));
    const layout = EP.charts.ganttLayout(gantt.rows, {
      height: px * gantt.rows.length + 90, xrange: range, uirevision: "live-" + looks, width: chart.clientWidth,
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
    $("ghost-note").textContent = fetched.error ? "the run's timeline is unavailable: " + fetched.error
      : drawn.bars.length ? "merged bars: zoom in for the events"
        : ghosts.error ? "planned bars unavailable: " + ghosts.error
          : R.snap.run.chosen_plan && range[1] - range[0] <= GHOST_SPAN_S
            ? "faint bars: the chosen plan, as simulated from the first measured event" : "";
    // a double-click zooms out to the whole run (autosize: Plotly's default would go back to
    // the range of the last redraw, the zoomed one)
    Plotly.react(chart, traces, layout, Object.assign({}, EP.plotConfig, { doubleClick: "autosize" }))
      .then(bindGanttZoom);
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
    const other = EP.charts.flowOf(e, shown.events);
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
      const range = ev["xaxis.range"] || (ev["xaxis.range[0]"] !== undefined
        ? [ev["xaxis.range[0]"], ev["xaxis.range[1]"]] : null);
      // zoomed out (a double-click, Autoscale): the whole run; the event may carry the range
      // Plotly fitted to what it drew, which is not the run
      if (ev["xaxis.autorange"]) look({ follow: false, overview: true });
      // a zoom or a pan: that window, fetched if the page does not hold it
      else if (range) look({ follow: false, overview: false, userRange: [Number(range[0]), Number(range[1])] });
    });
  }

  /* a new way to look (follow, the whole run, a window): a new uirevision, so that Plotly
     drops what the user's gesture left (a double-click's autorange would otherwise outlive
     the redraw and fit the axis to what was drawn) */
  let looks = 0;
  function look(how) {
    looks += 1;
    Object.assign(view, how);
    $("follow").hidden = view.follow;
    if (view.overview) $("span").value = "all";
    else if (view.follow) $("span").value = view.span;
    R.dirty.add("timeline");
    R.render();
  }

  $("follow").addEventListener("click", function () { look({ follow: true, overview: false }); });
  $("span").addEventListener("change", function (ev) {
    if (ev.target.value === "all") {
      look({ follow: false, overview: true });
      return;
    }
    view.span = ev.target.value;
    look({ follow: true, overview: false });
  });

  EP.runPage.gantt = function () { return shown; };

  R.renderGantt = renderGantt;
})();
