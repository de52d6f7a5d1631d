/* Where the live Gantt's bars come from (run_gantt.js): the page's event store
   (EdgePipe.TimelineStore) when it holds the view whole; else spans fetched from the timeline
   API, GET /api/runs/<id>/timeline/: the whole run's overview (downsampled by the server to
   about a bar per pixel per device and lane) and one zoomed window's detail (its events when
   few enough, else bars at the window's resolution), the store's events past their end drawn
   after them. Also the chosen plan's ghosts (the ghosts API) and the holes the store noted (a
   fresh snapshot after missed deltas), fetched from the timeline API event by event. */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});

  const GHOST_SPAN_S = 300; // the ghosts API answers at most 600 s; the page asks for 35 s more
  const OVERVIEW_REFRESH_MS = 5000; // a live run's overview, fetched again at most this often
  const MIN_BARS = 100;
  const MAX_FETCH_BARS = 2000; // the API's limit
  const MAX_FETCH_EVENTS = 20000; // the API's limit of exact events
  const HOLE_MAX_EVENTS = 200000; // a hole with more: the store lets go of what is before it

  function covers(answer, lo, hi) { return answer && answer.start_s <= lo && hi <= answer.end_s; }

  class GanttSources {
    /* store: the page's TimelineStore; urls: {timeline, ghost}; plotWidth(): the Gantt's plot
       width in pixels; changed(): an answer came in (the Gantt redraws); holeFilled(): the
       store took a hole's events */
    constructor(options) {
      this.store = options.store;
      this.urls = options.urls;
      this.plotWidth = options.plotWidth;
      this.changed = options.changed;
      this.holeFilled = options.holeFilled;
      this.ghosts = { plan: null, lo: 0, hi: -1, store: null, loading: false, error: "" };
      /* spans fetched from the timeline API: the whole run's overview and one zoomed window's
         detail, each an answer of the API (start_s, end_s, exact, events, bars, bin_s) with
         its items held for drawing (store) */
      this.fetched = { overview: null, detail: null, pending: "", failed: "", error: "" };
      this.filling = false;
    }

    /* the chosen plan's ghosts around [lo, hi] */
    async loadGhosts(plan, lo, hi) {
      const ghosts = this.ghosts;
      // a wide view (the overview of a long run) draws no ghosts: too many, and too thin to see
      if (!plan || ghosts.loading || hi - lo > GHOST_SPAN_S) return;
      if (ghosts.plan === plan && lo >= ghosts.lo && hi <= ghosts.hi) return;
      ghosts.loading = true;
      const from = Math.max(0, lo - 5);
      const to = hi + 30;
      const answer = await EP.api("GET", this.urls.ghost + "?start=" + from.toFixed(3) + "&end=" + to.toFixed(3));
      ghosts.loading = false;
      if (!answer.ok) {
        Object.assign(ghosts, { plan: plan, lo: from, hi: to, store: null, error: answer.data.detail });
        return;
      }
      Object.assign(ghosts, { plan: plan, lo: from, hi: to, error: "",
                              store: EP.TimelineStore.of(answer.data.events, { ghost: true }) });
      this.changed();
    }

    /* the bars a fetch asks for: about one per pixel of the plot */
    plotBars() {
      return Math.max(MIN_BARS, Math.min(MAX_FETCH_BARS, Math.round(this.plotWidth())));
    }

    /* whether an answer of the API draws [lo, hi] finely enough: its events, or bars no wider
       than two pixels of the view */
    fine(answer, lo, hi) {
      return answer.exact || answer.bin_s <= (2 * (hi - lo)) / this.plotBars();
    }

    async fetchSpan(which, lo, hi) {
      const fetched = this.fetched;
      const bars = this.plotBars();
      const query = which === "overview" ? "?max_bars=" + bars
        : "?start=" + lo.toFixed(4) + "&end=" + hi.toFixed(4) + "&max_bars=" + bars;
      if (fetched.pending || fetched.failed === query) return;
      fetched.pending = query;
      const answer = await EP.api("GET", this.urls.timeline + query);
      fetched.pending = "";
      if (!answer.ok) {
        fetched.failed = query;
        fetched.error = (answer.data && answer.data.detail) || "the server answered " + answer.status;
      } else {
        fetched.failed = "";
        fetched.error = "";
        const data = answer.data;
        fetched[which] = Object.assign({ fetched_at: Date.now(),
                                         store: EP.TimelineStore.of(data.exact ? data.events : data.bars) }, data);
      }
      this.changed();
    }

    /* The events of [lo, hi] from the API, in spans of at most MAX_FETCH_EVENTS (an answer with
       more is split by its count); null when they are more than HOLE_MAX_EVENTS or the server
       keeps failing. */
    async fetchEvents(lo, hi) {
      const spans = [[lo, hi]];
      const out = [];
      let failures = 0;
      while (spans.length) {
        const span = spans.pop();
        const answer = await EP.api("GET", this.urls.timeline + "?start=" + span[0] + "&end=" + span[1] +
                                    "&max_events=" + MAX_FETCH_EVENTS + "&max_bars=1");
        if (!answer.ok) {
          failures += 1;
          if (failures > 3) return null;
          spans.push(span);
          await new Promise(function (resolve) { setTimeout(resolve, 1000 * failures); });
          continue;
        }
        const data = answer.data;
        if (data.exact) {
          for (const e of data.events) out.push(e);
          if (out.length > HOLE_MAX_EVENTS) return null;
          continue;
        }
        if (data.events_in_span + out.length > HOLE_MAX_EVENTS) return null;
        const parts = Math.ceil((1.5 * data.events_in_span) / MAX_FETCH_EVENTS);
        const step = (span[1] - span[0]) / parts;
        for (let k = parts - 1; k >= 0; k -= 1) {
          spans.push([span[0] + k * step, k === parts - 1 ? span[1] : span[0] + (k + 1) * step]);
        }
      }
      return out;
    }

    /* the holes the store noted, filled one at a time */
    async fillHoles() {
      if (this.filling) return;
      this.filling = true;
      const store = this.store;
      while (store.holes.length) {
        const hole = store.holes[0];
        store.filled(hole, await this.fetchEvents(hole[0], hole[1]));
        this.holeFilled();
      }
      this.filling = false;
    }

    /* What to draw of [lo, hi] (view: {follow, overview}) and where it comes from: the store
       when it holds the view whole; else a fetched span (the zoomed window's detail, else the
       overview), followed by the events the store holds past its end; fetching what is
       missing. */
    sourceFor(range, view) {
      const store = this.store;
      const fetched = this.fetched;
      const lo = range[0];
      const hi = range[1];
      const live = { source: "live", exact: true, store: store, after: undefined };
      if (view.follow || (!view.overview && lo >= store.completeFrom())) return live;
      const overview = fetched.overview;
      const newestEnd = store.count ? store.newestEnd : 0;
      let best = null;
      if (view.overview) {
        const stale = !overview || (newestEnd > overview.end_s + 0.02 * overview.end_s &&
                                    Date.now() - overview.fetched_at > OVERVIEW_REFRESH_MS);
        if (stale) this.fetchSpan("overview", 0, hi);
        if (overview) best = { answer: overview, source: "overview" };
      } else {
        const detail = fetched.detail;
        if (detail && covers(detail, lo, Math.min(hi, detail.end_s)) && this.fine(detail, lo, hi)) {
          best = { answer: detail, source: "detail" };
        } else if (overview && this.fine(overview, lo, hi)) {
          best = { answer: overview, source: "overview" };
        } else {
          const span = hi - lo;
          this.fetchSpan("detail", Math.max(0, lo - span / 2), hi + span / 2);
          // meanwhile: the coarser detail or the overview, whichever covers the view
          if (detail && covers(detail, lo, Math.min(hi, detail.end_s))) best = { answer: detail, source: "detail" };
          else if (overview) best = { answer: overview, source: "overview" };
          else this.fetchSpan("overview", 0, hi);
        }
      }
      if (!best) return live;
      return { source: best.source, exact: best.answer.exact, store: best.answer.store,
               after: best.answer.end_s };
    }
  }

  GanttSources.GHOST_SPAN_S = GHOST_SPAN_S;
  EP.GanttSources = GanttSources;
})();
