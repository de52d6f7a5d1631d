/* The run page's live Gantt (EdgePipe.run, run.js): every event the page got, with the chosen
   plan's ghosts beneath, the fault marks, zoom and follow, and the flow arrow from a send to its
   receive on hover.

   Drawing: Plotly draws the axes, rows, stage bands, fault marks, legend and takes the zoom
   and pan (the "skeleton", redrawn when those change: a Plotly.react of no bars); the bars are
   drawn on a canvas under Plotly's labels (gantt_canvas.js) from the page's event store
   (EdgePipe.TimelineStore, run.js: every event since the page opened, added as the deltas
   come). A delta asks for a frame (requestAnimationFrame): at most one a display frame, it
   draws the bars in view, whose number the view bounds, not the run's length (about 1 ms).
   Following the live tail, the axis moves in steps: it reaches HEADROOM past the newest
   event, and moves only once an event ends beyond it, by a Plotly.relayout of its range
   (measured on the run page: 3.6 ms, where a Plotly.react of the skeleton took 11 ms).

   Three ways to look: "follow" (the live tail), the whole run (the overview: GET
   /api/runs/<id>/timeline/, downsampled by the server to about a bar per pixel per device and
   lane, the live tail after it from the store), and a window the user zoomed or panned to. A
   window the store holds whole (it starts after the store's completeFrom()) is drawn from the
   store; any other is fetched from the same API (its events when few enough, else bars at the
   window's resolution) and drawn once it comes, the overview (or the coarser bars it had)
   meanwhile; gantt_sources.js keeps what was fetched and chooses. Double-click (zoom out)
   returns to the overview, *Follow live* to the tail. A hole the store noted (a fresh snapshot
   after missed deltas) is fetched from the API too. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const R = EP.run;
  const cfg = R.cfg;
  const labels = R.labels;
  const $ = R.$;
  const charts = EP.charts;
  const kinds = EP.timelineKinds;
  const store = R.store;
  const layer = new EP.GanttCanvas($("gantt"));
  const view = { span: "auto", follow: true, overview: false, userRange: null };
  // what the Gantt shows now (EdgePipe.runPage.gantt(): the browser tests read it)
  let shown = { mode: "follow", range: null, source: "live", exact: true };
  /* what the skeleton was drawn for: its x range, its rows and legend */
  let skeleton = null;
  let frameAsked = false;

  /* ---------------------------------------------------------------- the view's range */

  /* In "auto", the span shows the newest MAX_BARS events at most (a nice 1, 2 or 5 x 10^k
     seconds): a bar is still a few pixels wide. The snapshot's window is in start order, so
     its MAX_BARS-th newest start bounds the span. */
  const MAX_BARS = 1000;
  // following, the axis runs this far (a fraction of the span shown) past the newest event
  const HEADROOM = 0.2;

  function niceCeil(x) {
    const p = Math.pow(10, Math.floor(Math.log10(x)));
    for (const m of [1, 2, 5, 10]) if (m * p >= x) return m * p;
    return 10 * p;
  }

  function spanSeconds(hi) {
    if (view.span !== "auto") return Number(view.span);
    const held = R.snap.timeline;
    const n = held.length;
    if (n <= MAX_BARS) return R.snap.window_s;
    return Math.min(R.snap.window_s, niceCeil(Math.max(0.1, hi - held[n - MAX_BARS].start)));
  }

  function newestEnd() { return store.count ? store.newestEnd : 0; }

  /* the live tail: from span before the newest event to HEADROOM of what is shown past it */
  function followRange() {
    const hi = newestEnd();
    const span = spanSeconds(hi);
    const lo = Math.max(0, hi - span);
    return [lo, Math.max(hi + HEADROOM * (hi - lo), lo + Math.min(1, span))];
  }

  function overviewRange() {
    const hi = Math.max(newestEnd(), fetched.overview ? fetched.overview.end_s : 0);
    return [0, Math.max(hi * (1 + HEADROOM / 4), 1)];
  }

  /* the range to draw: the skeleton's while the newest event is within it */
  function currentRange() {
    if (!view.follow && !view.overview) return view.userRange;
    const hi = newestEnd();
    if (skeleton && skeleton.looks === looks && hi <= skeleton.range[1] &&
        (view.overview || hi >= skeleton.range[0])) return skeleton.range;
    return view.follow ? followRange() : overviewRange();
  }

  /* ---------------------------------------------------------------- where bars come from */

  const GHOST_SPAN_S = EP.GanttSources.GHOST_SPAN_S;
  const sources = new EP.GanttSources({
    store: store, urls: cfg.urls,
    plotWidth: function () { return $("gantt").clientWidth || 800; },
    changed: function () { renderGantt(); },
    holeFilled: function () { askFrame(); },
  });
  const ghosts = sources.ghosts;
  const fetched = sources.fetched;

  function loadGhosts(lo, hi) { sources.loadGhosts(R.snap.run.chosen_plan, lo, hi); }
  function sourceFor(range) { return sources.sourceFor(range, view); }

  /* ---------------------------------------------------------------- drawing */

  /* the legend's entries: a trace of no points per kind drawn (Plotly's legend shows and
     hides them; the canvas reads which are hidden) */
  function legendTraces(eventKinds, ghostKinds, rowPx) {
    const order = Object.keys(charts.KINDS);
    const traces = [];
    const entry = function (kind, ghost) {
      const spec = charts.KINDS[kind] || charts.KINDS.load;
      const lane = ghost ? "ghost" : spec.lane;
      traces.push({
        type: "scatter", mode: "lines", x: [null], y: [null], hoverinfo: "skip",
        uid: (ghost ? "planned-" : "kind-") + kind,
        name: ghost ? "planned " + kind : (charts.KINDS[kind] ? spec.label : kind),
        legendgroup: ghost ? "planned" : kind,
        legendrank: (ghost ? 100 : 1) + (order.indexOf(kind) < 0 ? order.length : order.indexOf(kind)),
        opacity: ghost ? 0.38 : 1, showlegend: true,
        line: { color: spec.color, width: Math.max(2, rowPx * charts.LANES[lane].width) },
        meta: { gantt: ghost ? "ghost" : "events", kind: kind },
      });
    };
    for (const kind of Array.from(eventKinds).sort()) entry(kind, false);
    for (const kind of Array.from(ghostKinds).sort()) entry(kind, true);
    return traces;
  }

  /* the kinds the legend hides (kind codes), of the events' and of the ghosts' */
  function hiddenKinds() {
    const hidden = { events: null, ghost: null };
    for (const t of $("gantt").data || []) {
      if (!t.meta || !t.meta.gantt || t.visible !== "legendonly") continue;
      const which = t.meta.gantt;
      if (!hidden[which]) hidden[which] = new Uint8Array(256);
      hidden[which][kinds.code(t.meta.kind)] = 1;
    }
    return hidden;
  }

  /* The skeleton (Plotly: axes, rows, bands, marks, legend), then the bars. */
  function renderGantt() {
    const chart = $("gantt");
    const empty = $("gantt-empty");
    const hasData = store.count > 0 || R.snap.timeline.length > 0;
    empty.hidden = hasData;
    chart.hidden = !hasData;
    $("gantt-tools").hidden = !hasData;
    if (!hasData) return;
    if (store.holes.length) sources.fillHoles();
    const range = currentRange();
    loadGhosts(range[0], range[1]);
    const gantt = R.ganttRows();
    const px = charts.rowHeight(gantt.rows.length);
    const drawn = sourceFor(range);
    const eventKinds = new Set(store.kinds);
    if (drawn.store !== store) for (const k of drawn.store.kinds) eventKinds.add(k);
    const ghostKinds = ghosts.store && range[1] - range[0] <= GHOST_SPAN_S ? ghosts.store.kinds : new Set();
    const traces = legendTraces(eventKinds, ghostKinds, px);
    const layout = charts.ganttLayout(gantt.rows, {
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
      layout.annotations.push(charts.flowArrow(flow.send, flow.recv, gantt.index));
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
      : !drawn.exact ? "merged bars: zoom in for the events"
        : ghosts.error ? "planned bars unavailable: " + ghosts.error
          : R.snap.run.chosen_plan && range[1] - range[0] <= GHOST_SPAN_S
            ? "faint bars: the chosen plan, as simulated from the first measured event" : "";
    skeleton = { range: range, looks: looks, rows: gantt, rowPx: px, devices: store.laneMap.size,
                 kinds: store.kinds.size, ghosts: ghosts.store, marksKey: marksKey(range),
                 marks: marks.map(function (f) { return { at: f.at, color: markStyle(f.kind).color, dash: markStyle(f.kind).dash }; }) };
    // a double-click zooms out to the whole run (autosize: Plotly's default would go back to
    // the range of the last redraw, the zoomed one)
    Plotly.react(chart, traces, layout, Object.assign({}, EP.plotConfig, { doubleClick: "autosize" }))
      .then(bindGanttZoom);
    drawBars();
  }

  /* the bars of the current view on the canvas (and what is shown, for the tests) */
  function drawBars(xrange) {
    if (!skeleton) return;
    const range = xrange || skeleton.range;
    const drawn = sourceFor(range);
    const hidden = hiddenKinds();
    const wide = range[1] - range[0] > GHOST_SPAN_S;
    layer.draw({
      rows: skeleton.rows.index, rowPx: skeleton.rowPx, marks: skeleton.marks,
      layers: [
        { name: "ghost", store: wide ? null : ghosts.store, alpha: 0.38, hidden: hidden.ghost },
        // the store's events before the fetched span's end are the fetched span's to draw
        { name: drawn.exact ? "events" : "bars", store: drawn.store, hidden: hidden.events },
        { name: "events", store: drawn.store === store ? null : store, after: drawn.after, hidden: hidden.events },
      ],
    }, xrange);
    shown = { mode: view.follow ? "follow" : view.overview ? "overview" : "range", range: range,
              source: drawn.source, exact: drawn.exact, pending: Boolean(fetched.pending),
              held: store.count, heldFrom: store.heldFrom, completeFrom: store.completeFrom(),
              holes: store.holes.length };
  }

  /* what a frame must redraw beyond the bars: "full" (the skeleton: devices or kinds not in
     its rows or legend yet, other ghosts, a new way to look), "range" (the newest event
     ended past the axis: the axis moves, a Plotly.relayout, unless other fault marks come in
     view), or "" */
  function due() {
    if (!skeleton || skeleton.looks !== looks) return "full";
    if (store.laneMap.size !== skeleton.devices) {
      // a device of no row yet (the rows are the run's devices, then any other seen)
      for (const uid of store.laneMap.keys()) if (!(uid in skeleton.rows.index)) return "full";
      skeleton.devices = store.laneMap.size;
    }
    if (store.kinds.size > skeleton.kinds || ghosts.store !== skeleton.ghosts) return "full";
    const range = currentRange();
    if (range === skeleton.range || (range[0] === skeleton.range[0] && range[1] === skeleton.range[1])) return "";
    return marksKey(range) === skeleton.marksKey ? "range" : "full";
  }

  /* the fault marks within a range, as a key */
  function marksKey(range) {
    return R.snap.faults.filter(function (f) { return f.at >= range[0] && f.at <= range[1]; })
      .map(function (f) { return f.kind + "@" + f.at; }).join(",");
  }

  /* the axis moved on (following, or the whole run grown): a relayout of its range, about a
     third of a skeleton redraw's time; its plotly_relayout event is the page's own, not a
     user's zoom */
  let ownRelayouts = 0;
  function moveAxis() {
    const range = currentRange();
    loadGhosts(range[0], range[1]);
    skeleton.range = range;
    ownRelayouts += 1;
    Plotly.relayout($("gantt"), { "xaxis.range": range.slice() })
      .finally(function () { ownRelayouts -= 1; });
    drawBars();
  }

  /* one frame: the bars, after the axis or the whole skeleton when due; timed for
     bench/live.py */
  function frame() {
    frameAsked = false;
    if (!R.snap) return;
    const t0 = performance.now();
    const what = $("gantt").hidden ? "full" : due();
    if (what === "full") renderGantt();
    else if (what === "range") moveAxis();
    else drawBars();
    EP.runPage.frames += 1;
    if (EP.runPage.onFrame) {
      EP.runPage.onFrame({ ms: performance.now() - t0, received: EP.runPage.timelineDeltas, redrew: what });
    }
  }

  /* new events: drawn on the next frame */
  function askFrame() {
    if (frameAsked) return;
    frameAsked = true;
    window.requestAnimationFrame(frame);
  }

  /* the fault marks: a dashed line at each loss (red), re-partition (purple) and
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

  /* ---------------------------------------------------------------- hover and flows */

  /* The pointer over a bar: its text in a tip; over a send or a receive, an arrow from the send
     to its receive (found among the events drawn, then the store's), kept through redraws
     until the pointer leaves the bar. Looked at once a frame. */
  let flow = null;
  let pointer = null; // [clientX, clientY, buttons]
  let hoverAsked = false;
  let tip = null;

  function tipElement() {
    const gd = $("gantt");
    if (tip && tip.parentNode === gd) return tip;
    gd.style.position = "relative";
    tip = document.createElement("div");
    tip.className = "gantt-tip";
    tip.hidden = true;
    gd.appendChild(tip);
    return tip;
  }

  function askHover() {
    if (hoverAsked) return;
    hoverAsked = true;
    window.requestAnimationFrame(hover);
  }

  function hover() {
    hoverAsked = false;
    const box = tipElement();
    const hit = pointer && !pointer[2] ? layer.pick(pointer[0], pointer[1]) : null;
    if (!hit) {
      box.hidden = true;
      setFlow(null);
      return;
    }
    const item = hit.item;
    const label = labels[item.device] || item.device;
    box.innerHTML = hit.layer === "bars" ? charts.barText(item, label)
      : charts.hoverText(item, label, hit.layer === "ghost");
    box.style.borderColor = (charts.KINDS[item.kind] || charts.KINDS.load).color;
    box.hidden = false;
    const gd = $("gantt").getBoundingClientRect();
    const x = pointer[0] - gd.left;
    const left = x + 14 + box.offsetWidth > gd.width ? x - 14 - box.offsetWidth : x + 14;
    box.style.left = Math.max(0, left) + "px";
    box.style.top = Math.max(0, pointer[1] - gd.top - box.offsetHeight - 8) + "px";
    if (hit.layer !== "events" || (item.kind !== "send" && item.kind !== "recv")) {
      setFlow(null);
      return;
    }
    const source = shownStore();
    const other = source.flowOf(item) || (source !== store ? store.flowOf(item) : null);
    setFlow(!other ? null : item.kind === "send" ? { send: item, recv: other } : { send: other, recv: item });
  }

  function shownStore() { return skeleton ? sourceFor(skeleton.range).store : store; }

  function sameFlow(a, b) {
    return a === b || (a && b && a.send.device === b.send.device && a.send.start === b.send.start &&
                       a.recv.device === b.recv.device && a.recv.start === b.recv.start);
  }

  function setFlow(next) {
    if (sameFlow(flow, next)) return;
    flow = next;
    const gd = $("gantt");
    const annotations = (gd.layout && gd.layout.annotations) || [];
    const kept = annotations.filter(function (a) { return a.name !== "flow"; });
    const arrow = flow ? [charts.flowArrow(flow.send, flow.recv, R.ganttRows().index)] : [];
    if (kept.length === annotations.length && arrow.length === 0) return;
    Plotly.relayout(gd, { annotations: kept.concat(arrow) });
  }

  (function () {
    const gd = $("gantt");
    gd.addEventListener("mousemove", function (ev) {
      pointer = [ev.clientX, ev.clientY, ev.buttons];
      askHover();
    });
    gd.addEventListener("mouseleave", function () {
      pointer = null;
      askHover();
    });
  })();

  let zoomBound = false;
  function bindGanttZoom() {
    if (zoomBound) return;
    zoomBound = true;
    const gd = $("gantt");
    // Plotly drew (a resize, a legend click, the flow's arrow): the bars again, to its axes
    gd.on("plotly_afterplot", function () { drawBars(); });
    gd.on("plotly_restyle", function () { drawBars(); });
    // while a pan or zoom is dragged, the bars follow it
    gd.on("plotly_relayouting", function (ev) {
      if (ev["xaxis.range[0]"] !== undefined) drawBars([Number(ev["xaxis.range[0]"]), Number(ev["xaxis.range[1]"])]);
      else if (ev["xaxis.range"]) drawBars([Number(ev["xaxis.range"][0]), Number(ev["xaxis.range"][1])]);
    });
    gd.on("plotly_relayout", function (ev) {
      if (ownRelayouts) return;
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
    renderGantt();
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
  /* the bars the Gantt draws now, of one layer (events, bars, ghost) or all: [{layer, row, y,
     x, yPx, ...the event or bar}] (x, yPx: the middle of its part in view, client pixels) */
  EP.runPage.ganttItems = function (which) {
    return layer.items(which).map(function (b) {
      return Object.assign({ layer: b.layer, row: b.row, y: b.y, x: b.x, yPx: b.yPx }, b.item);
    });
  };
  EP.runPage.ganttStore = function () { return store; };
  /* what the pointer at (clientX, clientY) is over, as the hover sees it: {layer, ...the event
     or bar} or null (for the tests' diagnostics) */
  EP.runPage.ganttPick = function (x, y) {
    const hit = layer.pick(x, y);
    return hit ? Object.assign({ layer: hit.layer }, hit.item) : null;
  };

  R.renderGantt = renderGantt;
  R.ganttFrame = askFrame;
})();
