/* The live pages' state: a snapshot brought forward by deltas, exactly as the server's
   webapp.runs.events.snapshot_apply and webapp.devices.events.snapshot_apply do it, so a page
   that applied every delta holds what a fresh snapshot would hold (the browser tests compare
   the two). The window rule: keep the timeline events that end within window_s of the newest
   end (at most the snapshot's timeline_limit newest), likewise the metric points by their time
   (at most metrics_limit), and every fault. */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});

  /* Python's order of the key tuples: field by field; strings by code point, numbers by
     value (no arrays are built: a window holds tens of thousands of events). */
  function cmp(a, b) { return a < b ? -1 : a > b ? 1 : 0; }
  function timelineOrder(x, y) {
    return cmp(x.start, y.start) || cmp(x.end, y.end) || cmp(x.device, y.device) ||
      cmp(x.kind, y.kind) || cmp(x.microbatch, y.microbatch) || cmp(x.stage, y.stage);
  }
  function metricOrder(x, y) {
    return cmp(x.at, y.at) || cmp(x.kind, y.kind) || cmp(x.device, y.device) || cmp(x.value, y.value);
  }
  function faultOrder(x, y) {
    return cmp(x.at, y.at) || cmp(x.kind, y.kind) || cmp(x.device || "", y.device || "");
  }
  function planOrder(x, y) { return cmp(x.id, y.id); }
  function deviceOrder(x, y) { return cmp(x.name, y.name) || cmp(x.id, y.id); }

  /* The stable sort of old.concat(added), old being sorted already: sort the few added rows,
     then merge, taking the old row on a tie (as a stable sort of the concatenation would).
     With unique, an added row equal in order to one already there is left out (the page joins
     the run's group before it reads the snapshot: a delta may repeat what the snapshot has),
     as webapp.runs.events._windowed keeps each key once. */
  function merged(old, added, order, unique) {
    const fresh = added.slice().sort(order);
    const out = [];
    let i = 0;
    let j = 0;
    while (i < old.length || j < fresh.length) {
      const takeFresh = i >= old.length || (j < fresh.length && order(fresh[j], old[i]) < 0);
      const row = takeFresh ? fresh[j++] : old[i++];
      if (unique && out.length && order(out[out.length - 1], row) === 0) continue;
      out.push(row);
    }
    return out;
  }

  /* webapp.runs.events._windowed over old + added: the rows whose time is within windowS of
     the newest, in order (filtering a sorted list keeps it sorted); with maxRows, only the
     maxRows latest by timeKey (ties: the later in order), as webapp.runs.selectors.newest_rows. */
  function windowed(old, added, timeKey, order, windowS, maxRows) {
    const rows = merged(old, added, order, true);
    if (!rows.length) return rows;
    let newest = -Infinity;
    for (const r of rows) if (r[timeKey] > newest) newest = r[timeKey];
    const limit = newest - windowS;
    const kept = rows.filter(function (r) { return r[timeKey] >= limit; });
    if (!maxRows || kept.length <= maxRows) return kept;
    const last = kept.slice().sort(function (x, y) { return cmp(y[timeKey], x[timeKey]) || order(y, x); })
      .slice(0, maxRows);
    const keep = new Set(last);
    return kept.filter(function (r) { return keep.has(r); });
  }

  /* webapp.runs.events.snapshot_apply: the snapshot's seq becomes the newest event's */
  function applyRun(snapshot, event) {
    if (typeof event.seq === "number" && event.seq > (snapshot.seq || 0)) {
      snapshot = Object.assign({}, snapshot, { seq: event.seq });
    }
    return applied(snapshot, event);
  }

  /* webapp.runs.events.snapshot_gap: whether the event skips a number after the snapshot's
     (the channel layer dropped one: the page asks for a fresh snapshot) */
  function gap(snapshot, event) {
    return typeof event.seq === "number" && event.seq > (snapshot.seq || 0) + 1;
  }

  function applied(snapshot, event) {
    switch (event.type) {
      case "timeline":
        return Object.assign({}, snapshot, {
          timeline: windowed(snapshot.timeline, event.events, "end", timelineOrder, snapshot.window_s,
                             snapshot.timeline_limit),
        });
      case "metrics":
        return Object.assign({}, snapshot, {
          metrics: windowed(snapshot.metrics, event.points, "at", metricOrder, snapshot.window_s,
                            snapshot.metrics_limit),
        });
      case "faults":
        return Object.assign({}, snapshot, { faults: merged(snapshot.faults, event.events, faultOrder) });
      case "idle":
        return Object.assign({}, snapshot, { idle: { window: event.window, devices: event.devices } });
      case "run": {
        const keep = new Set(event.run.plans);
        return Object.assign({}, snapshot, {
          run: event.run,
          plans: snapshot.plans.filter(function (p) { return keep.has(p.id); }),
        });
      }
      case "plan": {
        const others = snapshot.plans.filter(function (p) { return p.id !== event.plan.id; });
        return Object.assign({}, snapshot, { plans: merged(others, [event.plan], planOrder) });
      }
      default:
        throw new Error("unknown event type " + JSON.stringify(event.type));
    }
  }

  /* webapp.devices.events.snapshot_apply */
  function applyDevices(snapshot, event) {
    if (event.type === "profiling") return snapshot;  // transient: not part of the snapshot
    if (event.type !== "device") throw new Error("unknown event type " + JSON.stringify(event.type));
    const others = snapshot.devices.filter(function (d) { return d.id !== event.device.id; });
    return Object.assign({}, snapshot, { devices: merged(others, [event.device], deviceOrder) });
  }

  EP.live = {
    merged: merged,
    windowed: windowed,
    applyRun: applyRun,
    gap: gap,
    applyDevices: applyDevices,
    RUN_DELTAS: ["run", "plan", "timeline", "metrics", "faults", "idle"],
  };
})();
