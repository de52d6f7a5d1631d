/* What every dashboard page shares: the REST API with the session's CSRF token, formatting,
   a small DOM builder, a throttle for redraws, and the live WebSocket (reconnects with
   exponential backoff and jitter; the server answers every connection with a snapshot). */
(function () {
  "use strict";
  const EP = (window.EdgePipe = window.EdgePipe || {});

  EP.csrf = function () {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  };

  /* fetch JSON from the REST API: {ok, status, data}; never throws (a network failure is
     status 0 with a detail saying so). */
  EP.api = async function (method, url, body) {
    const init = {
      method: method,
      credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRFToken": EP.csrf() },
    };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (err) {
      return { ok: false, status: 0, data: { detail: "the server cannot be reached (" + err.message + ")" } };
    }
    let data = null;
    try {
      data = await response.json();
    } catch (err) {
      data = { detail: "the server answered " + response.status + " " + response.statusText };
    }
    return { ok: response.ok, status: response.status, data: data };
  };

  let toastTimer = null;
  EP.toast = function (message, kind) {
    const box = document.getElementById("toast");
    if (!box) return;
    box.textContent = message;
    box.className = "toast" + (kind ? " " + kind : "");
    box.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(function () { box.hidden = true; }, kind === "error" ? 9000 : 4000);
  };

  /* ---------------------------------------------------------------- formatting */
  const fmt = (EP.fmt = {});
  fmt.num = function (x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    const d = digits === undefined ? 3 : digits;
    if (x !== 0 && Math.abs(x) < Math.pow(10, -d)) return x.toExponential(1);
    return Number(x.toPrecision(Math.max(d, 1))).toLocaleString("en-US", { maximumFractionDigits: 6 });
  };
  fmt.seconds = function (s) {
    if (s === null || s === undefined) return "–";
    if (s === 0) return "0 s";
    if (Math.abs(s) < 1e-3) return fmt.num(s * 1e6, 3) + " µs";
    if (Math.abs(s) < 1) return fmt.num(s * 1e3, 3) + " ms";
    if (Math.abs(s) < 120) return fmt.num(s, 3) + " s";
    if (Math.abs(s) < 7200) return fmt.num(s / 60, 3) + " min";
    return fmt.num(s / 3600, 3) + " h";
  };
  fmt.bytes = function (b) {
    if (b === null || b === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    let v = b;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return fmt.num(v, 3) + " " + units[i];
  };
  /* bandwidths are bytes per second throughout EdgePipe */
  fmt.rate = function (bps) {
    if (bps === null || bps === undefined) return "–";
    if (bps >= 1e9) return fmt.num(bps / 1e9, 3) + " GB/s";
    if (bps >= 1e6) return fmt.num(bps / 1e6, 3) + " MB/s";
    if (bps >= 1e3) return fmt.num(bps / 1e3, 3) + " kB/s";
    return fmt.num(bps, 3) + " B/s";
  };
  fmt.ago = function (iso) {
    if (!iso) return "never";
    const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 2) return "just now";
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";
  };
  fmt.when = function (iso) {
    if (!iso) return "–";
    return new Date(iso).toLocaleString();
  };

  /* h("td", {class: "num", title: "x"}, "text", childNode, ...) */
  EP.h = function (tag, attrs) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const key of Object.keys(attrs)) {
        const value = attrs[key];
        if (value === null || value === undefined || value === false) continue;
        if (key === "class") el.className = value;
        else if (key === "text") el.textContent = value;
        else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
        else el.setAttribute(key, value === true ? "" : value);
      }
    }
    for (let i = 2; i < arguments.length; i += 1) {
      const child = arguments[i];
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  };

  /* text for Plotly's strings (labels, legends, hovers, annotations), which take a subset of
     HTML: every name a person or an agent chose goes through this first */
  EP.esc = function (text) {
    return String(text).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  };

  /* "1 stage", "2 stages" (webapp.dashboard.selectors.plural) */
  EP.plural = function (count, word, words) {
    return count + " " + (count === 1 ? word : words || word + "s");
  };

  /* the width in pixels of text in a font ({family, size}), as the page draws it */
  let measure = null;
  EP.textWidth = function (text, font) {
    measure = measure || document.createElement("canvas").getContext("2d");
    measure.font = font.size + "px " + font.family;
    return measure.measureText(String(text)).width;
  };

  /* Show an API 400's errors ({errors: [{field, reason}]}) under the form's fields: each
     under the element data-for="<field>" (the path's head: devices[1] -> devices); a reason
     no field shows goes to the form's error box. */
  EP.showFieldErrors = function (form, box, data) {
    for (const el of form.querySelectorAll("[data-for]")) {
      el.hidden = true;
      el.textContent = "";
      el.closest(".field").classList.remove("has-error");
    }
    box.hidden = true;
    const loose = [];
    for (const error of (data && data.errors) || []) {
      const head = error.field.split(".")[0].split("[")[0];
      const el = form.querySelector('[data-for="' + head + '"]');
      if (!el) { loose.push(error.field + ": " + error.reason); continue; }
      el.textContent = error.reason;
      el.hidden = false;
      el.closest(".field").classList.add("has-error");
    }
    if (!(data && data.errors) && data && data.detail) loose.push(data.detail);
    if (loose.length) { box.textContent = loose.join(" "); box.hidden = false; }
  };

  EP.badge = function (status) {
    return EP.h("span", { class: "badge badge-" + status }, status);
  };

  EP.readJSON = function (id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  };

  /* Run fn at most once every minMs (the last call wins; nothing is lost, only merged). */
  EP.throttle = function (fn, minMs) {
    let last = 0;
    let timer = null;
    return function () {
      if (timer) return;
      const wait = Math.max(0, last + minMs - Date.now());
      timer = setTimeout(function () {
        timer = null;
        last = Date.now();
        window.requestAnimationFrame(fn);
      }, wait);
    };
  };

  /* ---------------------------------------------------------------- live socket */
  const CLOSE_UNAUTHENTICATED = 4401;
  const CLOSE_NOT_FOUND = 4404;

  /* new EP.LiveSocket("/ws/runs/7/", {onMessage(msg), onStatus(status, detail)})
     status: "connecting", "live", "retrying" (detail: seconds until the next try), "gone". */
  EP.LiveSocket = class {
    constructor(path, handlers) {
      this.path = path;
      this.handlers = handlers;
      this.attempt = 0;
      this.ws = null;
      this.stopped = false;
      this.retryTimer = null;
      this.connect();
    }

    url() {
      const scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      return scheme + window.location.host + this.path;
    }

    status(name, detail) {
      if (this.handlers.onStatus) this.handlers.onStatus(name, detail);
    }

    connect() {
      this.status("connecting");
      const ws = (this.ws = new WebSocket(this.url()));
      ws.onopen = () => {
        this.attempt = 0;
        this.status("live");
      };
      ws.onmessage = (message) => {
        let data;
        try {
          data = JSON.parse(message.data);
        } catch (err) {
          return;
        }
        this.handlers.onMessage(data);
      };
      ws.onclose = (event) => {
        if (this.stopped) return;
        if (event.code === CLOSE_UNAUTHENTICATED) {
          window.location.assign("/login/?next=" + encodeURIComponent(window.location.pathname));
          return;
        }
        if (event.code === CLOSE_NOT_FOUND) {
          this.status("gone");
          return;
        }
        const delay = Math.min(30000, 1000 * Math.pow(2, this.attempt)) * (0.5 + Math.random() / 2);
        this.attempt += 1;
        this.status("retrying", Math.round(delay / 1000));
        this.retryTimer = setTimeout(() => this.connect(), delay);
      };
    }

    /* ask for a fresh snapshot (or any message); false when not connected */
    send(message) {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
      this.ws.send(JSON.stringify(message));
      return true;
    }

    close() {
      this.stopped = true;
      clearTimeout(this.retryTimer);
      if (this.ws) this.ws.close();
    }
  };

  /* Show the live connection's state in an element with class "conn". */
  EP.showConnection = function (el) {
    return function (status, detail) {
      if (!el) return;
      el.classList.toggle("live", status === "live");
      el.classList.toggle("retrying", status === "retrying");
      el.textContent = {
        connecting: "connecting…",
        live: "live",
        retrying: "reconnecting in " + detail + " s",
        gone: "no longer exists",
      }[status];
    };
  };

  EP.plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  EP.plotFont = { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 12, color: "#334155" };

  /* A legend in rows above the plot (Plotly widens the top margin to hold them): under the
     plot, at a fraction of its height, it lands on the x axis's title whenever the chart is
     short or the legend wraps. */
  EP.legendAbove = function () {
    return { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom",
             font: { size: 11 }, traceorder: "normal" };
  };

  /* confirm() before submitting forms and buttons marked data-confirm */
  document.addEventListener("submit", function (event) {
    const form = event.target;
    const question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });
})();
