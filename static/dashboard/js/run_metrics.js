/* The run page's metric charts (EdgePipe.run, run.js): idle time per device by cause,
   throughput against the plan's prediction (a step line that follows each re-partition), and
   loss and accuracy. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const R = EP.run;
  const labels = R.labels;
  const $ = R.$;

  /* ---------------------------------------------------------------- idle breakdown */

  function renderIdle() {
    const idle = R.snap.idle;
    const devices = Object.keys(idle.devices);
    $("idle-empty").hidden = devices.length > 0;
    $("idle").hidden = devices.length === 0;
    if (!devices.length) return;
    const gantt = R.ganttRows();
    const order = gantt.rows.map(function (r) { return r.device; }).filter(function (d) { return d in idle.devices; })
      .concat(devices.filter(function (d) { return !(d in gantt.index); }).sort());
    const plain = order.map(function (d) { return gantt.labels[d] || labels[d] || d; });
    // category labels are markup to Plotly: escaped
    const names = plain.map(EP.esc);
    const length = Math.max(1e-9, idle.window[1] - idle.window[0]);
    const traces = EP.charts.IDLE.map(function (part) {
      return {
        type: "bar", orientation: "h", name: part.label, y: names,
        x: order.map(function (d) { return idle.devices[d][part.key]; }),
        marker: { color: part.color },
        customdata: order.map(function (d) { return (100 * idle.devices[d][part.key]) / length; }),
        hovertemplate: part.label + ": %{x:.3f} s (%{customdata:.1f}%)<extra>%{y}</extra>",
      };
    });
    $("idle-window").textContent = "run time " + idle.window[0].toFixed(1) + "–" + idle.window[1].toFixed(1) + " s";
    Plotly.react($("idle"), traces, {
      barmode: "stack", height: 70 + 34 * order.length + 40, font: EP.plotFont,
      margin: { l: EP.charts.labelMargin(plain, 4), r: 16, t: 6, b: 44 },
      xaxis: { title: { text: "seconds of the window", font: { size: 11 } }, gridcolor: "#eef2f7" },
      yaxis: { autorange: "reversed", fixedrange: true, automargin: true },
      legend: EP.legendAbove(),
      plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: "idle",
    }, EP.plotConfig);
  }

  /* ---------------------------------------------------------------- metrics */

  function series(points, kind, scale) {
    const groups = {};
    for (const p of points) {
      if (p.kind !== kind) continue;
      const g = groups[p.device] || (groups[p.device] = { x: [], y: [] });
      g.x.push(p.at);
      g.y.push(p.value * scale);
    }
    return groups;
  }

  function lineTraces(groups, name, axis, dash) {
    return Object.keys(groups).sort().map(function (device) {
      return {
        type: "scatter", mode: "lines", x: groups[device].x, y: groups[device].y, yaxis: axis,
        name: device ? name + " · " + EP.esc(labels[device] || device) : name,
        line: { width: 2, dash: dash || "solid", shape: "linear" },
        hovertemplate: "%{y:.4g}<extra>%{fullData.name}</extra>",
      };
    });
  }

  /* a split run's aggregated model on the held-out set, one point a round */
  function roundTraces(groups) {
    return lineTraces(groups, "held-out accuracy (each round's FedAvg)", "y2").map(function (t) {
      t.mode = "lines+markers";
      t.marker = { size: 8, symbol: "diamond" };
      t.line.color = "#15803d";
      return t;
    });
  }

  function metricLayout(left, right) {
    return {
      height: 280, font: EP.plotFont, margin: { l: 60, r: 60, t: 8, b: 44 },
      xaxis: { title: { text: "seconds since the run started", font: { size: 11 } }, gridcolor: "#eef2f7" },
      yaxis: { title: { text: left, font: { size: 11 } }, gridcolor: "#eef2f7", rangemode: "tozero" },
      yaxis2: { title: { text: right, font: { size: 11 } }, overlaying: "y", side: "right", rangemode: "tozero",
                showgrid: false },
      legend: EP.legendAbove(),
      plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: left,
    };
  }

  /* the throughput the chosen plan predicts, null before one is chosen (or computed) */
  function chosenPrediction() {
    const id = R.snap.run.chosen_plan;
    const plan = id === null ? null : R.snap.plans.find(function (p) { return p.id === id; });
    return plan && typeof plan.throughput_sps === "number" ? plan.throughput_sps : null;
  }

  /* The throughput predicted for the plan being trained from x0 to x1 s, as a step line: the
     chosen plan's, then from each re-partition on, its new plan's. */
  function predictedTrace(x0, x1) {
    // the first re-partition after x0 (binary search: there may be one every few batches)
    let lo = 0;
    let hi = R.predictions.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (R.predictions[mid].at <= x0) lo = mid + 1; else hi = mid;
    }
    let value = lo > 0 ? R.predictions[lo - 1].sps : chosenPrediction();
    const x = [];
    const y = [];
    if (value !== null) { x.push(x0); y.push(value); }
    for (let i = lo; i < R.predictions.length && R.predictions[i].at <= x1; i += 1) {
      value = R.predictions[i].sps;
      x.push(R.predictions[i].at);
      y.push(value);
    }
    if (!x.length) return null;
    x.push(x1);
    y.push(value);
    return {
      type: "scatter", mode: "lines", x: x, y: y, yaxis: "y", name: "predicted (plan)",
      line: { width: 1.5, dash: "dash", shape: "hv", color: "#475569" },
      hovertemplate: "%{y:.4g} samples/s<extra>predicted</extra>",
    };
  }

  /* the time span of groups of series (each in time order): [first, last] */
  function spanOf(groups) {
    let first = Infinity;
    let last = -Infinity;
    for (const device of Object.keys(groups)) {
      const x = groups[device].x;
      first = Math.min(first, x[0]);
      last = Math.max(last, x[x.length - 1]);
    }
    return first <= last ? [first, last] : null;
  }

  const ACCURACY_TICKS = [0, 0.2, 0.4, 0.6, 0.8, 1];

  function renderMetrics() {
    const points = R.snap.metrics;
    const measured = series(points, "throughput_sps", 1);
    const speed = lineTraces(measured, "samples/s", "y");
    const span = spanOf(measured);
    const predicted = span ? predictedTrace(span[0], span[1]) : null;
    if (predicted) speed.push(predicted);
    speed.push.apply(speed, lineTraces(series(points, "network_bps", 1e-6), "network MB/s", "y2", "dot"));
    $("throughput-empty").hidden = speed.length > 0;
    $("throughput").hidden = speed.length === 0;
    if (speed.length) Plotly.react($("throughput"), speed, metricLayout("samples/s", "network MB/s"), EP.plotConfig);
    const learning = lineTraces(series(points, "loss", 1), "loss", "y")
      .concat(lineTraces(series(points, "accuracy", 1), "accuracy", "y2", "dot"))
      .concat(roundTraces(series(points, "test_accuracy", 1)));
    $("training-empty").hidden = learning.length > 0;
    $("training").hidden = learning.length === 0;
    if (learning.length) {
      const layout = metricLayout("loss (log)", "accuracy");
      // the loss falls by decades; accuracy is a share, on the whole of its scale
      layout.yaxis.type = "log";
      delete layout.yaxis.rangemode;
      Object.assign(layout.yaxis2, { range: [0, 1], autorange: false, tickmode: "array",
                                     tickvals: ACCURACY_TICKS, tickformat: ".0%" });
      delete layout.yaxis2.rangemode;
      Plotly.react($("training"), learning, layout, EP.plotConfig);
    }
  }

  R.renderIdle = renderIdle;
  R.renderMetrics = renderMetrics;
})();
