/* The Devices page and a device's page: ws/devices/ gives a snapshot of every device, then a
   "device" event whenever one enrols, sends a heartbeat, changes status, is renamed or
   retired (EdgePipe.live.applyDevices, the server's rule). In the embedded setup the beat
   that marks silent devices offline runs in the worker process, whose events do not reach
   this page: there it asks for a snapshot every 10 s. */
(function () {
  "use strict";
  const EP = window.EdgePipe;
  const h = EP.h;
  const fmt = EP.fmt;
  const cfg = EP.readJSON("devices-config");
  const POLL_EMBEDDED_MS = 10000;

  let snap = EP.readJSON("devices-initial");
  const changedAt = {};
  let showRetired = false;

  const $ = function (id) { return document.getElementById(id); };

  function hardware(d) {
    const hw = d.hardware || {};
    const parts = [];
    for (const key of ["description", "cpu", "machine", "os", "gpu"]) {
      if (hw[key] && typeof hw[key] !== "object") parts.push(String(hw[key]));
    }
    return parts.join(" · ");
  }

  function bandwidth(d) {
    if (d.uplink_bps || d.downlink_bps) {
      return "↑ " + fmt.rate(d.uplink_bps || d.bandwidth_bps) + " ↓ " + fmt.rate(d.downlink_bps || d.bandwidth_bps);
    }
    return fmt.rate(d.bandwidth_bps);
  }

  /* ---------------------------------------------------------------- the Devices page */

  function renderTable() {
    const body = $("devices-body");
    if (!body) return;
    const all = snap.devices;
    const retired = all.filter(function (d) { return d.status === "retired"; });
    const shown = showRetired ? all : all.filter(function (d) { return d.status !== "retired"; });
    const toggle = $("show-retired");
    toggle.hidden = retired.length === 0;
    toggle.textContent = (showRetired ? "Hide" : "Show") + " retired (" + retired.length + ")";
    $("devices-empty").hidden = shown.length > 0;
    $("devices-table").hidden = shown.length === 0;
    const counts = { online: 0, busy: 0, offline: 0 };
    all.forEach(function (d) { if (d.status in counts) counts[d.status] += 1; });
    // "online" as the overview counts it: every device with its agent connected, training or not
    $("devices-summary").textContent = (counts.online + counts.busy) + " online (" + counts.busy +
      " training) · " + counts.offline + " offline";
    body.replaceChildren();
    const now = Date.now();
    for (const d of shown) {
      const fresh = changedAt[d.id] && now - changedAt[d.id] < 1500;
      body.append(h("tr", { class: (d.status === "retired" ? "is-retired" : "") + (fresh ? " flash-row" : ""),
                            "data-device": d.uid },
        h("td", null, h("a", { class: "name", href: cfg.detail_url.replace("{id}", d.id) }, d.name),
          h("div", { class: "muted small mono" }, d.uid)),
        h("td", null, EP.badge(d.status)),
        h("td", { class: "num" }, fmt.num(d.speed, 3) + "×"),
        h("td", { class: "num" }, fmt.bytes(d.memory_bytes)),
        h("td", { class: "num" }, bandwidth(d)),
        h("td", { class: "num" }, fmt.seconds(d.latency_s)),
        h("td", { class: "small" }, hardware(d) || h("span", { class: "muted" }, "–")),
        h("td", { class: "nowrap", title: fmt.when(d.last_heartbeat_at), "data-ago": d.last_heartbeat_at || "" },
          fmt.ago(d.last_heartbeat_at))));
    }
  }

  /* ---------------------------------------------------------------- a device's page */

  function renderDetail() {
    if (!cfg.device) return;
    const d = snap.devices.find(function (x) { return x.id === cfg.device; });
    if (!d) return;
    const badge = $("device-status");
    badge.className = "badge badge-" + d.status;
    badge.textContent = d.status;
    const beat = $("device-heartbeat");
    beat.setAttribute("data-ago", d.last_heartbeat_at || "");
    beat.title = fmt.when(d.last_heartbeat_at);
    beat.textContent = fmt.ago(d.last_heartbeat_at);
    $("device-name").textContent = d.name;
  }

  function render() {
    renderTable();
    renderDetail();
  }

  const rerender = EP.throttle(render, 250);

  let onProfiling = null;  // set while this device's page waits for a profile

  function onMessage(msg) {
    if (msg.type === "profiling") {
      if (onProfiling && msg.device === cfg.device) onProfiling(msg);
      return;
    }
    if (msg.type === "snapshot") {
      snap = msg;
    } else if (msg.type === "device") {
      snap = EP.live.applyDevices(snap, msg);
      changedAt[msg.device.id] = Date.now();
    } else {
      return;
    }
    rerender();
  }

  const socket = new EP.LiveSocket("/ws/devices/", { onMessage: onMessage, onStatus: EP.showConnection($("conn")) });
  if (cfg.embedded) setInterval(function () { socket.send({ type: "snapshot" }); }, POLL_EMBEDDED_MS);

  // the "last heartbeat" column counts up between events
  setInterval(function () {
    for (const el of document.querySelectorAll("[data-ago]")) {
      el.textContent = fmt.ago(el.getAttribute("data-ago") || null);
    }
  }, 1000);

  const toggle = $("show-retired");
  if (toggle) toggle.addEventListener("click", function () { showRetired = !showRetired; render(); });

  const copy = $("copy-commands");
  if (copy) {
    copy.addEventListener("click", function () {
      const text = Array.from(document.querySelectorAll("#commands code")).map(function (c) { return c.textContent; }).join("\n");
      const done = function () { EP.toast("Commands copied"); };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () { EP.toast("Select the commands and copy them", "error"); });
      } else {
        const range = document.createRange();
        range.selectNodeContents($("commands"));
        window.getSelection().removeAllRanges();
        window.getSelection().addRange(range);
        EP.toast("Selected: press Ctrl+C to copy");
      }
    });
  }

  /* ---------------------------------------------------------------- links */

  let links = EP.readJSON("device-links") || [];
  function renderLinks() {
    const body = $("links-body");
    if (!body) return;
    $("links-table").hidden = links.length === 0;
    $("links-empty").hidden = links.length > 0;
    body.replaceChildren();
    for (const link of links) {
      body.append(h("tr", null, h("td", null, link.source_name), h("td", null, link.target_name),
        h("td", { class: "num" }, fmt.rate(link.bandwidth_bps)), h("td", { class: "num" }, fmt.seconds(link.latency_s)),
        h("td", { class: "small muted", "data-ago": link.measured_at }, fmt.ago(link.measured_at))));
    }
  }
  renderLinks();

  const measure = $("measure-links");
  if (measure) {
    measure.addEventListener("click", async function () {
      const ids = snap.devices.filter(function (d) { return d.status === "online" || d.status === "busy"; })
        .map(function (d) { return d.id; });
      const answer = await EP.api("POST", cfg.links_url, { devices: ids });
      if (!answer.ok) { EP.toast(answer.data.detail, "error"); return; }
      EP.toast("Asked " + answer.data.devices.length + " devices to measure their links");
      let tries = 20;
      const poll = setInterval(async function () {
        const fresh = await EP.api("GET", cfg.links_url);
        if (fresh.ok) {
          links = fresh.data.map(function (l) {
            const name = function (uid) {
              const d = snap.devices.find(function (x) { return x.uid === uid; });
              return d ? d.name : uid;
            };
            return Object.assign({ source_name: name(l.source), target_name: name(l.target) }, l);
          });
          renderLinks();
        }
        if ((tries -= 1) <= 0) clearInterval(poll);
      }, 3000);
    });
  }

  /* ---------------------------------------------------------------- profiling */

  const profileForm = $("profile-form");
  if (profileForm) {
    const specPick = $("id_model_spec");
    const newSpec = function () {
      for (const el of profileForm.querySelectorAll(".new-spec")) el.hidden = Boolean(specPick.value);
    };
    specPick.addEventListener("change", newSpec);
    newSpec();
    $("profile-open").addEventListener("click", function () { profileForm.hidden = !profileForm.hidden; });
    profileForm.addEventListener("submit", async function (event) {
      event.preventDefault();
      const box = $("profile-error");
      let spec = specPick.value;
      if (!spec) {
        const batch = Number(profileForm.batch_size.value);
        const made = await EP.api("POST", cfg.specs_url, {
          model: profileForm.model.value.trim(), dataset: profileForm.dataset.value.trim(),
          batch_size: Number.isInteger(batch) && profileForm.batch_size.value !== "" ? batch : profileForm.batch_size.value,
        });
        if (!made.ok) { EP.showFieldErrors(profileForm, box, made.data); return; }
        spec = made.data.id;
      }
      const measuredAt = async function () {
        const found = await EP.api("GET", cfg.profiles_url);
        const p = found.ok ? found.data.find(function (x) { return x.model_spec === Number(spec); }) : null;
        return p ? p.measured_at : null;
      };
      const before = await measuredAt();
      const answer = await EP.api("POST", cfg.profile_url, { model_spec: Number(spec) });
      if (!answer.ok) { EP.showFieldErrors(profileForm, box, answer.data); return; }
      EP.showFieldErrors(profileForm, box, null);
      profileForm.hidden = true;
      const waiting = $("profile-waiting");
      waiting.hidden = false;
      waiting.classList.remove("error");
      waiting.textContent = "Asked the agent to profile the model: it runs every layer forward and backward. " +
        "The chart appears here when the profile arrives.";
      const poll = setInterval(async function () {
        const now = await measuredAt();
        if (now && now !== before) {
          clearInterval(poll);
          window.location.reload();
        }
      }, 3000);
      onProfiling = function (msg) {
        if (msg.state === "running") {
          const percent = msg.total > 0 ? Math.floor((100 * msg.done) / msg.total) : 0;
          waiting.textContent = "Profiling " + msg.model + ": " + percent + "% done.";
        } else if (msg.state === "stored") {
          clearInterval(poll);
          window.location.reload();
        } else if (msg.state === "failed") {
          clearInterval(poll);
          onProfiling = null;
          waiting.classList.add("error");
          waiting.textContent = "Profiling " + msg.model + " failed: " + msg.error;
        }
      };
    });
  }

  EP.devicesPage = { state: function () { return snap; }, socket: socket };
  render();

  /* ---------------------------------------------------------------- the profile chart */

  const profiles = EP.readJSON("device-profiles");
  const pick = $("profile-pick");
  function renderProfile() {
    if (!profiles || !profiles.length) return;
    const p = profiles.find(function (x) { return String(x.id) === pick.value; }) || profiles[0];
    // category labels are markup to Plotly: a layer's name is the profile's text, escaped
    const names = p.layers.map(function (la, i) { return EP.esc(i + " " + la.name); });
    const kinds = p.layers.map(function (la) { return la.kind; });
    const trace = function (key, name, color) {
      return {
        type: "bar", name: name, x: names, marker: { color: color }, customdata: kinds.map(EP.esc),
        y: p.layers.map(function (la) { return la[key] * 1000; }),
        hovertemplate: "%{x} (%{customdata})<br>" + name + ": %{y:.3f} ms<extra></extra>",
      };
    };
    $("profile-total").textContent = "forward " + fmt.seconds(p.forward_s) + " · backward " +
      fmt.seconds(p.backward_s) + " per micro-batch · measured " + fmt.when(p.measured_at) +
      (p.overhead_s === null ? "" : " · in its last run: " + fmt.seconds(p.overhead_s) +
        " fixed per micro-batch" + (p.message_s === null ? "" : ", " + fmt.seconds(p.message_s) +
        " per message sent"));
    Plotly.react($("profile-chart"), [trace("forward_s", "forward", EP.charts.KINDS.forward.color),
                                      trace("backward_s", "backward", EP.charts.KINDS.backward.color)], {
      barmode: "group", height: 340, font: EP.plotFont, margin: { l: 60, r: 16, t: 8, b: 90 },
      xaxis: { tickangle: -40, automargin: true, type: "category" },
      yaxis: { title: { text: "ms per micro-batch", font: { size: 11 } }, gridcolor: "#eef2f7" },
      legend: { orientation: "h", y: 1.08 }, plot_bgcolor: "#fff", paper_bgcolor: "#fff",
    }, EP.plotConfig);
  }
  if (pick) {
    pick.addEventListener("change", renderProfile);
    renderProfile();
  }
})();
