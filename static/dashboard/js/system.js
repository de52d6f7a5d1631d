/* The run page's "Devices' system" card: each device's CPU use (percent of its cores; dotted,
   the agent process's share) and memory (GiB used; dashed, the device's total; dotted, the
   agent's resident memory) over the run's clock, and a temperature panel once a device
   reports one (the metric kinds of orchestrator.protocol.SYSTEM_METRICS, sampled by
   agent.system). It reads the page's state, EdgePipe.runPage.state() (the snapshot brought
   forward by the deltas), once a second and redraws only when its system points changed; the
   devices are named, coloured and ordered as the run-config lists them (pipeline order). */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const cfg = EP.readJSON("run-config");
  const READ_EVERY_MS = 1000;
  const GIB = 1024 * 1024 * 1024;
  // the report's colours (orchestrator.report.figures.DEVICE_COLORS), by place in the pipeline
  const COLORS = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#ca8a04", "#475569"];
  // each panel: its axis, title, unit, scale, and its kinds with their line's dash
  const PANELS = [
    { axis: "y", title: "CPU (%)", unit: "%", scale: 1, kinds: [["cpu_pct", "solid"], ["proc_cpu_pct", "dot"]] },
    { axis: "y2", title: "memory (GiB)", unit: "GiB", scale: 1 / GIB,
      kinds: [["mem_used_bytes", "solid"], ["mem_total_bytes", "dash"], ["proc_rss_bytes", "dot"]] },
    { axis: "y3", title: "temperature (°C)", unit: "°C", scale: 1, kinds: [["temp_c", "solid"]] },
  ];
  const KINDS = new Set();
  PANELS.forEach(function (p) { p.kinds.forEach(function (k) { KINDS.add(k[0]); }); });

  const labels = {}; // uid -> name
  const order = []; // uids in pipeline order
  cfg.devices.forEach(function (d) { labels[d.device] = d.label; order.push(d.device); });

  const chart = document.getElementById("system");
  const empty = document.getElementById("system-empty");
  if (!chart) return;
  let drawn = ""; // what the chart shows: its points' count and newest time

  function systemPoints(metrics) {
    return (metrics || []).filter(function (p) { return KINDS.has(p.kind) && p.device; });
  }

  function read() {
    const state = EP.runPage && EP.runPage.state();
    if (!state) return;
    const points = systemPoints(state.metrics);
    const key = points.length + ":" + (points.length ? points[points.length - 1].at : "");
    if (key === drawn) return;
    drawn = key;
    draw(points);
  }

  function draw(points) {
    empty.hidden = points.length > 0;
    chart.hidden = points.length === 0;
    if (!points.length) return;
    const series = {}; // uid -> kind -> {x, y}
    for (const p of points) {
      const kinds = series[p.device] || (series[p.device] = {});
      const s = kinds[p.kind] || (kinds[p.kind] = { x: [], y: [] });
      s.x.push(p.at);
      s.y.push(p.value);
    }
    const devices = order.filter(function (d) { return d in series; })
      .concat(Object.keys(series).filter(function (d) { return order.indexOf(d) < 0; }).sort());
    const panels = PANELS.filter(function (panel) {
      return panel.axis !== "y3" || devices.some(function (d) { return "temp_c" in series[d]; });
    });
    const traces = [];
    devices.forEach(function (d, k) {
      const name = EP.esc(labels[d] || d); // markup to Plotly: escaped
      const color = COLORS[k % COLORS.length];
      let legend = true; // the device's first trace names it in the legend
      panels.forEach(function (panel) {
        panel.kinds.forEach(function (kd) {
          const s = series[d][kd[0]];
          if (!s) return;
          traces.push({
            type: "scatter", mode: "lines", name: name, legendgroup: d, showlegend: legend,
            x: s.x, y: s.y.map(function (v) { return v * panel.scale; }), yaxis: panel.axis,
            line: { color: color, dash: kd[1], width: kd[1] === "dash" ? 1 : 1.6 },
            meta: { device: d, kind: kd[0] },
            hovertemplate: kd[0] + ": %{y:.3g} " + panel.unit + "<br>%{x:.1f} s<extra>" + name + "</extra>",
          });
          legend = false;
        });
      });
    });
    // the panels stacked top to bottom, sharing the run's clock on the bottom one's axis
    const gap = 0.1;
    const height = (1 - gap * (panels.length - 1)) / panels.length;
    const layout = {
      height: 90 + 170 * panels.length, font: EP.plotFont,
      margin: { l: 56, r: 16, t: 8, b: 44 }, legend: EP.legendAbove(),
      plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: "system",
      xaxis: { anchor: panels[panels.length - 1].axis, gridcolor: "#eef2f7",
               title: { text: "run time (s)", font: { size: 11 } } },
    };
    panels.forEach(function (panel, i) {
      const top = 1 - i * (height + gap);
      const axis = { domain: [top - height, top], gridcolor: "#eef2f7", rangemode: "tozero",
                     title: { text: panel.title, font: { size: 11 } } };
      if (panel.axis === "y") { axis.range = [0, 100]; axis.fixedrange = true; }
      layout[panel.axis === "y" ? "yaxis" : "yaxis" + panel.axis.slice(1)] = axis;
    });
    Plotly.react(chart, traces, layout, EP.plotConfig);
  }

  setInterval(read, READ_EVERY_MS);
  read();
})();
