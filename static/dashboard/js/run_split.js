/* The run page of a split run (loaded only there): every 2 s while the run is on (and for 10 s
   after it ends), it reads GET /api/runs/<id>/split/ (webapp.runs.split_selectors.
   split_progress) and draws each batch's measured makespan against the chosen plan's, each
   client's progress with its helper, and each round's held-out accuracy of the aggregated
   model. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const R = EP.run;
  const $ = R.$;
  const h = EP.h;
  const POLL_MS = 2000;
  const FINAL = ["finished", "failed", "cancelled"];

  function label(uid) { return uid ? R.labels[uid] || uid : "–"; }

  function renderMakespan(data) {
    const batches = data.batches;
    $("split-empty").hidden = batches.length > 0;
    $("split-makespan").hidden = batches.length === 0;
    if (!batches.length) return;
    const x = batches.map(function (b) { return b.batch + 1; });
    const traces = [{
      type: "scatter", mode: "lines+markers", x: x,
      y: batches.map(function (b) { return b.makespan_s; }), name: "measured",
      line: { width: 2, color: "#2563eb" }, marker: { size: 4 },
      hovertemplate: "batch %{x}: %{y:.4g} s<extra>measured</extra>",
    }];
    if (data.planned_makespan_s !== null) {
      traces.push({
        type: "scatter", mode: "lines", x: [x[0], x[x.length - 1]],
        y: [data.planned_makespan_s, data.planned_makespan_s], name: "planned",
        line: { width: 1.5, dash: "dash", color: "#475569" },
        hovertemplate: "%{y:.4g} s<extra>planned</extra>",
      });
      const sorted = batches.map(function (b) { return b.makespan_s; }).sort(function (a, b) { return a - b; });
      const median = sorted[Math.floor(sorted.length / 2)];
      $("split-hint").textContent = "median batch " + EP.fmt.num(median, 3) + " s against " +
        EP.fmt.num(data.planned_makespan_s, 3) + " s planned (" +
        EP.fmt.num(median / data.planned_makespan_s, 3) + "x)";
    }
    Plotly.react($("split-makespan"), traces, {
      height: 240, font: EP.plotFont, margin: { l: 60, r: 20, t: 8, b: 40 },
      xaxis: { title: { text: "batch", font: { size: 11 } }, gridcolor: "#eef2f7" },
      yaxis: { title: { text: "makespan (s)", font: { size: 11 } }, gridcolor: "#eef2f7", rangemode: "tozero" },
      legend: EP.legendAbove(), plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: "split",
    }, EP.plotConfig);
  }

  function renderClients(data) {
    const body = $("split-clients").querySelector("tbody");
    body.replaceChildren.apply(body, data.clients.map(function (c) {
      const share = c.batches ? Math.min(1, c.batches_done / c.batches) : 0;
      const bar = h("div", { class: "progress", title: Math.round(share * 100) + "%" });
      bar.append(h("span", { style: "width:" + (share * 100).toFixed(1) + "%" }));
      return h("tr", { "data-device": c.device },
        h("td", null, label(c.device)), h("td", null, label(c.helper)),
        h("td", { class: "num" }, c.batches_done + " / " + c.batches), h("td", null, bar));
    }));
  }

  function renderRounds(data) {
    const body = $("split-rounds").querySelector("tbody");
    $("split-rounds-empty").hidden = data.rounds.length > 0;
    body.replaceChildren.apply(body, data.rounds.map(function (r) {
      return h("tr", { "data-round": r.round },
        h("td", { class: "num" }, r.round), h("td", { class: "num" }, r.applied),
        h("td", { class: "num" }, (100 * r.accuracy).toFixed(1) + "%"),
        h("td", { class: "num" }, EP.fmt.seconds(r.at)));
    }));
  }

  const POLLS_AFTER_END = 5; // the last round's accuracy comes after its stages end
  let last = null;
  let afterEnd = 0;
  async function refresh() {
    const answer = await EP.api("GET", R.cfg.urls.split);
    if (answer.ok) {
      last = answer.data;
      renderMakespan(last);
      renderClients(last);
      renderRounds(last);
    }
    if (R.snap && FINAL.indexOf(R.snap.run.state) >= 0) afterEnd += 1;
    if (afterEnd <= POLLS_AFTER_END) setTimeout(refresh, POLL_MS);
  }

  EP.runPage.split = function () { return last; };
  document.addEventListener("DOMContentLoaded", refresh);
})();
