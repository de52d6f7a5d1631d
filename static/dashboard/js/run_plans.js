/* The run page's plans (EdgePipe.run, run.js): the comparison of the run's plans with each
   plan's layout (stages, the groups serving them, betas, the planner's notes), the *Start*
   buttons, each plan's planned Gantt (simulated, two batches) and each learned planner's
   training curve (TAPP saves it on its plan as it learns; drawn from the plan events or the
   snapshots). */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const R = EP.run;
  const h = EP.h;
  const fmt = EP.fmt;
  const cfg = R.cfg;
  const labels = R.labels;
  const $ = R.$;
  const planGantts = {}; // plan id -> "loading" | "done" | error text
  const trainingDrawn = {}; // plan id -> what its training chart shows (status and episodes)
  let compareKey = "";
  let lastCompare = null;

  /* ---------------------------------------------------------------- plans */

  for (const kind of Object.keys(EP.charts.KINDS)) {
    const swatch = h("i");
    swatch.style.background = EP.charts.KINDS[kind].color;
    $("kind-legend").append(h("span", null, swatch, EP.charts.KINDS[kind].label));
  }

  /* The comparison is fetched again when a plan's status or attempt changes (a worker that
     stopped mid-plan: the plan is computed again); a training plan's progress only redraws the
     table (its status cell) and its training chart. */
  async function renderPlans() {
    const plans = R.snap.plans;
    $("plans-empty").hidden = plans.length > 0;
    $("plans-body").hidden = plans.length === 0;
    renderTrainings();
    const key = JSON.stringify(plans.map(function (p) {
      return [p.id, p.status, p.attempts, (p.interruptions || []).length];
    })) + R.snap.run.state +
      R.snap.run.chosen_plan;
    if (plans.length === 0) return;
    if (key === compareKey) {
      if (lastCompare && plans.some(isTraining)) renderCompare(lastCompare);
      return;
    }
    compareKey = key;
    const answers = await Promise.all([EP.api("GET", cfg.urls.compare), EP.api("GET", cfg.urls.layouts)]);
    const answer = answers[0];
    if (answers[1].ok) {
      for (const id of Object.keys(R.layouts)) delete R.layouts[id];
      answers[1].data.layouts.forEach(function (l) { R.layouts[l.plan] = l; });
      R.dirty.add("R.layouts");
      R.render();
    }
    if (!answer.ok) {
      $("plans-why").textContent = answer.data.detail;
      return;
    }
    lastCompare = answer.data;
    renderCompare(answer.data);
  }

  /* ---------------------------------------------------------------- plan layouts */

  /* A plan's stages, each with the group of devices serving it, their betas, and the planner's
     notes (the markup of the compare page's _plan_layout.html, less the planner's name, which
     its row shows; text, never markup). */
  function layoutView(layout) {
    const stages = h("ul", { class: "plan-stages" });
    for (const st of layout.stages) {
      const item = h("li", { "data-stage": st.stage, "data-replicas": st.replicas,
                             class: st.replicas > 1 ? "is-group" : null },
        h("span", { class: "stage-name" }, "stage " + st.stage), " ", h("span", { class: "stage-text" }, st.text));
      for (const d of st.devices) {
        if (!d.passes) continue;
        item.append(h("div", { class: "passes", "data-device": d.device },
          h("span", { class: "muted" }, d.label + ":"), " " + d.passes));
      }
      stages.append(item);
    }
    const notes = h("ul", { class: "plan-notes" });
    for (const note of layout.notes) notes.append(h("li", null, note));
    return h("div", { class: "plan-layout", "data-plan-layout": layout.plan },
      h("div", { class: "plan-layout-head" }, h("span", { class: "muted" }, layout.summary)),
      stages, layout.notes.length ? notes : null);
  }

  function episodesOf(plan) {
    return plan && plan.training && plan.training.episodes ? plan.training.episodes.length : 0;
  }

  function isTraining(plan) { return plan.status === "running" && episodesOf(plan) > 0; }

  function statusCell(row, plan) {
    if (isTraining(plan)) {
      return h("td", null, h("span", { class: "badge badge-running", "data-training": plan.id },
        "training · episode " + plan.training.episodes[episodesOf(plan) - 1]));
    }
    if (row.status === "running" && plan.attempts > 1) {
      return h("td", null, EP.badge(row.status), h("span", { class: "muted small" }, " attempt " + plan.attempts));
    }
    return h("td", null, EP.badge(row.status));
  }

  function cell(text, cls) { return h("td", { class: cls }, text); }

  /* A worker killed (or gone silent) mid-plan: which one, on which attempt, and what happens
     now (the plan is queued for any worker, or computed again on another). */
  function interruptionsNote(plan) {
    const stopped = plan.interruptions || [];
    if (stopped.length === 0) return null;
    const lines = stopped.map(function (i) {
      return "Worker " + (i.worker || "?") + " stopped during attempt " + i.attempt +
        " (" + i.reason + ", " + fmt.when(i.at) + ").";
    });
    const now = plan.status === "pending" ? "Waiting for a worker to compute it again."
      : plan.status === "running" ? "Attempt " + plan.attempts + " on " + plan.worker + "."
      : "Attempt " + plan.attempts + " finished it.";
    return h("span", { class: "warning-note", "data-interrupted": plan.id }, lines.join(" ") + " " + now);
  }

  function renderCompare(compare) {
    const byId = {};
    R.snap.plans.forEach(function (p) { byId[p.id] = p; });
    const why = $("plans-why");
    why.hidden = !compare.reason;
    why.textContent = compare.reason;
    const body = $("plans-table");
    body.replaceChildren();
    const canStart = R.snap.run.state === "planned";
    for (const row of compare.rows) {
      const plan = byId[row.plan] || {};
      const best = row.plan === compare.best;
      const chosen = row.plan === R.snap.run.chosen_plan;
      const tr = h("tr", { class: best ? "is-best" : "" },
        h("td", { class: "name" }, row.algorithm, best ? h("span", { class: "tag" }, "best") : null,
          chosen ? h("span", { class: "tag" }, "chosen") : null),
        statusCell(row, plan),
        cell(row.stages === null ? "–" : row.stages, "num"),
        cell(fmt.seconds(row.period_s), "num"),
        cell(row.throughput_sps === null ? "–" : fmt.num(row.throughput_sps) + " /s", "num"),
        cell(row.simulated_throughput_sps === null ? "–" : fmt.num(row.simulated_throughput_sps) + " /s", "num"),
        cell(row.vs_best === null ? "–" : row.vs_best.toFixed(2) + "×", "num"),
        cell(row.bottleneck || "–"),
        h("td", null, row.memory_ok === null ? "–" : row.memory_ok ? h("span", { class: "badge badge-done" }, "fits")
          : h("span", { class: "badge badge-failed" }, "too big")),
        cell(fmt.seconds(row.planner_s), "num"),
        h("td", { class: "num" }, canStart && row.status === "done" && row.memory_ok
          ? h("button", { class: "btn btn-small" + (best ? " btn-primary" : ""), type: "button",
                          "data-start-plan": row.plan }, "Start")
          : null));
      body.append(tr);
      const layout = R.layouts[row.plan];
      if (layout && row.status === "done") {
        body.append(h("tr", { class: "sub" }, h("td", { colspan: 11, class: "small" }, layoutView(layout))));
      }
      if (row.error) {
        body.append(h("tr", null, h("td", { colspan: 11, class: "small" },
          h("span", { class: "field-error" }, row.error))));
      }
      const stopped = interruptionsNote(plan);
      if (stopped) body.append(h("tr", null, h("td", { colspan: 11, class: "small" }, stopped)));
      if (row.status === "done" && plan.id && !planGantts[row.plan]) loadPlanGantt(row);
    }
    orderPlanGantts(compare.rows);
  }

  function orderPlanGantts(rows) {
    const box = $("plan-gantts");
    const current = new Set(rows.map(function (r) { return String(r.plan); }));
    for (const card of Array.from(box.children)) {
      if (!current.has(card.getAttribute("data-plan"))) {
        card.remove();
        delete planGantts[card.getAttribute("data-plan")];
      }
    }
    for (const row of rows) {
      const card = box.querySelector('[data-plan="' + row.plan + '"]');
      if (card) box.append(card);
    }
    $("plan-gantts-empty").hidden = box.children.length > 0;
  }

  async function loadPlanGantt(row) {
    planGantts[row.plan] = "loading";
    const box = $("plan-gantts");
    const chart = h("div", { class: "chart" });
    const card = h("div", { class: "plan-gantt", "data-plan": row.plan },
      h("h3", null, h("span", null, row.algorithm),
        h("span", { class: "muted small" }, "period " + fmt.seconds(row.period_s))),
      chart);
    box.append(card);
    $("plan-gantts-empty").hidden = true;
    const answer = await EP.api("GET", cfg.urls.plan_timeline.replace("{plan}", String(row.plan)));
    if (!answer.ok) {
      planGantts[row.plan] = answer.data.detail;
      chart.replaceChildren(h("div", { class: "chart-empty" }, answer.data.detail));
      return;
    }
    planGantts[row.plan] = "done";
    const t = answer.data;
    const stages = [];
    for (const r of t.rows) (stages[r.stage] = stages[r.stage] || { devices: [] }).devices.push(r.device);
    const names = Object.assign({}, labels);
    t.rows.forEach(function (r) { names[r.device] = r.label; });
    const gantt = EP.charts.stageRows(stages, names, []);
    const rows = {};
    const rowLabels = {};
    gantt.forEach(function (r, i) { rows[r.device] = i; rowLabels[r.device] = r.label; });
    const px = EP.charts.rowHeight(gantt.length);
    const traces = EP.charts.ganttTraces(t.events, rows, { rowPx: px, labels: rowLabels });
    const layout = EP.charts.ganttLayout(gantt, { height: px * gantt.length + 60, legend: false,
                                                  width: chart.clientWidth });
    layout.margin.b = 30;
    layout.xaxis.title.text = EP.plural(t.batches, "batch", "batches") + " · " +
      EP.plural(t.microbatches, "micro-batch", "micro-batches") + " · " +
      fmt.num(t.throughput_sps) + " samples/s simulated";
    Plotly.react(chart, traces, layout, Object.assign({}, EP.plotConfig, { displayModeBar: false }));
  }

  /* ---------------------------------------------------------------- training curves */

  function trainingSummary(plan) {
    const t = plan.training;
    const n = episodesOf(plan);
    let best = null;
    for (let i = n - 1; i >= 0 && best === null; i -= 1) best = t.best_reward[i];
    const text = plan.status === "running" ? "episode " + t.episodes[n - 1] : EP.plural(n, "episode");
    return text + (best === null ? " · nothing fits yet" : " · best step " + fmt.seconds(best * best));
  }

  function renderTrainings() {
    const box = $("plan-trainings");
    const learned = R.snap.plans.filter(function (p) { return episodesOf(p) > 0; });
    $("plan-trainings-box").hidden = learned.length === 0;
    const current = new Set(learned.map(function (p) { return String(p.id); }));
    for (const card of Array.from(box.children)) {
      if (!current.has(card.getAttribute("data-plan"))) {
        delete trainingDrawn[card.getAttribute("data-plan")];
        card.remove();
      }
    }
    for (const plan of learned) {
      const drawn = plan.status + ":" + episodesOf(plan);
      if (trainingDrawn[plan.id] === drawn) continue;
      trainingDrawn[plan.id] = drawn;
      let card = box.querySelector('[data-plan="' + plan.id + '"]');
      if (!card) {
        card = h("div", { class: "plan-gantt plan-training", "data-plan": plan.id },
          h("h3", null, h("span", null, plan.algorithm), h("span", { class: "muted small" })),
          h("div", { class: "chart" }));
        box.append(card);
      }
      card.querySelector("h3 .muted").textContent = trainingSummary(plan);
      const traces = EP.charts.trainingTraces(plan.training);
      Plotly.react(card.querySelector(".chart"), traces,
        EP.charts.trainingLayout({ traces: traces, uirevision: "training-" + plan.id }),
        Object.assign({}, EP.plotConfig, { displayModeBar: false }));
    }
  }

  R.renderPlans = renderPlans;
})();
