/* Charts shared by the run page's planned and live Gantts and its learned planners' training
   curves (Plotly, served from this server).
   A Gantt draws each event as a thick line segment (one SVG path per kind, so thousands of
   events stay smooth), one row per device in pipeline order: the compute lane (forward,
   backward, update, aggregate), under it the planned ghosts, under those the transfers
   (send, recv, replicate, load). Hovering a bar tells its kind, micro-batch, stage and times. */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});

  const KINDS = {
    forward: { color: "#3b82f6", lane: "compute", label: "forward" },
    backward: { color: "#f59e0b", lane: "compute", label: "backward" },
    update: { color: "#dc2626", lane: "compute", label: "update" },
    aggregate: { color: "#db2777", lane: "compute", label: "aggregate (all-reduce)" },
    send: { color: "#10b981", lane: "comm", label: "send" },
    recv: { color: "#8b5cf6", lane: "comm", label: "recv" },
    replicate: { color: "#0d9488", lane: "comm", label: "replicate" },
    load: { color: "#94a3b8", lane: "comm", label: "load" },
  };
  // lane offsets within a device's row (rows are 1 apart; the y axis is reversed)
  const LANES = { compute: -0.18, ghost: 0.1, comm: 0.3 };
  const IDLE = [
    { key: "busy_s", label: "busy", color: "#3b82f6" },
    { key: "upstream_s", label: "waiting upstream", color: "#f97316" },
    { key: "downstream_s", label: "waiting downstream", color: "#a855f7" },
    { key: "sync_s", label: "sync (replicas)", color: "#db2777" },
    { key: "bubble_s", label: "bubble (fill/drain)", color: "#cbd5e1" },
  ];

  function hoverText(e, label, planned) {
    return (planned ? "planned " : "") + "<b>" + e.kind + "</b> · micro-batch " + e.microbatch +
      " · v" + e.version + "<br>" + EP.esc(label) + " · stage " + e.stage + "<br>" +
      e.start.toFixed(3) + " – " + e.end.toFixed(3) + " s (" + EP.fmt.seconds(e.end - e.start) + ")" +
      (e.bytes ? "<br>" + EP.fmt.bytes(e.bytes) : "");
  }

  /* traces of `events` on rows {uid: index}; opts: {ghost, rowPx, labels, xmin, xmax} */
  function ganttTraces(events, rows, opts) {
    const groups = {};
    for (const e of events) {
      if (opts.xmin !== undefined && (e.end < opts.xmin || e.start > opts.xmax)) continue;
      const row = rows[e.device];
      if (row === undefined) continue;
      const spec = KINDS[e.kind] || KINDS.load;
      if (opts.ghost && spec.lane !== "compute") continue;
      const lane = opts.ghost ? "ghost" : spec.lane;
      const g = groups[e.kind] || (groups[e.kind] = { x: [], y: [], text: [], lane: lane });
      const y = row + LANES[lane];
      const t = hoverText(e, opts.labels[e.device] || e.device, opts.ghost);
      g.x.push(e.start, (e.start + e.end) / 2, e.end, null);
      g.y.push(y, y, y, null);
      g.text.push(t, t, t, null);
    }
    const traces = [];
    for (const kind of Object.keys(KINDS)) {
      const g = groups[kind];
      if (!g) continue;
      const width = g.lane === "compute" ? opts.rowPx * 0.34 : opts.rowPx * 0.14;
      traces.push({
        type: "scatter", mode: "lines", x: g.x, y: g.y, text: g.text,
        hovertemplate: "%{text}<extra></extra>",
        line: { color: KINDS[kind].color, width: Math.max(2, width) },
        opacity: opts.ghost ? 0.38 : 1,
        name: opts.ghost ? "planned " + kind : KINDS[kind].label,
        legendgroup: opts.ghost ? "planned" : kind,
        legendrank: (opts.ghost ? 100 : 1) + Object.keys(KINDS).indexOf(kind),
        showlegend: true, connectgaps: false,
      });
    }
    return traces;
  }

  function ganttLayout(rowList, opts) {
    return {
      height: opts.height,
      margin: { l: 110, r: 16, t: opts.legend === false ? 8 : 30, b: 40 },
      font: EP.plotFont,
      hovermode: "closest",
      hoverdistance: 12,
      showlegend: opts.legend !== false,
      legend: { orientation: "h", x: 1, xanchor: "right", y: 1, yanchor: "bottom", font: { size: 11 } },
      xaxis: { title: { text: "seconds since the run started", font: { size: 11 } }, zeroline: false,
               gridcolor: "#eef2f7", range: opts.xrange, autorange: opts.xrange ? false : true },
      yaxis: {
        range: [rowList.length - 0.45, -0.7], tickmode: "array",
        tickvals: rowList.map(function (_, i) { return i; }),
        ticktext: rowList.map(function (r) { return r.label; }),
        zeroline: false, showgrid: false, fixedrange: true,
      },
      shapes: rowList.map(function (_, i) {
        return { type: "line", xref: "paper", x0: 0, x1: 1, y0: i + 0.5, y1: i + 0.5,
                 line: { color: "#e2e8f0", width: 1 } };
      }),
      plot_bgcolor: "#fff", paper_bgcolor: "#fff",
      uirevision: opts.uirevision,
    };
  }

  function rowHeight(count) { return count <= 2 ? 64 : count <= 6 ? 54 : 40; }

  /* A learned planner's training curve (plan.training: episodes, best_reward, mean_reward; a
     reward is -sqrt(step time in s), null until a candidate fits) drawn as step times, which
     read like the plans table's periods: the best candidate so far, and the episode's sampled
     candidates (their mean reward as a step time, infeasible ones penalised). */
  const TRAINING = [
    { key: "best_reward", label: "best so far", color: "#16a34a", width: 2.5, dash: "solid" },
    { key: "mean_reward", label: "episode's samples (mean reward)", color: "#94a3b8", width: 1.5,
      dash: "dot" },
  ];

  function trainingTraces(training) {
    return TRAINING.map(function (series) {
      const rewards = training[series.key];
      return {
        type: "scatter", mode: "lines", name: series.label, x: training.episodes,
        y: rewards.map(function (r) { return r === null ? null : r * r; }),
        customdata: rewards,
        line: { color: series.color, width: series.width, dash: series.dash },
        connectgaps: false,
        hovertemplate: "episode %{x}: %{y:.4g} s (reward %{customdata:.4g})<extra>" +
          EP.esc(series.label) + "</extra>",
      };
    });
  }

  /* the log axis's range around every step time, padded so that the best (often flat at the
     bottom) is not drawn on the axis line */
  function logRange(traces) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const trace of traces) {
      for (const y of trace.y) {
        if (y === null || !(y > 0)) continue;
        lo = Math.min(lo, Math.log10(y));
        hi = Math.max(hi, Math.log10(y));
      }
    }
    if (lo === Infinity) return undefined;
    const pad = Math.max(0.05, 0.08 * (hi - lo));
    return [lo - pad, hi + pad];
  }

  /* opts: {traces (to fit the y axis), uirevision, height} */
  function trainingLayout(opts) {
    const range = opts.traces ? logRange(opts.traces) : undefined;
    return {
      height: opts.height || 240, font: EP.plotFont, margin: { l: 60, r: 16, t: 8, b: 70 },
      xaxis: { title: { text: "episode", font: { size: 11 } }, gridcolor: "#eef2f7", rangemode: "tozero" },
      yaxis: { title: { text: "step time (s) = reward²", font: { size: 11 } }, type: "log",
               gridcolor: "#eef2f7", range: range, autorange: range ? false : true },
      legend: { orientation: "h", y: -0.35, font: { size: 11 } },
      plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: opts.uirevision,
    };
  }

  EP.charts = {
    KINDS: KINDS, IDLE: IDLE, ganttTraces: ganttTraces, ganttLayout: ganttLayout, rowHeight: rowHeight,
    trainingTraces: trainingTraces, trainingLayout: trainingLayout,
  };
})();
