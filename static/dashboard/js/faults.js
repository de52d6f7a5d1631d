/* A run's fault events grouped into recoveries, exactly as webapp.runs.selectors.
   fault_recoveries groups them (the browser tests compare the two on the same events): one
   entry per recovery from lost devices (cause "failure"), per dynamic re-partition (cause
   "dynamic": a recovery that lost nobody) and per skipped one (moved false, phase "skipped"),
   with the run-clock time of each phase (detected or started, replanned, weights moved,
   resumed) and the time between them. The run page holds every fault of the run, so it
   recomputes this from its snapshot. */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});

  const PHASE = { device_lost: 0, recovery_started: 1, repartition_skipped: 2, repartitioned: 2,
                  weights_redistributed: 3, recovered: 4, run_failed: 5 };

  function rank(kind) { return Object.prototype.hasOwnProperty.call(PHASE, kind) ? PHASE[kind] : 9; }

  function get(obj, key) {
    return obj[key] === undefined ? null : obj[key];
  }

  function number(value) { return typeof value === "number" ? value : null; }

  function entryOf(cause, startedS) {
    return {
      generation: null, cause: cause, moved: true, phase: "detected",
      started_s: startedS, lost: [], losses: [],
      detected_s: null, replanned_s: null, weights_moved_s: null, resumed_s: null,
      replanning_s: null, redistributing_s: null, resuming_s: null, recovery_s: null,
      planner: null, stages: null, predicted_throughput_sps: null,
      measured_throughput_sps: null, resume_microbatch: null,
      microbatches_redone: null, bytes_moved: null, transfers: null,
      weights_duration_s: null, saved_s: null, cost_s: null, error: null,
    };
  }

  function between(a, b) { return a === null || b === null ? null : b - a; }

  function durations(entry) {
    let origin = entry.detected_s;
    if (origin === null && entry.moved) origin = entry.started_s;
    entry.replanning_s = between(origin, entry.replanned_s);
    entry.redistributing_s = between(entry.replanned_s, entry.weights_moved_s);
    entry.resuming_s = between(entry.weights_moved_s, entry.resumed_s);
    if (entry.recovery_s === null) entry.recovery_s = between(origin, entry.resumed_s);
  }

  function recoveries(faults) {
    const ordered = faults.slice().sort(function (x, y) {
      return (x.at < y.at ? -1 : x.at > y.at ? 1 : 0) || rank(x.kind) - rank(y.kind);
    });
    const entries = [];
    const byGeneration = new Map();
    let current = null;

    function start(cause, at) {
      const entry = entryOf(cause, at);
      if (cause === "dynamic") entry.phase = "started";
      entries.push(entry);
      return entry;
    }
    function lose(entry, device, at, detail) {
      entry.cause = "failure";
      if (entry.phase === "started") entry.phase = "detected";
      if (entry.lost.indexOf(device) >= 0) return;
      entry.phase = "detected";
      entry.lost.push(device);
      entry.losses.push({ device: device, detected_s: at, detected_by: get(detail, "detected_by"),
                          reason: get(detail, "reason") });
      if (entry.detected_s === null || at < entry.detected_s) entry.detected_s = at;
    }
    function ofGeneration(generation) {
      if (Number.isInteger(generation) && byGeneration.has(generation)) return byGeneration.get(generation);
      return current;
    }
    function keyed(entry, generation) {
      if (Number.isInteger(generation)) {
        entry.generation = generation;
        byGeneration.set(generation, entry);
      }
    }

    for (const f of ordered) {
      const kind = f.kind;
      const at = f.at;
      const device = f.device || null;
      const detail = f.detail || {};
      if (kind === "device_lost") {
        if (current === null) current = start("failure", at);
        if (device !== null) lose(current, device, at, detail);
      } else if (kind === "recovery_started") {
        const lost = Array.isArray(detail.lost)
          ? detail.lost.filter(function (u) { return typeof u === "string"; }) : [];
        if (current === null) current = start(lost.length ? "failure" : "dynamic", at);
        keyed(current, detail.generation);
        for (const uid of lost) lose(current, uid, at, {});
      } else if (kind === "repartition_skipped") {
        const entry = start("dynamic", at);
        Object.assign(entry, { moved: false, phase: "skipped", replanned_s: at });
        for (const key of ["predicted_throughput_sps", "measured_throughput_sps", "saved_s", "cost_s"]) {
          entry[key] = number(detail[key]);
        }
      } else if (kind === "repartitioned") {
        const cause = detail.cause === "failure" || detail.cause === "dynamic" ? detail.cause : null;
        if (current === null || (cause === "dynamic" && current.cause === "failure")) {
          current = start(cause || "dynamic", at);
        }
        const entry = current;
        if (cause !== null) entry.cause = cause;
        keyed(entry, detail.generation);
        Object.assign(entry, {
          replanned_s: at, phase: "replanned", planner: get(detail, "planner"),
          stages: Array.isArray(detail.stages) ? detail.stages : null,
          predicted_throughput_sps: number(detail.predicted_throughput_sps),
          resume_microbatch: number(detail.resume_microbatch),
        });
        for (const key of ["measured_throughput_sps", "saved_s", "cost_s"]) {
          if (number(detail[key]) !== null) entry[key] = detail[key];
        }
      } else if (kind === "weights_redistributed") {
        const found = ofGeneration(detail.generation);
        if (found === null) continue;
        Object.assign(found, { weights_moved_s: at, phase: "weights_moved",
                               bytes_moved: number(detail.bytes_moved), transfers: number(detail.transfers),
                               weights_duration_s: number(detail.duration_s) });
      } else if (kind === "recovered") {
        const found = ofGeneration(detail.generation);
        if (found === null) continue;
        keyed(found, detail.generation);
        Object.assign(found, { resumed_s: at, phase: "resumed", recovery_s: number(detail.recovery_s),
                               microbatches_redone: number(detail.microbatches_redone) });
        if (number(detail.resume_microbatch) !== null) found.resume_microbatch = detail.resume_microbatch;
        if (found === current) current = null;
      } else if (kind === "run_failed" && current !== null) {
        Object.assign(current, { phase: "failed", error: detail.reason || detail.error || null });
        current = null;
      }
    }
    entries.forEach(durations);
    return entries.slice().sort(function (x, y) { return x.started_s - y.started_s; });
  }

  EP.faults = { recoveries: recoveries };
})();
