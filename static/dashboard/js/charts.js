/* Charts shared by the run page's planned and live Gantts and its learned planners' training
   curves (Plotly, served from this server).
   A Gantt draws each event as a thick line segment (one SVG path per kind, so thousands of
   events stay smooth), one row per device in pipeline order, the replicas of a stage (its
   group) on adjacent rows, each labelled with its stage, on a shared band with a bracket in
   the margin. In a row: the compute lane (forward, backward, update), under it the planned
   ghosts, under those the aggregation lane (all-reduce among a stage's replicas, weight
   averaging: it runs beside the compute under 1F1B, so it has a lane of its own), then the
   transfers (send, recv, replicate, load). Hovering a bar tells its kind, micro-batch, stage
   and times; hovering a send or a receive draws an arrow from the send to its receive. */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});

  const KINDS = {
    forward: { color: "#3b82f6", lane: "compute", label: "forward" },
    backward: { color: "#f59e0b", lane: "compute", label: "backward" },
    update: { color: "#dc2626", lane: "compute", label: "update" },
    aggregate: { color: "#c026d3", lane: "sync", label: "aggregate (all-reduce, averaging)" },
    send: { color: "#10b981", lane: "comm", label: "send" },
    recv: { color: "#8b5cf6", lane: "comm", label: "recv" },
    replicate: { color: "#0d9488", lane: "comm", label: "replicate" },
    load: { color: "#94a3b8", lane: "comm", label: "load" },
  };
  // lanes within a device's row (rows are 1 apart; the y axis is reversed): offset from the
  // row's centre and thickness, as fractions of the row
  const LANES = {
    compute: { y: -0.2, width: 0.3 },
    ghost: { y: 0.03, width: 0.14 },
    sync: { y: 0.18, width: 0.1 },
    comm: { y: 0.33, width: 0.11 },
  };
  const GROUP_COLOR = "#64748b"; // the bracket of a stage's replicas
  const IDLE = [
    { key: "busy_s", label: "busy", color: "#3b82f6" },
    { key: "upstream_s", label: "waiting upstream", color: "#f97316" },
    { key: "downstream_s", label: "waiting downstream", color: "#a855f7" },
    { key: "sync_s", label: "sync (replicas)", color: KINDS.aggregate.color },
    { key: "bubble_s", label: "bubble (fill/drain)", color: "#cbd5e1" },
  ];

  function hoverText(e, label, planned) {
    return (planned ? "planned " : "") + "<b>" + EP.esc(e.kind) + "</b> · micro-batch " + e.microbatch +
      " · v" + e.version + "<br>" + EP.esc(label) + " · stage " + e.stage + "<br>" +
      e.start.toFixed(3) + " – " + e.end.toFixed(3) + " s (" + EP.fmt.seconds(e.end - e.start) + ")" +
      (e.bytes ? "<br>" + EP.fmt.bytes(e.bytes) : "");
  }

  /* a bar (start, end) on row position y in the group of its kind: Plotly's points of a line
     segment, and the bar itself at each point (meta) */
  function addSegment(groups, kind, lane, y, item, text) {
    const g = groups[kind] || (groups[kind] = { x: [], y: [], text: [], items: [], lane: lane });
    g.x.push(item.start, (item.start + item.end) / 2, item.end, null);
    g.y.push(y, y, y, null);
    g.text.push(text, text, text, null);
    g.items.push(item, item, item, null);
  }

  /* one trace per kind of the groups addSegment filled; more(kind, group): its own fields */
  function segmentTraces(groups, rowPx, more) {
    const traces = [];
    for (const kind of Object.keys(KINDS)) {
      const g = groups[kind];
      if (!g) continue;
      traces.push(Object.assign({
        type: "scatter", mode: "lines", x: g.x, y: g.y, text: g.text,
        hovertemplate: "%{text}<extra></extra>",
        line: { color: KINDS[kind].color, width: Math.max(2, rowPx * LANES[g.lane].width) },
        showlegend: true, connectgaps: false,
      }, more(kind, g)));
    }
    return traces;
  }

  /* traces of `events` on rows {uid: index}; opts: {ghost, rowPx, labels, xmin, xmax}. Planned
     ghosts are the compute and aggregation bars (a plan's transfers are not drawn). */
  function ganttTraces(events, rows, opts) {
    const groups = {};
    for (const e of events) {
      if (opts.xmin !== undefined && (e.end < opts.xmin || e.start > opts.xmax)) continue;
      const row = rows[e.device];
      if (row === undefined) continue;
      const spec = KINDS[e.kind] || KINDS.load;
      if (opts.ghost && spec.lane === "comm") continue;
      const lane = opts.ghost ? "ghost" : spec.lane;
      addSegment(groups, e.kind, lane, row + LANES[lane].y, e,
                 hoverText(e, opts.labels[e.device] || e.device, opts.ghost));
    }
    return segmentTraces(groups, opts.rowPx, function (kind, g) {
      return {
        meta: { events: g.items }, // the event of each point: flowOf finds a transfer's other end
        opacity: opts.ghost ? 0.38 : 1,
        name: opts.ghost ? "planned " + kind : KINDS[kind].label,
        legendgroup: opts.ghost ? "planned" : kind,
        legendrank: (opts.ghost ? 100 : 1) + Object.keys(KINDS).indexOf(kind),
      };
    });
  }

  /* traces of a downsampled timeline's bars (GET /api/runs/<id>/timeline/: each merges the
     events of a device and lane within a bin of the span) on rows {uid: index}; drawn as the
     events are, coloured by the kind that kept the bar busy longest; opts: {rowPx, labels}.
     Each trace's meta.bars holds the bar of each point. */
  function barText(b, label) {
    const length = Math.max(b.end - b.start, 1e-9);
    return "<b>" + EP.plural(b.count, "event") + "</b> · mostly " + EP.esc(b.kind) +
      " · micro-batches " + b.microbatches[0] + "–" + b.microbatches[1] + "<br>" +
      EP.esc(label) + "<br>" + b.start.toFixed(3) + " – " +
      b.end.toFixed(3) + " s, busy " + Math.round((100 * b.busy_s) / length) + "%" +
      "<br><i>zoom in for the events</i>";
  }

  function overviewTraces(bars, rows, opts) {
    const groups = {};
    for (const b of bars) {
      const row = rows[b.device];
      if (row === undefined) continue;
      const kind = b.kind in KINDS ? b.kind : "load";
      const lane = LANES[b.lane] ? b.lane : KINDS[kind].lane;
      addSegment(groups, kind, lane, row + LANES[lane].y, b, barText(b, opts.labels[b.device] || b.device));
    }
    return segmentTraces(groups, opts.rowPx, function (kind, g) {
      return { meta: { bars: g.items }, name: KINDS[kind].label, legendgroup: kind,
               legendrank: 1 + Object.keys(KINDS).indexOf(kind) };
    });
  }

  /* The other end of a transfer: for a send, the receive of the same micro-batch on a
     neighbouring stage that ends first after the send began (a forward's activation goes to
     the next stage, a backward's gradient to the previous one, much later); for a receive,
     the send it took, on a neighbouring stage, that began last before the receive ended. Null
     for other kinds or when the other end is not among `events`. */
  function flowOf(e, events) {
    if (!e || (e.kind !== "send" && e.kind !== "recv")) return null;
    const other = e.kind === "send" ? "recv" : "send";
    let best = null;
    for (const c of events) {
      if (c.kind !== other || c.microbatch !== e.microbatch || c.device === e.device ||
          Math.abs(c.stage - e.stage) !== 1) continue;
      if (e.kind === "send") {
        if (c.end >= e.start && (best === null || c.end < best.end)) best = c;
      } else if (c.start <= e.end && (best === null || c.start > best.start)) {
        best = c;
      }
    }
    return best;
  }

  /* The arrow a Gantt draws from a send to its receive (Plotly annotation, data coordinates);
     rows: {uid: row index} */
  function flowArrow(send, recv, rows) {
    const y = function (e) { return rows[e.device] + LANES.comm.y; };
    return {
      x: recv.end, y: y(recv), ax: send.start, ay: y(send), xref: "x", yref: "y", axref: "x",
      ayref: "y", showarrow: true, arrowhead: 2, arrowsize: 1.2, arrowwidth: 1.5,
      arrowcolor: "#0f172a", text: "", name: "flow",
    };
  }

  /* A Gantt's rows: the devices of each stage in pipeline order (stages: [{devices: [uid]}]),
     a stage's replicas side by side, each labelled "stage k · name"; then, by name, the
     devices the stages leave out (devices: uids, the run's own order) and any other device
     `seen` in the events (sorted, never in the order events arrived). Without stages, the
     devices in their order, labelled by name. labels: uid -> name. */
  function stageRows(stages, labels, devices, seen) {
    const rows = [];
    const placed = new Set();
    (stages || []).forEach(function (stage, k) {
      const group = (stage.devices || []).filter(function (uid) { return !placed.has(uid); });
      group.forEach(function (uid, j) {
        placed.add(uid);
        rows.push({ device: uid, stage: k, replica: j, replicas: group.length,
                    label: "stage " + k + " · " + (labels[uid] || uid) });
      });
    });
    const rest = (devices || []).concat((seen || []).slice().sort());
    for (const uid of rest) {
      if (placed.has(uid)) continue;
      placed.add(uid);
      rows.push({ device: uid, stage: null, replica: 0, replicas: 1,
                  label: (labels[uid] || uid) + (stages ? " · no stage" : "") });
    }
    return rows;
  }

  /* where data y sits on the paper (0 bottom, 1 top) of an axis reversed over [lo, hi] */
  function paperY(y, range) { return (range[0] - y) / (range[0] - range[1]); }

  /* runs of adjacent rows serving the same stage: [{first, last}] (a row without a stage
     is a run of its own) */
  function stageRuns(rowList) {
    const runs = [];
    rowList.forEach(function (r, i) {
      const last = runs[runs.length - 1];
      if (last && r.stage !== null && r.stage === rowList[last.first].stage) last.last = i;
      else runs.push({ first: i, last: i });
    });
    return runs;
  }

  /* the bands, separators and brackets that show which rows serve the same stage: a stage's
     rows share a band (every other stage shaded), its replicas are split by dotted lines and
     the stages by solid ones, and a group of replicas gets a bracket left of its rows */
  function stageShapes(rowList, range) {
    const shapes = [];
    const runs = stageRuns(rowList);
    runs.forEach(function (run, n) {
      if (n % 2 === 1) {
        shapes.push({ type: "rect", xref: "paper", x0: 0, x1: 1, y0: run.first - 0.5, y1: run.last + 0.5,
                      fillcolor: "#f1f5f9", opacity: 0.6, line: { width: 0 }, layer: "below" });
      }
      for (let j = run.first; j < run.last; j += 1) {
        shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: j + 0.5, y1: j + 0.5,
                      line: { color: "#e2e8f0", width: 1, dash: "dot" } });
      }
      if (run.last > run.first) {
        const top = paperY(run.first - 0.42, range);
        const bottom = paperY(run.last + 0.42, range);
        // x in pixels left of the plot, whatever its width
        shapes.push({ type: "path", xref: "paper", yref: "paper", xsizemode: "pixel", xanchor: 0,
                      layer: "above", path: "M -3," + top + " L -8," + top + " L -8," + bottom +
                        " L -3," + bottom,
                      line: { color: GROUP_COLOR, width: 2 } });
      }
      if (n < runs.length - 1) {
        shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: run.last + 0.5, y1: run.last + 0.5,
                      line: { color: "#cbd5e1", width: 1 } });
      }
    });
    return shapes;
  }

  /* A left margin that holds the longest of `texts` (plain text) drawn in the charts' font,
     `gap` pixels from the plot: Plotly's automargin gives up where its pushes would leave the
     plot too narrow, and a fixed margin cuts long device names. */
  function labelMargin(texts, gap) {
    let widest = 0;
    for (const text of texts) widest = Math.max(widest, EP.textWidth(text, EP.plotFont));
    return Math.max(60, Math.ceil(widest) + gap + 8);
  }

  /* Row labels that fit a chart `width` px wide (0: unknown) in at most three fifths of it, each
     cut short with "…" where it is longer (the hover of its bars names it whole), and the left
     margin that holds them `gap` px from the plot. */
  function fitLabels(texts, gap, width) {
    const room = width > 0 ? Math.max(80, 0.6 * width) - gap - 8 : Infinity;
    const fits = function (text) { return EP.textWidth(text, EP.plotFont) <= room; };
    const labels = texts.map(function (text) {
      let cut = String(text);
      if (fits(cut)) return cut;
      while (cut.length > 1 && !fits(cut + "…")) cut = cut.slice(0, -1);
      return cut.trimEnd() + "…";
    });
    return { labels: labels, margin: labelMargin(labels, gap) };
  }

  /* rowList: stageRows' rows (or {label}); labels are text, never markup. opts: {height,
     width (the chart's, to fit the labels in), legend, xrange, uirevision} */
  function ganttLayout(rowList, opts) {
    const range = [rowList.length - 0.45, -0.7];
    // the labels stand 13 px off the plot, clear of the replicas' bracket
    const fitted = fitLabels(rowList.map(function (r) { return r.label; }), 13, opts.width || 0);
    return {
      height: opts.height,
      margin: { l: fitted.margin, r: 16, t: opts.legend === false ? 8 : 30, b: 40 },
      font: EP.plotFont,
      hovermode: "closest",
      hoverdistance: 12,
      showlegend: opts.legend !== false,
      legend: { orientation: "h", x: 1, xanchor: "right", y: 1, yanchor: "bottom", font: { size: 11 } },
      xaxis: { title: { text: "seconds since the run started", font: { size: 11 } }, zeroline: false,
               gridcolor: "#eef2f7", range: opts.xrange, autorange: opts.xrange ? false : true },
      yaxis: {
        range: range, tickmode: "array",
        tickvals: rowList.map(function (_, i) { return i; }),
        ticktext: fitted.labels.map(EP.esc),
        zeroline: false, showgrid: false, fixedrange: true, automargin: true, ticklabelstandoff: 13,
      },
      shapes: stageShapes(rowList.map(function (r) {
        return { stage: r.stage === undefined ? null : r.stage };
      }), range),
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
      height: opts.height || 240, font: EP.plotFont, margin: { l: 60, r: 16, t: 8, b: 44 },
      xaxis: { title: { text: "episode", font: { size: 11 } }, gridcolor: "#eef2f7", rangemode: "tozero" },
      yaxis: { title: { text: "step time (s) = reward²", font: { size: 11 } }, type: "log",
               gridcolor: "#eef2f7", range: range, autorange: range ? false : true },
      legend: EP.legendAbove(),
      plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: opts.uirevision,
    };
  }

  EP.charts = {
    KINDS: KINDS, LANES: LANES, IDLE: IDLE, ganttTraces: ganttTraces, overviewTraces: overviewTraces,
    hoverText: hoverText, barText: barText,
    ganttLayout: ganttLayout, rowHeight: rowHeight,
    flowOf: flowOf, flowArrow: flowArrow,
    stageRows: stageRows, labelMargin: labelMargin,
    trainingTraces: trainingTraces, trainingLayout: trainingLayout,
  };
})();
