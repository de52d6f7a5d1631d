/* Compare runs: the throughput of each run over time, one line each; and, when some run
   has them (split learning, PipeLearn and its baselines), the averaged model's held-out
   accuracy after each round, one line each. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const series = EP.readJSON("compare-series");
  const rounds = series.filter(function (s) { return s.held_out.length > 0; }).map(function (s) {
    return { type: "scatter", mode: "lines+markers", name: EP.esc(s.name),
             x: s.held_out.map(function (_, i) { return i + 1; }), y: s.held_out,
             hovertemplate: "round %{x}: %{y:.1%}<extra>" + EP.esc(s.name) + "</extra>" };
  });
  if (rounds.length) {
    document.getElementById("compare-held-out-card").hidden = false;
    Plotly.react(document.getElementById("compare-held-out"), rounds, {
      height: 300, margin: { l: 60, r: 20, t: 10, b: 44 },
      xaxis: { title: { text: "round (epoch)" }, dtick: 1 },
      yaxis: { title: { text: "held-out accuracy" }, range: [0, 1], tickformat: ".0%" },
      legend: EP.legendAbove(),
    }, EP.plotConfig);
  }
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
