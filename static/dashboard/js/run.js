/* The run page: connects to ws/runs/<id>/, holds the snapshot brought forward by the deltas
   (EdgePipe.live.applyRun, the same rule as the server), and redraws what changed at most
   four times a second with Plotly.react. While the run is planning in the embedded setup
   (whose in-memory channel layer does not carry the planning worker's events) it asks for a
   snapshot every 2 s. A learned planner (TAPP) saves its training curve on its plan as it
   learns; the page draws it from the plan events or those snapshots. The Gantts have a row
   per device in pipeline order, a stage's replicas side by side: the stages of the newest
   re-partition, else of the chosen plan (its layout: fetched with the plans' comparison).
   The devices table's status and the throughput chart's predicted line follow the fault
   events, noted one by one as they arrive. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const h = EP.h;
  const fmt = EP.fmt;
  const cfg = EP.readJSON("run-config");
  const RENDER_EVERY_MS = 250;
  const POLL_PLANNING_MS = 2000;
  const ACTIVE = ["starting", "running", "recovering", "paused"];
  const TERMINAL = ["finished", "cancelled"];

  const labels = {}; // uid -> name
  cfg.devices.forEach(function (d) { labels[d.device] = d.label; });
  const layouts = {}; // plan id -> its layout (stages, groups, betas, notes)
  cfg.layouts.forEach(function (l) { layouts[l.plan] = l; });

  let snap = null;
  const dirty = new Set();
  const view = { span: "auto", follow: true, userRange: null };
  const ghosts = { plan: null, lo: 0, hi: -1, events: [], loading: false, error: "" };
  const planGantts = {}; // plan id -> "loading" | "done" | error text
  const trainingDrawn = {}; // plan id -> what its training chart shows (status and episodes)
  let compareKey = "";
  let lastCompare = null;
  /* What the fault events say, kept event by event (a snapshot starts them again), so that a
     redraw never walks every fault: each device's newest loss or return, and the throughput
     each re-partition predicts, in time order. */
  const membership = {}; // uid -> {at, kind} of its newest device_lost or device_joined
  let predictions = []; // [{at, sps}]

  const $ = function (id) { return document.getElementById(id); };

  /* ---------------------------------------------------------------- the live connection */

  function onMessage(msg) {
    if (msg.type === "snapshot") {
      snap = msg;
      EP.runPage.snapshots += 1;
      for (const uid of Object.keys(membership)) delete membership[uid];
      predictions = [];
      noteFaults(snap.faults);
      ["run", "plans", "timeline", "metrics", "faults", "idle", "devices", "prediction"].forEach(function (k) {
        dirty.add(k);
      });
    } else if (EP.live.RUN_DELTAS.indexOf(msg.type) >= 0) {
      if (!snap) return; // a delta before the first snapshot: the snapshot will include it
      snap = EP.live.applyRun(snap, msg);
      dirty.add(msg.type === "plan" ? "plans" : msg.type);
      // the run carries its devices' status and its chosen plan; a plan, its prediction
      if (msg.type === "run") ["plans", "devices", "prediction"].forEach(function (k) { dirty.add(k); });
      if (msg.type === "plan") dirty.add("prediction");
      if (msg.type === "faults") noteFaults(msg.events);
    } else if (msg.type === "error") {
      EP.toast(msg.detail, "error");
      return;
    } else {
      return;
    }
    render();
  }

  const socket = new EP.LiveSocket(cfg.ws_path, {
    onMessage: onMessage,
    onStatus: EP.showConnection($("conn")),
  });

  setInterval(function () {
    if (cfg.embedded && snap && snap.run.state === "planning") socket.send({ type: "snapshot" });
  }, POLL_PLANNING_MS);

  EP.runPage = {
    state: function () { return snap; },
    rows: function () { return snap ? ganttRows().rows : []; },
    socket: socket,
    renders: 0,
    snapshots: 0,
  };

  const render = EP.throttle(function () {
    if (!snap) return;
    EP.runPage.renders += 1;
    const what = new Set(dirty);
    dirty.clear();
    if (what.has("run")) renderRun();
    if (what.has("run") || what.has("faults") || what.has("layouts")) renderPipeline();
    if (what.has("plans") || what.has("run")) renderPlans();
    if (what.has("timeline") || what.has("faults") || what.has("run") || what.has("layouts")) renderGantt();
    if (what.has("idle") || what.has("layouts")) renderIdle();
    if (what.has("metrics") || what.has("prediction")) renderMetrics();
    if (what.has("faults")) renderFaults();
    if (what.has("devices")) renderDeviceStatus();
    // an unfinished recovery's bar grows with the run's clock
    if (what.has("faults") || (what.has("timeline") && recoveryUnderWay)) renderRecoveries();
  }, RENDER_EVERY_MS);

  /* ---------------------------------------------------------------- run state and controls */

  const CONTROLS = {
    plan: ["draft", "planned", "failed"],
    start: ["planned"],
    pause: ["running", "recovering"],
    resume: ["paused"],
    stop: ["draft", "planning", "planned", "starting", "running", "recovering", "paused"],
  };

  function renderRun() {
    const run = snap.run;
    const badge = $("run-state");
    badge.className = "badge badge-" + run.state;
    badge.textContent = run.state;
    const error = $("run-error");
    error.hidden = !run.error;
    error.textContent = run.error ? run.error : "";
    for (const button of document.querySelectorAll("[data-action]")) {
      const action = button.getAttribute("data-action");
      button.hidden = CONTROLS[action].indexOf(run.state) < 0;
    }
    $("plan-label").textContent = run.state === "draft" ? "Plan" : "Plan again";
    $("export-plan").classList.toggle("disabled", !run.chosen_plan && !snap.plans.some(isUsable));
  }

  function isUsable(p) { return p.status === "done" && p.memory_ok; }

  async function act(action, body) {
    const url = cfg.urls[action === "resume" ? "start" : action];
    const buttons = document.querySelectorAll("[data-action], [data-start-plan]");
    buttons.forEach(function (b) { b.disabled = true; });
    const answer = await EP.api("POST", url, body || {});
    buttons.forEach(function (b) { b.disabled = false; });
    if (!answer.ok) {
      EP.toast((answer.data && answer.data.detail) || ("the server answered " + answer.status), "error");
      return;
    }
    onMessage({ type: "run", run: answer.data });
    EP.toast({ plan: "Planning started", start: "Starting the run", pause: "Paused", resume: "Resumed",
               stop: "Stopped" }[action]);
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("[data-action], [data-start-plan]");
    if (!button) return;
    const action = button.getAttribute("data-action") || "start";
    if (action === "stop" && !window.confirm("Stop this run? It cannot be restarted.")) return;
    const plan = button.getAttribute("data-start-plan");
    act(action, plan ? { plan: Number(plan) } : {});
  });

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
    const plans = snap.plans;
    $("plans-empty").hidden = plans.length > 0;
    $("plans-body").hidden = plans.length === 0;
    renderTrainings();
    const key = JSON.stringify(plans.map(function (p) {
      return [p.id, p.status, p.attempts, (p.interruptions || []).length];
    })) + snap.run.state +
      snap.run.chosen_plan;
    if (plans.length === 0) return;
    if (key === compareKey) {
      if (lastCompare && plans.some(isTraining)) renderCompare(lastCompare);
      return;
    }
    compareKey = key;
    const answers = await Promise.all([EP.api("GET", cfg.urls.compare), EP.api("GET", cfg.urls.layouts)]);
    const answer = answers[0];
    if (answers[1].ok) {
      for (const id of Object.keys(layouts)) delete layouts[id];
      answers[1].data.layouts.forEach(function (l) { layouts[l.plan] = l; });
      dirty.add("layouts");
      render();
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

  /* the stages the devices serve now: the newest re-partition's (a recovery or a dynamic
     re-partition deploys them), else the chosen plan's; null before a plan is chosen */
  function currentStages() {
    for (let i = snap.faults.length - 1; i >= 0; i -= 1) {
      const f = snap.faults[i];
      if (f.kind === "repartitioned" && f.detail && Array.isArray(f.detail.stages)) {
        return { stages: f.detail.stages, source: "re-partition" + (f.detail.generation === undefined
          ? "" : " (gen " + f.detail.generation + ")") };
      }
    }
    const layout = layouts[snap.run.chosen_plan];
    if (!layout) return null;
    return { stages: layout.stages.map(function (st) {
      return { devices: st.devices.map(function (d) { return d.device; }), layers: st.layers };
    }), source: layout.algorithm + " plan" };
  }

  /* the live Gantt's rows (and the idle chart's order) and each device's row */
  function ganttRows() {
    const current = currentStages();
    const seen = new Set();
    for (const e of snap.timeline) if (!(e.device in labels)) seen.add(e.device);
    const rows = EP.charts.stageRows(current && current.stages, labels,
      cfg.devices.map(function (d) { return d.device; }), Array.from(seen));
    const index = {};
    const rowLabels = {};
    rows.forEach(function (r, i) { index[r.device] = i; rowLabels[r.device] = r.label; });
    return { rows: rows, index: index, labels: rowLabels, source: current && current.source };
  }

  function groupText(stage) {
    return (stage.devices || []).map(function (u) { return labels[u] || u; }).join(" + ");
  }

  /* the pipeline strip under the run's name: the current stages and their groups, else the
     devices in the run's order */
  function renderPipeline() {
    const box = $("pipeline");
    const current = currentStages();
    box.replaceChildren();
    $("pipeline-label").textContent = current ? "Pipeline (" + current.source + ")" : "Devices";
    const parts = current
      ? current.stages.map(function (st, k) {
        const n = (st.devices || []).length;
        return h("span", { class: "tag" + (n > 1 ? " tag-group" : ""), "data-stage": k },
          "stage " + k + " · " + groupText(st) + (n > 1 ? " (" + n + " replicas)" : ""));
      })
      : cfg.devices.map(function (d, k) { return h("span", { class: "tag" }, k + " · " + d.label); });
    parts.forEach(function (part, i) {
      if (i) box.append(h("span", { class: "muted" }, " → "));
      box.append(part);
    });
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
    snap.plans.forEach(function (p) { byId[p.id] = p; });
    const why = $("plans-why");
    why.hidden = !compare.reason;
    why.textContent = compare.reason;
    const body = $("plans-table");
    body.replaceChildren();
    const canStart = snap.run.state === "planned";
    for (const row of compare.rows) {
      const plan = byId[row.plan] || {};
      const best = row.plan === compare.best;
      const chosen = row.plan === snap.run.chosen_plan;
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
      const layout = layouts[row.plan];
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
    const learned = snap.plans.filter(function (p) { return episodesOf(p) > 0; });
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
    const n = snap.timeline.length;
    if (n <= MAX_BARS) return snap.window_s;
    return Math.min(snap.window_s, niceCeil(Math.max(0.1, hi - snap.timeline[n - MAX_BARS].start)));
  }

  function timelineRange() {
    let hi = 0;
    for (const e of snap.timeline) if (e.end > hi) hi = e.end;
    const span = spanSeconds(hi);
    const lo = Math.max(0, hi - span);
    return [lo, Math.max(hi, lo + Math.min(1, span))];
  }

  async function loadGhosts(lo, hi) {
    const plan = snap.run.chosen_plan;
    if (!plan || ghosts.loading) return;
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
    dirty.add("timeline");
    render();
  }

  function renderGantt() {
    const chart = $("gantt");
    const empty = $("gantt-empty");
    const hasData = snap.timeline.length > 0;
    empty.hidden = hasData;
    chart.hidden = !hasData;
    $("gantt-tools").hidden = !hasData;
    if (!hasData) return;
    const range = view.follow ? timelineRange() : view.userRange;
    loadGhosts(range[0], range[1]);
    const gantt = ganttRows();
    const px = EP.charts.rowHeight(gantt.rows.length);
    const opts = { rowPx: px, labels: gantt.labels, xmin: range[0], xmax: range[1] };
    const traces = EP.charts.ganttTraces(ghosts.events, gantt.index, Object.assign({ ghost: true }, opts))
      .concat(EP.charts.ganttTraces(snap.timeline, gantt.index, opts));
    const layout = EP.charts.ganttLayout(gantt.rows, {
      height: px * gantt.rows.length + 90, xrange: range, uirevision: "live", width: chart.clientWidth,
    });
    const marks = snap.faults.filter(function (f) { return f.at >= range[0] && f.at <= range[1]; });
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
    $("ghost-note").textContent = ghosts.error ? "planned bars unavailable: " + ghosts.error
      : snap.run.chosen_plan ? "faint bars: the chosen plan, as simulated from the first measured event"
        : "";
    Plotly.react(chart, traces, layout, EP.plotConfig).then(bindGanttZoom);
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

  function shortened(text, chars) { return text.length > chars ? text.slice(0, chars - 1) + "…" : text; }

  function markStyle(kind) { return MARK_STYLES[kind] || { color: "#64748b", dash: "dot" }; }

  function markLabel(f) {
    const d = f.detail || {};
    if (f.kind === "device_lost") return "lost " + shortened(labels[f.device] || f.device || "a device", MARK_NAME_CHARS);
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
    const other = EP.charts.flowOf(e, snap.timeline);
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
    const arrow = flow ? [EP.charts.flowArrow(flow.send, flow.recv, ganttRows().index)] : [];
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
      if (ev["xaxis.range[0]"] !== undefined) {
        view.follow = false;
        view.userRange = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
        $("follow").hidden = false;
      } else if (ev["xaxis.autorange"]) {
        view.follow = true;
        $("follow").hidden = true;
        dirty.add("timeline");
        render();
      }
    });
  }

  $("follow").addEventListener("click", function () {
    view.follow = true;
    $("follow").hidden = true;
    dirty.add("timeline");
    render();
  });
  $("span").addEventListener("change", function (ev) {
    view.span = ev.target.value;
    view.follow = true;
    $("follow").hidden = true;
    dirty.add("timeline");
    render();
  });

  /* ---------------------------------------------------------------- idle breakdown */

  function renderIdle() {
    const idle = snap.idle;
    const devices = Object.keys(idle.devices);
    $("idle-empty").hidden = devices.length > 0;
    $("idle").hidden = devices.length === 0;
    if (!devices.length) return;
    const gantt = ganttRows();
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

  /* the notes of each re-partition's predicted throughput, in time order (a delta may repeat
     what the snapshot holds), and of each device's newest loss or return (on a tie in time,
     the loss: the order the server sorts faults in) */
  function noteFaults(faults) {
    for (const f of faults) {
      const detail = f.detail || {};
      if (f.kind === "repartitioned" && typeof detail.predicted_throughput_sps === "number") {
        let i = predictions.length;
        while (i > 0 && predictions[i - 1].at > f.at) i -= 1;
        const twin = i > 0 && predictions[i - 1].at === f.at && predictions[i - 1].sps === detail.predicted_throughput_sps;
        if (!twin) predictions.splice(i, 0, { at: f.at, sps: detail.predicted_throughput_sps });
        dirty.add("prediction");
      } else if ((f.kind === "device_lost" || f.kind === "device_joined") && f.device) {
        const last = membership[f.device];
        if (!last || f.at > last.at || (f.at === last.at && f.kind > last.kind)) {
          membership[f.device] = { at: f.at, kind: f.kind };
          dirty.add("devices");
        }
      }
    }
  }

  /* the throughput the chosen plan predicts, null before one is chosen (or computed) */
  function chosenPrediction() {
    const id = snap.run.chosen_plan;
    const plan = id === null ? null : snap.plans.find(function (p) { return p.id === id; });
    return plan && typeof plan.throughput_sps === "number" ? plan.throughput_sps : null;
  }

  /* The throughput predicted for the plan being trained from x0 to x1 s, as a step line: the
     chosen plan's, then from each re-partition on, its new plan's. */
  function predictedTrace(x0, x1) {
    // the first re-partition after x0 (binary search: there may be one every few batches)
    let lo = 0;
    let hi = predictions.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (predictions[mid].at <= x0) lo = mid + 1; else hi = mid;
    }
    let value = lo > 0 ? predictions[lo - 1].sps : chosenPrediction();
    const x = [];
    const y = [];
    if (value !== null) { x.push(x0); y.push(value); }
    for (let i = lo; i < predictions.length && predictions[i].at <= x1; i += 1) {
      value = predictions[i].sps;
      x.push(predictions[i].at);
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
    const points = snap.metrics;
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
      .concat(lineTraces(series(points, "accuracy", 1), "accuracy", "y2", "dot"));
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

  /* ---------------------------------------------------------------- faults */

  function renderFaults() {
    const body = $("faults");
    const faults = snap.faults;
    $("faults-empty").hidden = faults.length > 0;
    $("faults-table").hidden = faults.length === 0;
    $("faults-count").textContent = faults.length ? EP.plural(faults.length, "event") : "";
    body.replaceChildren();
    for (let i = faults.length - 1; i >= 0; i -= 1) {
      const f = faults[i];
      const keys = f.detail ? Object.keys(f.detail) : [];
      body.append(h("tr", null,
        h("td", { class: "at" }, f.at.toFixed(3) + " s"),
        h("td", { class: "kind-" + f.kind }, f.kind.replace(/_/g, " ")),
        h("td", null, f.device ? (labels[f.device] || f.device) : "run"),
        h("td", { class: "detail small", title: keys.length ? JSON.stringify(f.detail, null, 1) : null },
          detailView(f.detail, keys))));
    }
  }

  const SHORT_JSON = 60;

  /* a value of a fault's detail in words: device uids by name, a plan's stages as its
     pipeline, anything else nested as JSON cut short (the cell's title holds it whole) */
  function detailValue(key, value) {
    if (value === null || value === undefined) return "–";
    if (key === "stages" && Array.isArray(value)) {
      return value.map(function (st) {
        if (!st || typeof st !== "object") return String(st);
        return groupText(st) + (Array.isArray(st.layers) ? " [" + st.layers.join("–") + "]" : "");
      }).join(" → ");
    }
    if (typeof value === "string") return labels[value] || value;
    if (Array.isArray(value) && value.every(function (v) { return typeof v !== "object" || v === null; })) {
      return value.length ? value.map(function (v) { return labels[v] || String(v); }).join(", ") : "none";
    }
    if (typeof value !== "object") return String(value);
    return shortened(JSON.stringify(value), SHORT_JSON);
  }

  function detailView(detail, keys) {
    const box = h("span");
    keys.forEach(function (key, i) {
      if (i) box.append(h("span", { class: "muted" }, " · "));
      box.append(h("span", { class: "kv" }, h("span", { class: "muted" }, key + ": "), detailValue(key, detail[key])));
    });
    return box;
  }
  /* ---------------------------------------------------------------- recoveries */

  const PHASES = [
    { key: "replanning_s", from: "detected_s", to: "replanned_s", label: "lost (or decided) → re-planned", color: "#dc2626" },
    { key: "redistributing_s", from: "replanned_s", to: "weights_moved_s", label: "re-planned → weights moved", color: "#7c3aed" },
    { key: "resuming_s", from: "weights_moved_s", to: "resumed_s", label: "weights moved → resumed", color: "#16a34a" },
  ];

  /* where a phase starts: the first from the loss, or for a dynamic re-partition from its
     decision (as fault_recoveries measures replanning_s) */
  function phaseStart(r, phase) {
    if (phase.key === "replanning_s" && r.detected_s === null) return r.started_s;
    return r[phase.from];
  }

  function faint(hex) {
    const n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + ",0.35)";
  }

  function newestTime() {
    let hi = 0;
    for (const e of snap.timeline) if (e.end > hi) hi = e.end;
    for (const f of snap.faults) if (f.at > hi) hi = f.at;
    return hi;
  }

  function deviceNames(uids) {
    return uids.map(function (u) { return labels[u] || u; }).join(", ");
  }

  function recoveryLabel(r, i) {
    const head = r.generation === null ? "#" + (i + 1) : "gen " + r.generation;
    return head + " · " + (r.cause === "failure" ? "lost " + (deviceNames(r.lost) || "?") : "dynamic");
  }

  function atText(t, since) {
    if (t === null) return "–";
    return t.toFixed(3) + " s" + (since === null || since === undefined ? "" : " (+" + fmt.seconds(since) + ")");
  }

  function breakEven(r) {
    if (r.saved_s === null && r.cost_s === null) return null;
    const saved = r.saved_s === null ? "?" : fmt.seconds(r.saved_s);
    const cost = r.cost_s === null ? "?" : fmt.seconds(r.cost_s);
    const worth = r.saved_s !== null && r.cost_s !== null ? (r.saved_s > r.cost_s ? " > " : " ≤ ") : " vs ";
    return h("span", { class: r.moved ? "break-even moved" : "break-even skipped" },
      "saves " + saved + worth + "costs " + cost + ": " + (r.moved ? "moved" : "skipped"));
  }

  function newPlan(r) {
    if (r.phase === "skipped") {
      if (r.predicted_throughput_sps === null) return null;
      return "a new plan predicted " + fmt.num(r.predicted_throughput_sps) + " samples/s" +
        (r.measured_throughput_sps === null ? "" : " against " + fmt.num(r.measured_throughput_sps) + " measured");
    }
    if (!r.stages && !r.planner && r.predicted_throughput_sps === null) return null;
    const parts = [];
    if (r.planner) parts.push(r.planner);
    if (r.stages) {
      parts.push(r.stages.map(function (st) {
        return groupText(st) + (st.layers ? " [" + st.layers.join("–") + "]" : "");
      }).join(" → "));
    }
    if (r.predicted_throughput_sps !== null) parts.push(fmt.num(r.predicted_throughput_sps) + " samples/s predicted");
    return parts.join(" · ");
  }

  function phaseBadge(r) {
    const text = { detected: "detected", started: "halting", replanned: "re-planned", weights_moved: "weights moved",
                   resumed: "resumed", failed: "failed", skipped: "skipped" }[r.phase];
    const cls = r.phase === "resumed" ? "done" : r.phase === "failed" ? "failed" : r.phase === "skipped" ? "draft" : "running";
    return h("span", { class: "badge badge-" + cls, title: r.error || "" }, text);
  }

  let recoveryUnderWay = false;
  const MAX_CHECK_ROWS = 5;

  function renderRecoveries() {
    const list = EP.faults.recoveries(snap.faults);
    EP.runPage.recoveries = list;
    recoveryUnderWay = list.some(function (r) {
      return ["detected", "started", "replanned", "weights_moved"].indexOf(r.phase) >= 0;
    });
    $("recoveries-empty").hidden = list.length > 0;
    $("recoveries-body").hidden = list.length === 0;
    renderLostDevices(list);
    if (!list.length) return;
    const failures = list.filter(function (r) { return r.cause === "failure"; }).length;
    const moved = list.filter(function (r) { return r.cause === "dynamic" && r.moved; }).length;
    const skipped = list.length - failures - moved;
    $("recoveries-hint").textContent = EP.plural(failures, "recovery", "recoveries") + " · " +
      EP.plural(moved, "dynamic re-partition") + " · " + skipped + " skipped";
    const table = $("recoveries-table");
    for (const old of Array.from(table.tBodies)) old.remove();
    // every recovery and re-partition; of the checks that kept the plan (one every
    // repartition_every batches), the newest few (the chart shows them all)
    const checks = list.filter(function (r) { return !r.moved; });
    const shown = new Set(checks.slice(-MAX_CHECK_ROWS));
    if (checks.length > shown.size) {
      const hidden = checks.length - shown.size;
      table.append(h("tbody", { class: "more" }, h("tr", null, h("td", { colspan: 9, class: "small muted" },
        EP.plural(hidden, "earlier check") + " kept the plan (each on the chart above)"))));
    }
    list.forEach(function (r, i) {
      if (!r.moved && !shown.has(r)) return;
      const moved = r.bytes_moved === null ? null : fmt.bytes(r.bytes_moved) +
        (r.transfers === null ? "" : " in " + EP.plural(r.transfers, "transfer"));
      const plan = newPlan(r);
      const worth = breakEven(r);
      // one tbody per recovery: its phases, then what it moved to (and why, for a dynamic one)
      table.append(h("tbody", { "data-recovery": i, "data-phase": r.phase, "data-cause": r.cause },
        h("tr", null,
          h("td", { class: "nowrap" }, r.generation === null ? "–" : "gen " + r.generation, " ", phaseBadge(r),
            h("div", { class: "muted small" }, r.cause === "failure" ? "lost device" : r.moved ? "dynamic re-partition" : "dynamic check")),
          h("td", null, r.losses.length ? r.losses.map(function (x) {
            return (labels[x.device] || x.device) + (x.detected_by ? " (" + x.detected_by + ")" : "");
          }).join(", ") : "–"),
          h("td", { class: "num" }, atText(r.detected_s)),
          h("td", { class: "num" }, r.phase === "skipped" ? atText(r.replanned_s) + " (kept)" : atText(r.replanned_s, r.replanning_s)),
          h("td", { class: "num" }, atText(r.weights_moved_s, r.redistributing_s),
            moved ? h("div", { class: "muted small" }, moved) : null),
          h("td", { class: "num" }, atText(r.resumed_s, r.resuming_s)),
          h("td", { class: "num" }, fmt.seconds(r.recovery_s)),
          h("td", { class: "num" }, r.resume_microbatch === null ? "–" : "micro-batch " + r.resume_microbatch),
          h("td", { class: "num" }, r.microbatches_redone === null ? "–" : String(r.microbatches_redone))),
        plan || worth || r.error ? h("tr", { class: "sub" }, h("td", { colspan: 9, class: "small" },
          plan ? h("span", null, h("span", { class: "muted" }, r.phase === "skipped" ? "checked: " : "new plan: "), plan) : null,
          plan && worth ? h("span", { class: "muted" }, " · ") : null,
          worth ? h("span", null, h("span", { class: "muted" }, "break-even: "), worth) : null,
          r.error ? h("div", { class: "field-error" }, r.error) : null)) : null));
    });
    renderRecoveryChart(list);
  }

  /* one row per recovery or dynamic re-partition, its phases as stacked bars on the run's
     clock (an unfinished phase drawn faint up to now); the skipped checks as points on one
     row, each with its break-even */
  function renderRecoveryChart(list) {
    const rows = [];
    const plain = [];
    const moves = list.filter(function (r) { return r.moved; });
    // category labels are markup to Plotly: escaped (device names are anyone's text)
    moves.forEach(function (r) { plain.push(recoveryLabel(r, list.indexOf(r))); });
    plain.forEach(function (label) { rows.push(EP.esc(label)); });
    const now = newestTime();
    const traces = PHASES.map(function (phase) {
      const trace = { type: "bar", orientation: "h", name: phase.label, x: [], base: [], y: [], text: [],
                      marker: { color: [], line: { width: 0 } }, hovertemplate: "%{text}<extra></extra>",
                      textposition: "none" };
      moves.forEach(function (r, i) {
        const start = phaseStart(r, phase);
        if (start === null) return;
        const end = r[phase.to];
        const open = end === null && r.phase !== "failed";
        if (end === null && !open) return;
        const stop = end === null ? Math.max(now, start) : end;
        const last = PHASES.find(function (p) { return phaseStart(r, p) !== null && r[p.to] === null; });
        if (open && last !== phase) return;
        trace.x.push(Math.max(stop - start, 1e-3));
        trace.base.push(start);
        trace.y.push(rows[i]);
        trace.marker.color.push(open ? faint(phase.color) : phase.color);
        trace.text.push(rows[i] + "<br>" + phase.label + ": " + (open ? "under way, " : "") +
          fmt.seconds(stop - start) + "<br>" + start.toFixed(3) + " – " + (open ? "now" : stop.toFixed(3) + " s"));
      });
      return trace;
    });
    const checks = list.filter(function (r) { return !r.moved; });
    if (checks.length) {
      const row = "dynamic checks (kept the plan)";
      rows.push(row);
      plain.push(row);
      traces.push({
        type: "scatter", mode: "markers", name: "re-partition not worth it",
        x: checks.map(function (r) { return r.replanned_s; }), y: checks.map(function () { return row; }),
        marker: { symbol: "x", size: 10, color: "#64748b" },
        text: checks.map(function (r) {
          return "saves " + fmt.seconds(r.saved_s) + ", costs " + fmt.seconds(r.cost_s) + ": skipped" +
            (r.measured_throughput_sps === null ? "" : "<br>measured " + fmt.num(r.measured_throughput_sps) + " samples/s") +
            (r.predicted_throughput_sps === null ? "" : ", predicted " + fmt.num(r.predicted_throughput_sps));
        }),
        hovertemplate: "%{text}<extra>at %{x:.3f} s</extra>",
      });
    }
    Plotly.react($("recoveries-chart"), traces, {
      barmode: "overlay", height: 110 + 34 * rows.length, font: EP.plotFont,
      margin: { l: EP.charts.labelMargin(plain, 4), r: 16, t: 8, b: 44 },
      xaxis: { title: { text: "seconds since the run started", font: { size: 11 } }, gridcolor: "#eef2f7",
               rangemode: "tozero" },
      yaxis: { autorange: "reversed", fixedrange: true, type: "category", categoryorder: "array", categoryarray: rows,
               automargin: true },
      legend: EP.legendAbove(),
      plot_bgcolor: "#fff", paper_bgcolor: "#fff", uirevision: "recoveries",
    }, Object.assign({}, EP.plotConfig, { displayModeBar: false }));
  }

  /* the devices table: when each device was lost, and when its recovery resumed */
  function renderLostDevices(list) {
    const lost = {};
    for (const r of list) {
      for (const x of r.losses) {
        lost[x.device] = "lost at " + x.detected_s.toFixed(1) + " s" + (x.detected_by ? " (" + x.detected_by + ")" : "") +
          (r.resumed_s !== null ? "; resumed without it at " + r.resumed_s.toFixed(1) + " s"
            : r.phase === "failed" ? "; the run failed" : "; recovering");
      }
    }
    for (const cell of document.querySelectorAll("[data-lost-for]")) {
      const uid = cell.getAttribute("data-lost-for");
      const back = membership[uid] && membership[uid].kind === "device_joined" ? membership[uid].at : null;
      cell.textContent = lost[uid] ? lost[uid] + (back === null ? "" : "; rejoined at " + back.toFixed(1) + " s") : "–";
      cell.classList.toggle("kind-device_lost", Boolean(lost[uid]) && back === null);
    }
  }

  /* The devices table's Status: the device's as the run last reported it, "lost" from its
     loss until it joins again (a device that joined reads online, whatever the run said of it
     before). */
  function renderDeviceStatus() {
    const reported = {};
    for (const d of cfg.devices) reported[d.device] = d.status;
    for (const d of snap.run.devices || []) reported[d.uid] = d.status;
    for (const cell of document.querySelectorAll("[data-status-for]")) {
      const uid = cell.getAttribute("data-status-for");
      const last = membership[uid];
      let status = reported[uid];
      if (last && last.kind === "device_lost") status = "lost";
      else if (last && status === "offline") status = "online";
      const badge = EP.badge(status);
      if (last) badge.title = (last.kind === "device_lost" ? "lost at " : "joined again at ") + last.at.toFixed(1) + " s";
      cell.replaceChildren(badge);
    }
  }

  /* ---------------------------------------------------------------- fault injection */

  /* Stop agent (fault injection) and Restart agent (the demo's supervisor starts it again) */
  document.addEventListener("click", async function (event) {
    const button = event.target.closest("[data-stop-agent], [data-restart-agent]");
    if (!button) return;
    const name = button.getAttribute("data-label");
    const restart = button.hasAttribute("data-restart-agent");
    if (!restart && !window.confirm("Stop the agent of " + name + "? Its process exits at once, as if the device lost " +
                                    "power; a run it trains in recovers without it (or fails).")) return;
    button.disabled = true;
    const url = restart ? cfg.urls.restart_agent.replace("{id}", button.getAttribute("data-restart-agent"))
      : cfg.urls.stop_agent.replace("{id}", button.getAttribute("data-stop-agent"));
    const answer = await EP.api("POST", url);
    button.disabled = false;
    const notice = $("device-notice");
    notice.hidden = false;
    if (!answer.ok) {
      const detail = (answer.data && answer.data.detail) || ("the server answered " + answer.status);
      notice.className = "notice error";
      notice.textContent = detail;
      EP.toast(detail, "error");
      return;
    }
    const text = restart ? "Asked the demo to start " + name + "'s agent again: it reconnects in a few seconds, " +
      "and a run it left takes it back at its next re-partition."
      : "Sent exit to " + name + "'s agent (command " + answer.data.command + "): it stops at once.";
    notice.className = "notice";
    notice.textContent = text;
    EP.toast(text);
  });
})();
