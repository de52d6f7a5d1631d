/* The live Gantt's bars on a canvas under the Plotly chart's axes (run_gantt.js): Plotly draws
   the axes, the rows, the stage bands, the fault marks' lines and labels, the legend and takes
   the zoom and pan; the canvas, put where Plotly puts its WebGL layer (over the plot's
   background, under its labels and hover), draws the bars of EdgePipe.TimelineStore's lanes in
   the axes' current range. A frame costs what the bars in view cost, never what the run holds:
   each lane's events in view are found by binary search, and bars of a kind that touch on
   screen are one rectangle. Also: which bar is under the pointer, and the bars in view as the
   browser tests read them. */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});
  const charts = EP.charts;
  const names = EP.timelineKinds.names;

  const DASHES = { dash: [6, 4], dot: [2, 3], solid: [] };
  const HOVER_PX = 12; // as the Plotly charts' hoverdistance

  function colorOf(kind) { return (charts.KINDS[kind] || charts.KINDS.load).color; }

  class GanttCanvas {
    constructor(gd) {
      this.gd = gd;
      this.canvas = null;
      this.rects = []; // per kind code: [x, y, w, h, ...] of the frame being drawn
      // per kind code, in a lane: the rectangle being extended (from, to), if any
      this.opened = new Uint8Array(256);
      this.from = new Float64Array(256);
      this.to = new Float64Array(256);
      this.view = null; // what the last frame drew: {layers, rows, rowPx, xrange}
    }

    /* the canvas, over Plotly's plot background and under its labels */
    ensure() {
      const container = this.gd.querySelector(".svg-container");
      if (!container) return null;
      if (this.canvas && this.canvas.parentNode === container) return this.canvas;
      const canvas = document.createElement("canvas");
      canvas.className = "gantt-bars";
      canvas.style.cssText = "position:absolute;top:0;left:0;pointer-events:none";
      const papers = container.querySelectorAll(":scope > svg.main-svg");
      container.insertBefore(canvas, papers.length > 1 ? papers[1] : null);
      this.canvas = canvas;
      return canvas;
    }

    /* the axes' mapping (Plotly's layout as drawn), with `xrange` instead of the axis's own
       while the user drags */
    geometry(xrange) {
      const fl = this.gd._fullLayout;
      if (!fl || !fl._size || !fl.xaxis || !fl.yaxis) return null;
      const size = fl._size;
      const xr = xrange || fl.xaxis.range;
      const yr = fl.yaxis.range;
      const x0 = Number(xr[0]);
      const x1 = Number(xr[1]);
      if (!(x1 > x0) || yr[0] === yr[1]) return null;
      return {
        width: fl.width, height: fl.height, l: size.l, t: size.t, w: size.w, h: size.h,
        x0: x0, x1: x1, kx: size.w / (x1 - x0), y0: yr[0], y1: yr[1],
        py: function (y) { return size.t + (size.h * (y - yr[1])) / (yr[0] - yr[1]); },
      };
    }

    /* Draw. view: {layers: [{name, store, alpha, after, hidden}], rows: {uid: row}, rowPx,
       marks: [{at, color, dash}]}; xrange: the range while dragging (else the axis's). Each
       layer draws the events of its store in the range (those starting after `after`, of no
       `hidden` kind code). Returns the number of rectangles drawn. */
    draw(view, xrange) {
      this.view = view;
      const canvas = this.ensure();
      const g = this.geometry(xrange);
      if (!canvas || !g) return 0;
      const dpr = window.devicePixelRatio || 1;
      const pw = Math.round(g.width * dpr);
      const ph = Math.round(g.height * dpr);
      if (canvas.width !== pw || canvas.height !== ph) {
        canvas.width = pw;
        canvas.height = ph;
        canvas.style.width = g.width + "px";
        canvas.style.height = g.height + "px";
      }
      const ctx = canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, g.width, g.height);
      ctx.save();
      ctx.beginPath();
      ctx.rect(g.l, g.t, g.w, g.h);
      ctx.clip();
      let drawn = 0;
      for (const layer of view.layers) {
        if (!layer.store) continue;
        this.collect(layer, view, g);
        ctx.globalAlpha = layer.alpha === undefined ? 1 : layer.alpha;
        for (let k = 0; k < this.rects.length; k += 1) {
          const r = this.rects[k];
          if (!r || r.length === 0) continue;
          ctx.fillStyle = colorOf(names[k]);
          for (let j = 0; j < r.length; j += 4) ctx.fillRect(r[j], r[j + 1], r[j + 2], r[j + 3]);
          drawn += r.length / 4;
        }
      }
      ctx.globalAlpha = 1;
      // the fault marks' lines again, over the bars (Plotly's are under the canvas)
      for (const m of view.marks || []) {
        if (m.at < g.x0 || m.at > g.x1) continue;
        const x = g.l + (m.at - g.x0) * g.kx;
        ctx.strokeStyle = m.color;
        ctx.lineWidth = 1.5;
        ctx.setLineDash(DASHES[m.dash] || []);
        ctx.beginPath();
        ctx.moveTo(x, g.t);
        ctx.lineTo(x, g.t + g.h);
        ctx.stroke();
      }
      ctx.restore();
      return drawn;
    }

    /* one layer's rectangles, per kind, into this.rects */
    collect(layer, view, g) {
      const rects = this.rects;
      const opened = this.opened;
      const from = this.from;
      const to = this.to;
      for (let k = 0; k < names.length; k += 1) {
        if (!rects[k]) rects[k] = [];
        rects[k].length = 0;
      }
      const lo = g.x0;
      const hi = g.x1;
      const after = layer.after === undefined ? -Infinity : layer.after;
      const hidden = layer.hidden || null;
      const right = g.l + g.w + 2;
      const left = g.l - 2;
      const touched = [];
      layer.store.forSpans(lo, hi, function (lane, first, last) {
        const row = view.rows[lane.device];
        if (row === undefined) return;
        const spec = charts.LANES[lane.lane] || charts.LANES.comm;
        const th = Math.max(2, view.rowPx * spec.width);
        const y = g.py(row + spec.y) - th / 2;
        const start = lane.start;
        const end = lane.end;
        const kinds = lane.kind;
        for (let i = first; i < last; i += 1) {
          const e = end[i];
          if (e < lo) continue;
          const s = start[i];
          if (s <= after) continue;
          const k = kinds[i];
          if (hidden && hidden[k]) continue;
          let x0 = g.l + (s - lo) * g.kx;
          let x1 = g.l + (e - lo) * g.kx;
          if (x0 < left) x0 = left;
          if (x1 > right) x1 = right;
          if (x1 - x0 < 1) x1 = x0 + 1; // an event shorter than a pixel: a pixel
          if (opened[k] && x0 <= to[k] + 0.5) {
            if (x1 > to[k]) to[k] = x1;
            continue;
          }
          if (opened[k]) rects[k].push(from[k], y, to[k] - from[k], th);
          else { opened[k] = 1; touched.push(k); }
          from[k] = x0;
          to[k] = x1;
        }
        for (const k of touched) {
          rects[k].push(from[k], y, to[k] - from[k], th);
          opened[k] = 0;
        }
        touched.length = 0;
      });
    }

    /* the bars in the last frame's view: [{layer, item (the event or bar), row, y (data),
       x, yPx (client pixels: the middle of its part in view)}] */
    items(filter) {
      const view = this.view;
      const g = this.geometry();
      const out = [];
      if (!view || !g || !this.canvas) return out;
      const box = this.canvas.getBoundingClientRect();
      for (const layer of view.layers) {
        if (!layer.store || (filter && filter !== layer.name)) continue;
        const after = layer.after === undefined ? -Infinity : layer.after;
        layer.store.forSpans(g.x0, g.x1, function (lane, first, last) {
          const row = view.rows[lane.device];
          if (row === undefined) return;
          const spec = charts.LANES[lane.lane] || charts.LANES.comm;
          for (let i = first; i < last; i += 1) {
            if (lane.end[i] < g.x0 || lane.start[i] <= after) continue;
            if (layer.hidden && layer.hidden[lane.kind[i]]) continue;
            const a = Math.max(lane.start[i], g.x0);
            const b = Math.min(lane.end[i], g.x1);
            out.push({ layer: layer.name, item: lane.event(i), row: row, y: row + spec.y,
                       x: box.left + g.l + ((a + b) / 2 - g.x0) * g.kx, yPx: box.top + g.py(row + spec.y) });
          }
        });
      }
      return out;
    }

    /* the bar under the pointer (client pixels): {layer, item, lane} or null; the top layer
       first, and in a lane the bar under the pointer, else the nearest within HOVER_PX */
    pick(clientX, clientY) {
      const view = this.view;
      const g = this.geometry();
      if (!view || !g || !this.canvas) return null;
      const box = this.canvas.getBoundingClientRect();
      const cx = clientX - box.left;
      const cy = clientY - box.top;
      if (cx < g.l || cx > g.l + g.w || cy < g.t || cy > g.t + g.h) return null;
      const x = g.x0 + (cx - g.l) / g.kx;
      const tol = HOVER_PX / g.kx;
      for (let n = view.layers.length - 1; n >= 0; n -= 1) {
        const layer = view.layers[n];
        if (!layer.store) continue;
        let best = null;
        let bestPx = Infinity;
        const after = layer.after === undefined ? -Infinity : layer.after;
        layer.store.forSpans(x - tol, x + tol, function (lane, first, last) {
          const row = view.rows[lane.device];
          if (row === undefined) return;
          const spec = charts.LANES[lane.lane] || charts.LANES.comm;
          const half = Math.max(3, (view.rowPx * spec.width) / 2) + 1;
          if (Math.abs(cy - g.py(row + spec.y)) > half) return;
          for (let i = first; i < last; i += 1) {
            const s = lane.start[i];
            const e = lane.end[i];
            if (e < x - tol || s <= after) continue;
            if (layer.hidden && layer.hidden[lane.kind[i]]) continue;
            const px = s <= x && x <= e ? 0 : Math.min(Math.abs(s - x), Math.abs(e - x)) * g.kx;
            if (px <= bestPx) { bestPx = px; best = { layer: layer.name, lane: lane, item: lane.event(i) }; }
          }
        });
        if (best && bestPx <= HOVER_PX) return best;
      }
      return null;
    }
  }

  EP.GanttCanvas = GanttCanvas;
})();
