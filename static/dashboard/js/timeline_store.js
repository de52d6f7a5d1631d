/* Timeline events held in columns, one lane per device and lane of the Gantt (compute, sync,
   comm; ghosts: the plan's compute and sync bars on a lane of their own), for the run page's
   live Gantt (run_gantt.js, gantt_canvas.js).

   A lane keeps its events in typed arrays sorted by (start, end, kind, micro-batch, stage), the
   order webapp.runs.selectors.timeline_order gives a device's events: adding an event costs the
   same however many the lane holds (events come about in time order, so nearly every one is
   appended; a late one is put in its place), an event held already is left out (a delta may
   repeat what the snapshot had), and the events of a span are found by binary search. 38 bytes
   an event (twice that at most while the arrays have room to grow), where an event's object
   as JSON.parse makes it takes about 170 (V8).

   EdgePipe.TimelineStore is the live store: every event the page got (its first snapshot's
   window, then every delta), so that the Gantt shows every event since the page opened, not
   only the snapshot's window. `heldFrom`: every event that ends at or after it is held (the
   first snapshot's oldest end; views before it are fetched from GET /api/runs/<id>/timeline/).
   A fresh snapshot after a gap in the deltas' numbers (or a reconnection) may leave out what
   was missed: the span between the newest events held when the gap was seen and the
   snapshot's oldest is a hole, which run_gantt.js fills from the same API (spans the store does not hold whole count
   as not held meanwhile). Beyond MAX_EVENTS the oldest quarter of the held span is let go, and
   heldFrom moves past it. EdgePipe.TimelineStore.of(list) holds a list fetched from the API
   (a zoomed window's events, the overview's merged bars, the plan's ghosts) likewise, each
   item kept for its hover. */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});

  // at most this many events held (38 to 76 MB); then the oldest quarter of the span goes
  const MAX_EVENTS = 1000000;
  // a hole starts this long before the newest end held of the device that is furthest behind
  // (a device's events reach the page in the order it reported them), and at least HOLE_ALL_S
  // before the newest end held (a device first seen in what was missed)
  const HOLE_DEVICE_S = 1;
  const HOLE_ALL_S = 10;

  const KINDS = EP.charts.KINDS;
  /* kinds as small numbers (the known ones in alphabetical order, then any other as met) */
  const KIND_NAMES = Object.keys(KINDS).sort();
  const KIND_CODE = {};
  KIND_NAMES.forEach(function (k, i) { KIND_CODE[k] = i; });
  function kindCode(kind) {
    let c = KIND_CODE[kind];
    if (c === undefined) {
      c = KIND_CODE[kind] = KIND_NAMES.length;
      KIND_NAMES.push(String(kind));
    }
    return c;
  }
  /* the Gantt lane of a kind (an unknown kind is drawn as a load: with the transfers) */
  function laneOf(kind) { return (KINDS[kind] || KINDS.load).lane; }

  class Lane {
    constructor(device, lane, keepItems) {
      this.device = device;
      this.lane = lane; // compute, sync, comm, ghost
      this.n = 0;
      this.maxLength = 0; // the longest event's end - start (a span's search looks that far back)
      this.newestEnd = -Infinity;
      this.items = keepItems ? [] : null;
      this.grow(16);
    }

    grow(capacity) {
      const old = this;
      const make = function (Type, prev) {
        const a = new Type(capacity);
        if (prev) a.set(prev.subarray(0, old.n));
        return a;
      };
      this.start = make(Float64Array, this.start);
      this.end = make(Float64Array, this.end);
      this.bytes = make(Float64Array, this.bytes);
      this.kind = make(Uint16Array, this.kind);
      this.microbatch = make(Int32Array, this.microbatch);
      this.stage = make(Int32Array, this.stage);
      this.version = make(Int32Array, this.version);
      this.capacity = capacity;
    }

    /* -1, 0, 1: the event at i against (s, e, k, m, st) in the lane's order */
    cmpAt(i, s, e, k, m, st) {
      const a = this.start[i];
      if (a !== s) return a < s ? -1 : 1;
      const b = this.end[i];
      if (b !== e) return b < e ? -1 : 1;
      const c = this.kind[i];
      if (c !== k) return c < k ? -1 : 1;
      const d = this.microbatch[i];
      if (d !== m) return d < m ? -1 : 1;
      const f = this.stage[i];
      return f === st ? 0 : f < st ? -1 : 1;
    }

    /* put the event in its place; false when the lane holds it already */
    add(s, e, k, m, st, v, by, item) {
      let at = this.n;
      if (at > 0) {
        const last = this.cmpAt(at - 1, s, e, k, m, st);
        if (last === 0) return false;
        if (last > 0) {
          // a late event: after every event not above it (binary search), unless one equals it
          let lo = 0;
          let hi = at - 1;
          while (lo < hi) {
            const mid = (lo + hi) >>> 1;
            if (this.cmpAt(mid, s, e, k, m, st) <= 0) lo = mid + 1;
            else hi = mid;
          }
          if (lo > 0 && this.cmpAt(lo - 1, s, e, k, m, st) === 0) return false;
          at = lo;
        }
      }
      if (this.n === this.capacity) this.grow(this.capacity * 2);
      if (at < this.n) {
        for (const col of [this.start, this.end, this.bytes, this.kind, this.microbatch, this.stage,
          this.version]) col.copyWithin(at + 1, at, this.n);
        if (this.items) this.items.splice(at, 0, item);
      } else if (this.items) {
        this.items.push(item);
      }
      this.start[at] = s;
      this.end[at] = e;
      this.kind[at] = k;
      this.microbatch[at] = m;
      this.stage[at] = st;
      this.version[at] = v;
      this.bytes[at] = by;
      this.n += 1;
      if (e - s > this.maxLength) this.maxLength = e - s;
      if (e > this.newestEnd) this.newestEnd = e;
      return true;
    }

    /* the first index whose start is >= t (or > t with after) */
    bound(t, after) {
      let lo = 0;
      let hi = this.n;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        const s = this.start[mid];
        if (s < t || (after && s === t)) lo = mid + 1;
        else hi = mid;
      }
      return lo;
    }

    /* [first, last) of the indices to look at for the events overlapping [lo, hi] (each still
       to be checked: end >= lo) */
    span(lo, hi) {
      return [this.bound(lo - this.maxLength, false), this.bound(hi, true)];
    }

    /* drop the events that end before t; how many went */
    dropBefore(t) {
      let w = 0;
      for (let r = 0; r < this.n; r += 1) {
        if (this.end[r] < t) continue;
        if (w !== r) {
          this.start[w] = this.start[r];
          this.end[w] = this.end[r];
          this.kind[w] = this.kind[r];
          this.microbatch[w] = this.microbatch[r];
          this.stage[w] = this.stage[r];
          this.version[w] = this.version[r];
          this.bytes[w] = this.bytes[r];
          if (this.items) this.items[w] = this.items[r];
        }
        w += 1;
      }
      const gone = this.n - w;
      this.n = w;
      if (this.items) this.items.length = w;
      return gone;
    }

    /* the event at i in the shared schema (the item itself when the lane keeps them) */
    event(i) {
      if (this.items) return this.items[i];
      return { device: this.device, stage: this.stage[i], kind: KIND_NAMES[this.kind[i]],
               microbatch: this.microbatch[i], version: this.version[i], start: this.start[i],
               end: this.end[i], bytes: this.bytes[i] };
    }
  }

  class TimelineStore {
    /* opts.ghost: the plan's ghosts (compute and sync kinds on the ghost lane, transfers left
       out); opts.keepItems: keep each item added (its hover reads it) */
    constructor(opts) {
      this.ghost = Boolean(opts && opts.ghost);
      this.keepItems = Boolean(opts && opts.keepItems);
      this.lanes = []; // in the order first met
      this.laneMap = new Map(); // device -> {lane -> Lane}
      this.count = 0;
      this.newestEnd = -Infinity;
      this.oldestEnd = Infinity;
      this.kinds = new Set(); // the kinds held (the legend's)
      this.heldFrom = Infinity; // nothing held yet
      this.holes = []; // [[from, to]]: spans missed, being fetched
      this.gapFrom = null; // where what a gap in the deltas' numbers missed may start
      this.dropped = 0; // events let go beyond MAX_EVENTS
      this.snapshots = 0;
    }

    laneFor(device, lane) {
      let byLane = this.laneMap.get(device);
      if (!byLane) this.laneMap.set(device, (byLane = {}));
      let l = byLane[lane];
      if (!l) {
        l = byLane[lane] = new Lane(device, lane, this.keepItems);
        this.lanes.push(l);
      }
      return l;
    }

    devices() { return Array.from(this.laneMap.keys()); }

    /* add events (the shared schema; for bars also {lane, count, ...}); how many were new */
    add(events) {
      let added = 0;
      for (const e of events) {
        let lane = e.lane && !this.ghost ? e.lane : laneOf(e.kind);
        if (this.ghost) {
          if (lane === "comm") continue;
          lane = "ghost";
        }
        const k = kindCode(e.kind);
        const l = this.laneFor(e.device, lane);
        if (!l.add(e.start, e.end, k, e.microbatch === undefined ? 0 : e.microbatch, e.stage || 0,
                   e.version || 0, e.bytes || 0, e)) continue;
        added += 1;
        this.kinds.add(e.kind);
        if (e.end > this.newestEnd) this.newestEnd = e.end;
        if (e.end < this.oldestEnd) this.oldestEnd = e.end;
      }
      this.count += added;
      if (this.count > MAX_EVENTS) this.letGo();
      return added;
    }

    /* A snapshot's window: the first sets heldFrom (its oldest end: every event that ends
       later is in it; nothing at all when it holds none); a later one (after a gap in the
       numbers, or a reconnection) may leave a hole between the newest events held and its own
       oldest, which is noted to be fetched. */
    snapshot(timeline) {
      this.snapshots += 1;
      let oldest = Infinity;
      for (const e of timeline) if (e.end < oldest) oldest = e.end;
      if (this.heldFrom === Infinity) {
        this.heldFrom = timeline.length ? oldest : 0;
      } else if (timeline.length) {
        const from = Math.max(this.heldFrom, this.gapFrom === null ? this.holeFrom() : this.gapFrom);
        if (oldest > from) this.holes.push([from, oldest]);
      }
      this.gapFrom = null;
      this.add(timeline);
    }

    /* a delta's number skipped one: what was missed starts after the newest events held now
       (the deltas that come before the fresh snapshot do not move that) */
    gapSeen() {
      if (this.heldFrom === Infinity) return;
      const from = this.holeFrom();
      this.gapFrom = this.gapFrom === null ? from : Math.min(this.gapFrom, from);
    }

    /* where events missed since the last delta may start */
    holeFrom() {
      if (this.count === 0) return this.heldFrom;
      let behind = Infinity;
      for (const byLane of this.laneMap.values()) {
        let newest = -Infinity;
        for (const l of Object.values(byLane)) if (l.newestEnd > newest) newest = l.newestEnd;
        if (newest < behind) behind = newest;
      }
      return Math.min(behind - HOLE_DEVICE_S, this.newestEnd - HOLE_ALL_S);
    }

    /* a hole's events came (or gave up on: then nothing before its end is held whole) */
    filled(hole, events) {
      this.holes = this.holes.filter(function (h) { return h !== hole; });
      if (events) this.add(events);
      else this.dropBefore(hole[1]);
    }

    /* where the store holds every event that ends later (a hole pending: past it) */
    completeFrom() {
      let from = this.heldFrom;
      for (const h of this.holes) if (h[1] > from) from = h[1];
      return from;
    }

    dropBefore(t) {
      if (!(t > this.heldFrom)) return;
      let gone = 0;
      for (const l of this.lanes) gone += l.dropBefore(t);
      this.count -= gone;
      this.dropped += gone;
      this.heldFrom = t;
      this.oldestEnd = Math.max(this.oldestEnd, t);
      this.holes = this.holes.filter(function (h) { return h[1] > t; });
    }

    /* beyond MAX_EVENTS: let the oldest quarter of the span held go, until a fifth is free */
    letGo() {
      for (let round = 0; round < 8 && this.count > 0.8 * MAX_EVENTS; round += 1) {
        const from = Math.max(this.heldFrom, this.oldestEnd);
        this.dropBefore(Math.min(this.newestEnd, from + (this.newestEnd - from) / 4 * (round + 1)));
      }
    }

    /* call fn(lane, first, last) for each lane, with the index range to look at for [lo, hi] */
    forSpans(lo, hi, fn) {
      for (const l of this.lanes) {
        if (l.n === 0) continue;
        const r = l.span(lo, hi);
        if (r[1] > r[0]) fn(l, r[0], r[1]);
      }
    }

    /* the events (or items) overlapping [lo, hi] that start after `after` (default: any) */
    within(lo, hi, after) {
      const out = [];
      const from = after === undefined ? -Infinity : after;
      this.forSpans(lo, hi, function (l, first, last) {
        for (let i = first; i < last; i += 1) {
          if (l.end[i] >= lo && l.start[i] > from) out.push(l.event(i));
        }
      });
      return out;
    }

    /* The other end of a transfer among the events held (EdgePipe.charts.flowOf's rule): for
       a send, the receive of the same micro-batch on a neighbouring stage that ends first after
       the send began; for a receive, the send that began last before it ended. */
    flowOf(e) {
      if (!e || (e.kind !== "send" && e.kind !== "recv")) return null;
      const other = kindCode(e.kind === "send" ? "recv" : "send");
      let best = null;
      let bestLane = null;
      for (const l of this.lanes) {
        if (l.lane !== "comm" || l.device === e.device) continue;
        // a send's receive ends after the send began; a receive's send begins before it ended
        const first = e.kind === "send" ? l.bound(e.start - l.maxLength, false) : 0;
        const last = e.kind === "send" ? l.n : l.bound(e.end, true);
        for (let i = first; i < last; i += 1) {
          if (l.kind[i] !== other || l.microbatch[i] !== e.microbatch ||
              Math.abs(l.stage[i] - e.stage) !== 1) continue;
          if (e.kind === "send") {
            if (l.end[i] >= e.start && (best === null || l.end[i] < bestLane.end[best])) {
              best = i; bestLane = l;
            }
          } else if (l.start[i] <= e.end && (best === null || l.start[i] > bestLane.start[best])) {
            best = i; bestLane = l;
          }
        }
      }
      return best === null ? null : bestLane.event(best);
    }

    /* every event held as "device|kind|micro-batch|start|end|stage" (the browser tests compare
       them with the database) */
    keys() {
      const out = [];
      for (const l of this.lanes) {
        for (let i = 0; i < l.n; i += 1) {
          out.push([l.device, KIND_NAMES[l.kind[i]], l.microbatch[i], l.start[i], l.end[i],
                    l.stage[i]].join("|"));
        }
      }
      return out;
    }
  }

  /* a list fetched from the API, held for drawing: events (keepItems), or bars */
  TimelineStore.of = function (items, opts) {
    const store = new TimelineStore(Object.assign({ keepItems: true }, opts || {}));
    store.heldFrom = 0;
    store.add(items);
    return store;
  };

  TimelineStore.MAX_EVENTS = MAX_EVENTS;
  EP.TimelineStore = TimelineStore;
  EP.timelineKinds = { names: KIND_NAMES, code: kindCode, laneOf: laneOf };
})();
