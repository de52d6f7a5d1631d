/* The run page: connects to ws/runs/<id>/, holds the snapshot brought forward by the deltas
   (EdgePipe.live.applyRun, the same rule as the server) and every timeline event it got
   (R.store, for the live Gantt, which draws new events on the next frame), and redraws what
   else changed at most four times a second with Plotly.react. While the run is planning in
   the embedded setup (whose in-memory channel layer does not carry the planning worker's
   events) it asks for a snapshot every 2 s. Also here: the run's controls, the pipeline
   strip, the Gantts' rows (a row per device in pipeline order, a stage's replicas side by
   side: the stages of the newest re-partition, else of the chosen plan) and the notes kept of
   the fault events one by one as they arrive (each device's membership, each re-partition's
   predicted throughput).

   The page's parts share one namespace, EdgePipe.run (this file's state, and the renderers
   the other files add): run_plans.js (plans, their comparison, planned Gantts, training
   curves), run_gantt.js (the live Gantt), run_metrics.js (idle time, throughput, loss and
   accuracy), run_recoveries.js (faults, recoveries, the devices table). This file is loaded
   first; the connection opens once every part is loaded (DOMContentLoaded). */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const RENDER_EVERY_MS = 250;
  const POLL_PLANNING_MS = 2000;

  const R = (EP.run = {
    cfg: EP.readJSON("run-config"),
    labels: {}, // uid -> name
    layouts: {}, // plan id -> its layout (stages, groups, betas, notes)
    snap: null,
    dirty: new Set(),
    /* What the fault events say, kept event by event (a snapshot starts them again), so that
       a redraw never walks every fault: each device's newest loss or return, and the
       throughput each re-partition predicts, in time order. */
    membership: {}, // uid -> {at, kind} of its newest device_lost or device_joined
    predictions: [], // [{at, sps}]
    recoveryUnderWay: false, // run_recoveries.js: an unfinished recovery's bar grows with time
    resyncing: false, // a fresh snapshot asked for after a gap in the events' numbers
    // every timeline event the page got (the live Gantt's: timeline_store.js)
    store: new EP.TimelineStore(),
    $: function (id) { return document.getElementById(id); },
  });
  const h = EP.h;
  const cfg = R.cfg;
  const labels = R.labels;
  const layouts = R.layouts;
  const dirty = R.dirty;
  const membership = R.membership;
  const $ = R.$;
  cfg.devices.forEach(function (d) { labels[d.device] = d.label; });
  cfg.layouts.forEach(function (l) { layouts[l.plan] = l; });

  /* ---------------------------------------------------------------- the live connection */

  function onMessage(msg) {
    if (msg.type === "timeline") EP.runPage.timelineDeltas += 1;
    if (msg.type === "snapshot") {
      R.snap = msg;
      R.resyncing = false;
      R.store.snapshot(msg.timeline);
      EP.runPage.snapshots += 1;
      for (const uid of Object.keys(membership)) delete membership[uid];
      R.predictions = [];
      noteFaults(msg.faults);
      ["run", "plans", "timeline", "metrics", "faults", "idle", "devices", "prediction"].forEach(function (k) {
        dirty.add(k);
      });
    } else if (EP.live.RUN_DELTAS.indexOf(msg.type) >= 0) {
      if (!R.snap) return; // a delta before the first snapshot: the snapshot will include it
      // a number skipped: the channel layer dropped an event; a fresh snapshot has it (one
      // asked for at a time: the deltas meanwhile are applied, none is lost), and the event
      // store fetches the timeline events it missed (noted before this delta's are added)
      if (EP.live.gap(R.snap, msg)) {
        R.store.gapSeen();
        if (!R.resyncing && EP.runPage.socket) {
          R.resyncing = true;
          EP.runPage.gaps += 1;
          EP.runPage.socket.send({ type: "snapshot" });
        }
      }
      R.snap = EP.live.applyRun(R.snap, msg);
      // the live Gantt draws new events on the next frame, not with the other charts
      if (msg.type === "timeline" && R.store.add(msg.events) && R.ganttFrame) R.ganttFrame();
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

  R.onMessage = onMessage;

  EP.runPage = {
    state: function () { return R.snap; },
    rows: function () { return R.snap ? ganttRows().rows : []; },
    socket: null, // open once every part of the page is loaded
    renders: 0,
    frames: 0, // the live Gantt's (run_gantt.js)
    timelineDeltas: 0, // timeline deltas received
    onFrame: null, // bench/live.py's: called after each frame of the live Gantt, {ms, received}
    snapshots: 0,
    gaps: 0, // events found missing (a fresh snapshot was asked for each time)
  };

  function connect() {
    const socket = new EP.LiveSocket(cfg.ws_path, {
      onMessage: onMessage,
      onStatus: EP.showConnection($("conn")),
    });
    EP.runPage.socket = socket;
    setInterval(function () {
      if (cfg.embedded && R.snap && R.snap.run.state === "planning") socket.send({ type: "snapshot" });
    }, POLL_PLANNING_MS);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", connect);
  else connect();

  const render = (R.render = EP.throttle(function () {
    if (!R.snap) return;
    EP.runPage.renders += 1;
    const what = new Set(dirty);
    dirty.clear();
    if (what.has("run")) renderRun();
    if (what.has("run") || what.has("faults") || what.has("layouts")) renderPipeline();
    if (what.has("plans") || what.has("run")) R.renderPlans();
    if (what.has("faults") || what.has("run") || what.has("layouts")) R.renderGantt();
    else if (what.has("timeline")) R.ganttFrame();
    if (what.has("idle") || what.has("layouts")) R.renderIdle();
    if (what.has("metrics") || what.has("prediction")) R.renderMetrics();
    if (what.has("faults")) R.renderFaults();
    if (what.has("devices")) R.renderDeviceStatus();
    // an unfinished recovery's bar grows with the run's clock
    if (what.has("faults") || (what.has("timeline") && R.recoveryUnderWay)) R.renderRecoveries();
  }, RENDER_EVERY_MS));

  /* ---------------------------------------------------------------- run state and controls */

  const CONTROLS = {
    plan: ["draft", "planned", "failed"],
    start: ["planned"],
    pause: ["running", "recovering"],
    resume: ["paused"],
    stop: ["draft", "planning", "planned", "starting", "running", "recovering", "paused"],
  };

  function renderRun() {
    const run = R.snap.run;
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
    $("export-plan").classList.toggle("disabled", !run.chosen_plan && !R.snap.plans.some(isUsable));
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

  /* ---------------------------------------------------------------- pipeline and rows */

  /* the stages the devices serve now: the newest re-partition's (a recovery or a dynamic
     re-partition deploys them), else the chosen plan's; null before a plan is chosen */
  const currentStages = (R.currentStages = function () {
    for (let i = R.snap.faults.length - 1; i >= 0; i -= 1) {
      const f = R.snap.faults[i];
      if (f.kind === "repartitioned" && f.detail && Array.isArray(f.detail.stages)) {
        return { stages: f.detail.stages, source: "re-partition" + (f.detail.generation === undefined
          ? "" : " (gen " + f.detail.generation + ")") };
      }
    }
    const layout = layouts[R.snap.run.chosen_plan];
    if (!layout) return null;
    return { stages: layout.stages.map(function (st) {
      return { devices: st.devices.map(function (d) { return d.device; }), layers: st.layers,
               role: st.role };
    }), source: layout.algorithm + " plan" };
  });

  /* the live Gantt's rows (and the idle chart's order) and each device's row */
  const ganttRows = (R.ganttRows = function () {
    const current = currentStages();
    const seen = new Set();
    for (const uid of R.store.devices()) if (!(uid in labels)) seen.add(uid);
    const rows = EP.charts.stageRows(current && current.stages, labels,
      cfg.devices.map(function (d) { return d.device; }), Array.from(seen));
    const index = {};
    const rowLabels = {};
    rows.forEach(function (r, i) { index[r.device] = i; rowLabels[r.device] = r.label; });
    return { rows: rows, index: index, labels: rowLabels, source: current && current.source };
  });

  const groupText = (R.groupText = function (stage) {
    return (stage.devices || []).map(function (u) { return labels[u] || u; }).join(" + ");
  });

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
        if (st.role) {  // a split plan's row: its clients, or its helpers
          return h("span", { class: "tag tag-group", "data-stage": k }, st.role + " · " + groupText(st).replace(/ \+ /g, ", "));
        }
        return h("span", { class: "tag" + (n > 1 ? " tag-group" : ""), "data-stage": k },
          "stage " + k + " · " + groupText(st) + (n > 1 ? " (" + n + " replicas)" : ""));
      })
      : cfg.devices.map(function (d, k) { return h("span", { class: "tag" }, k + " · " + d.label); });
    const split = current && current.stages.some(function (st) { return st.role; });
    parts.forEach(function (part, i) {
      if (i) box.append(h("span", { class: "muted" }, split ? " ⇄ " : " → "));
      box.append(part);
    });
  }

  /* the notes of each re-partition's predicted throughput, in time order (a delta may repeat
     what the snapshot holds), and of each device's newest loss or return (on a tie in time,
     the loss: the order the server sorts faults in) */
  function noteFaults(faults) {
    const predictions = R.predictions;
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

  /* text cut to at most `chars` characters, an ellipsis where it was cut */
  R.shortened = function (text, chars) { return text.length > chars ? text.slice(0, chars - 1) + "…" : text; };

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
