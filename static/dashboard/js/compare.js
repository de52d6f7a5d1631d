/* Compare runs: the throughput of each run over time, one line each. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const series = EP.readJSON("compare-series");
  const chart = document.getElementById("compare-throughput");
  const traces = series.filter(function (s) { return s.x.length > 0; }).map(function (s) {
    return { type: "scatter", mode: "lines", name: EP.esc(s.name), x: s.x, y: s.y,
             hovertemplate: "%{y:.1f} samples/s at %{x:.1f} s<extra>" + EP.esc(s.name) + "</extra>" };
  });
  if (!traces.length) {
    chart.hidden = true;
    document.getElementById("compare-throughput-empty").hidden = false;
    return;
  }
  Plotly.react(chart, traces, {
    height: 340, margin: { l: 60, r: 20, t: 10, b: 44 },
    xaxis: { title: { text: "seconds since the run started" } },
    yaxis: { title: { text: "samples/s" }, rangemode: "tozero" },
    legend: EP.legendAbove(),
  }, EP.plotConfig);
})();
