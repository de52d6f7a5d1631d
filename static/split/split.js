/* The split-learning pages. The studies page: the new-study form shows the shared-instance
   choice or the file upload, as its radio says. A study's page: the comparison of methods and
   a Plotly Gantt of each computed schedule (one row per helper, one per client, x in time
   slots); while a method is pending or running it polls the study's detail API every 2 s (the
   embedded setup's in-memory channel layer does not carry the workers' events) and redraws
   what changed. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const h = EP.h;
  const fmt = EP.fmt;
  const $ = function (id) { return document.getElementById(id); };
  const UNFINISHED = ["pending", "running"];

  const KINDS = {
    forward: { color: "#3b82f6", label: "helper forward", helper: true },
    backward: { color: "#f59e0b", label: "helper backward", helper: true },
    "client-forward": { color: "#93c5fd", label: "client part-1 forward + upload (r)" },
    "client-loss": { color: "#10b981", label: "transfer + part-3 forward and loss (l)" },
    "client-backward": { color: "#8b5cf6", label: "part-3 backward + gradient upload (l′)" },
    "client-finish": { color: "#f472b6", label: "gradient download + part-1 backward (r′)" },
  };

  /* ---------------------------------------------------------------- the new-study form */

  function initForm(form) {
    const sync = function () {
      const chosen = form.querySelector('input[name="source"]:checked');
      const upload = chosen !== null && chosen.value === "upload";
      $("shared-box").hidden = upload;
      $("upload-box").hidden = !upload;
    };
    form.addEventListener("change", function (event) {
      if (event.target.name === "source") sync();
    });
    sync();
    // a refused form is below the studies: bring its errors into view
    if (form.querySelector(".form-error")) form.scrollIntoView({ block: "start" });
  }

  /* ---------------------------------------------------------------- a study */

  function gap(value) {
    if (value === null || value === undefined) return "–";
    const percent = value * 100;
    if (percent === 0) return "0%";
    return "+" + (percent >= 10 ? percent.toFixed(0) : percent.toFixed(1)) + "%";
  }

  function unfinished(statuses) {
    return Object.keys(statuses).some(function (id) { return UNFINISHED.indexOf(statuses[id]) >= 0; });
  }

  function initStudy(cfg) {
    const page = (EP.splitPage = {
      statuses: cfg.statuses, gantts: {}, polls: 0, renders: 0,
      initiallyUnfinished: unfinished(cfg.statuses),
    });

    for (const kind of Object.keys(KINDS)) {
      const swatch = h("i");
      swatch.style.background = KINDS[kind].color;
      $("split-legend").append(h("span", null, swatch, KINDS[kind].label));
    }

    function cell(text, cls) { return h("td", { class: cls }, text); }

    function renderCompare(compare) {
      page.renders += 1;
      const why = $("split-why");
      why.hidden = !compare.reason;
      why.textContent = compare.reason;
      $("split-bound").textContent = "lower bound " + compare.lower_bound + " slots (" +
        (compare.lower_bound_from === "simple" ? "chains and load" : "proven by " + compare.lower_bound_from) + ")";
      const body = $("split-table");
      body.replaceChildren();
      for (const row of compare.rows) {
        const best = row.schedule === compare.best;
        body.append(h("tr", { class: best ? "is-best" : null, "data-schedule": row.schedule },
          h("td", { class: "name" }, row.method, best ? " " : null, best ? h("span", { class: "tag" }, "best") : null),
          h("td", null, EP.badge(row.status)),
          h("td", { class: "num" }, row.makespan === null ? "–" : row.makespan + " slots ",
            row.makespan === null ? null : h("span", { class: "muted small" }, "(" + fmt.seconds(row.makespan_s) + ")")),
          cell(gap(row.gap_to_best), "num"),
          cell(gap(row.gap_to_bound), "num"),
          cell(fmt.seconds(row.solver_s), "num")));
        if (row.error) {
          body.append(h("tr", null, h("td", { colspan: 6, class: "small" },
            h("span", { class: "field-error" }, row.error))));
        }
        if (row.status === "done" && !page.gantts[row.schedule]) loadGantt(row);
      }
      orderGantts(compare.rows);
    }

    function orderGantts(rows) {
      const box = $("split-gantts");
      for (const row of rows) {
        const el = box.querySelector('[data-schedule="' + row.schedule + '"]');
        if (el) box.append(el);
      }
      $("split-gantts-empty").hidden = box.children.length > 0;
    }

    async function loadGantt(row) {
      page.gantts[row.schedule] = "loading";
      const chart = h("div", { class: "chart" });
      $("split-gantts").append(h("div", { class: "plan-gantt split-gantt", "data-schedule": row.schedule },
        h("h3", null, h("span", null, row.method),
          h("span", { class: "muted small" }, row.makespan + " slots · " + fmt.seconds(row.makespan_s))),
        chart));
      $("split-gantts-empty").hidden = true;
      const answer = await EP.api("GET", cfg.urls.gantt.replace("{schedule}", row.schedule));
      if (!answer.ok) {
        page.gantts[row.schedule] = "error";
        chart.replaceWith(h("p", { class: "field-error" }, answer.data.detail));
        return;
      }
      drawGantt(chart, answer.data);
      page.gantts[row.schedule] = "done";
    }

    function drawGantt(el, gantt) {
      // tick labels are markup to Plotly: escaped
      const labels = gantt.rows.map(function (r) { return EP.esc(r.label); });
      const groups = {};
      for (const bar of gantt.bars) {
        const spec = KINDS[bar.kind];
        const g = groups[bar.kind] || (groups[bar.kind] = { base: [], x: [], y: [], text: [], hover: [] });
        const slots = bar.end - bar.start;
        g.base.push(bar.start);
        g.x.push(slots);
        g.y.push(bar.row);
        g.text.push(spec.helper ? "c" + bar.client : "");
        g.hover.push("<b>" + EP.esc(spec.label) + "</b><br>client " + bar.client + " on helper " + bar.helper +
          "<br>slots " + bar.start + "–" + bar.end + " (" + slots + " slot" + (slots === 1 ? "" : "s") + ", " +
          fmt.seconds(slots * gantt.slot_ms / 1000) + ")");
      }
      const traces = Object.keys(KINDS).filter(function (k) { return groups[k]; }).map(function (kind) {
        const g = groups[kind];
        return {
          type: "bar", orientation: "h", base: g.base, x: g.x, y: g.y, text: g.text,
          textposition: "inside", insidetextanchor: "middle", textangle: 0,
          textfont: { size: 10, color: kind === "backward" ? "#1f2937" : "#fff" },
          hovertext: g.hover, hovertemplate: "%{hovertext}<extra></extra>",
          marker: { color: KINDS[kind].color, line: { color: "#fff", width: 0.5 } },
          name: KINDS[kind].label, width: 0.72, showlegend: false,
        };
      });
      const helpers = gantt.rows.filter(function (r) { return r.kind === "helper"; }).length;
      const rowPx = labels.length > 40 ? 14 : labels.length > 16 ? 20 : 28;
      const layout = {
        height: 70 + labels.length * rowPx,
        margin: { l: 110, r: 16, t: 8, b: 44 },
        font: EP.plotFont, barmode: "overlay", bargap: 0.2, hovermode: "closest",
        uniformtext: { mode: "hide", minsize: 8 },
        xaxis: { title: { text: "time slot (" + fmt.num(gantt.slot_ms) + " ms each)", font: { size: 11 } },
                 range: [0, gantt.makespan * 1.01], zeroline: false, gridcolor: "#eef2f7" },
        // numeric rows (not categories), so that a helper serving nobody keeps its row
        yaxis: { range: [labels.length - 0.5, -0.5], tickmode: "array",
                 tickvals: labels.map(function (_, i) { return i; }), ticktext: labels,
                 zeroline: false, showgrid: false, fixedrange: true,
                 tickfont: { size: labels.length > 40 ? 9 : 11 } },
        shapes: [
          { type: "line", xref: "paper", x0: 0, x1: 1, y0: helpers - 0.5, y1: helpers - 0.5,
            line: { color: "#94a3b8", width: 1 } },
          { type: "line", yref: "paper", y0: 0, y1: 1, x0: gantt.makespan, x1: gantt.makespan,
            line: { color: "#dc2626", width: 1, dash: "dot" } },
        ],
        plot_bgcolor: "#fff", paper_bgcolor: "#fff",
      };
      window.Plotly.newPlot(el, traces, layout, EP.plotConfig);
    }

    function renderStatus(status) {
      const badge = $("study-status");
      badge.className = "badge badge-" + status;
      badge.textContent = status;
    }

    async function poll() {
      page.polls += 1;
      const answer = await EP.api("GET", cfg.urls.detail);
      if (answer.status === 401 || answer.status === 403) {
        window.location.assign("/login/?next=" + encodeURIComponent(window.location.pathname));
        return;
      }
      if (answer.status === 404) {
        $("poll-note").textContent = "this study no longer exists";
        return;
      }
      if (answer.ok) {
        const statuses = {};
        for (const s of answer.data.schedules) statuses[String(s.id)] = s.status;
        renderStatus(answer.data.status);
        if (JSON.stringify(statuses) !== JSON.stringify(page.statuses)) {
          const compare = await EP.api("GET", cfg.urls.compare);
          if (compare.ok) {
            page.statuses = statuses;
            renderCompare(compare.data);
          }
        }
        if (!unfinished(page.statuses)) {
          $("poll-note").hidden = true;
          return;
        }
      }
      setTimeout(poll, cfg.poll_ms);
    }

    renderCompare(EP.readJSON("split-compare"));
    if (page.initiallyUnfinished) setTimeout(poll, cfg.poll_ms);
  }

  const form = $("split-form");
  if (form) initForm(form);
  const cfg = EP.readJSON("split-config");
  if (cfg) initStudy(cfg);
})();
