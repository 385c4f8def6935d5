// The gpufleet dashboard: lists of clusters and jobs, one job's progress, cost, diagnosis,
// events and live charts. Plain JS and SVG, no libraries: the page must work offline.
"use strict";

(() => {
  const JOB_POLL_MS = 500;       // a running job: detail and new series points
  const ENDED_POLL_MS = 5000;    // an ended job: only the detail (late findings, events)
  const LIST_POLL_MS = 3000;
  const OVERLAP_S = 5;           // re-ask this much history: samples are stored up to ~1 s late
  const MAX_KEEP = 6000;         // per line; older points are thinned beyond it
  const GAP_S = 15;              // a longer silence breaks the line
  const ACTIVE = new Set(["starting", "running", "restarting", "resizing"]);
  const COLORS = ["#5aa2ff", "#f5a524", "#3ecf8e", "#ef6b73", "#b48cf2", "#2dd4bf", "#f778ba",
    "#c9d1d9", "#e3b341", "#79c0ff"];

  // One chart per entry. `unit` picks the axis scale; `only`: labels to draw (default: all).
  const CHARTS = [
    { id: "job_samples_per_second", title: "Throughput", metrics: ["job_samples_per_second"],
      unit: "samples", only: ["job"] },
    { id: "loss", title: "Loss (rank 0)", metrics: ["loss"], unit: "plain", rank0: true,
      fromZero: false, smooth: 0.9 },
    { id: "gpu_utilization", title: "Device utilization", metrics: ["gpu_utilization"],
      unit: "pct", fixed: [0, 100] },
    { id: "gpu_memory_used_bytes", title: "Device memory used", metrics: ["gpu_memory_used_bytes"],
      unit: "bytes" },
    { id: "comm_seconds", title: "Communication time per step", metrics: ["comm_seconds"],
      unit: "seconds" },
    { id: "comm_bandwidth_bytes_per_second", title: "All-reduce bus bandwidth",
      metrics: ["comm_bandwidth_bytes_per_second"], unit: "bw" },
    { id: "step_time_seconds", title: "Step time vs data wait, per rank",
      metrics: ["step_time_seconds", "data_wait_seconds"], names: ["step", "data wait"],
      unit: "seconds", wide: true },
  ];
  const SERIES_NAMES = [...new Set(CHARTS.flatMap((c) => c.metrics))].join(",");

  const $ = (id) => document.getElementById(id);
  const sel = { kind: null, name: null };  // what is shown: a job, or a cluster with no job
  const seriesByJob = new Map();           // job -> {data: {metric: {label: [[t, v]]}}, maxT, now, final}
  let lists = { jobs: [], clusters: [] };
  let detail = null;                       // the shown job's /api/jobs/{name}
  let halted = false;                      // after a 401: nothing more to ask
  let jobTimer = null;
  let jobGen = 0;
  const charts = {};

  // ---- formatting ---------------------------------------------------------------------------
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const num = (v, digits = 0, fixed = true) => v == null || !isFinite(v) ? "-"
    : v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: fixed ? digits : 0 });

  function usd(v) {
    if (v == null || !isFinite(v)) return "-";
    if (v === 0) return "$0.00";
    // small amounts keep enough digits that a few seconds of billing show
    return "$" + (v < 0.01 ? v.toFixed(6) : v < 100 ? v.toFixed(4) : num(v, 2));
  }

  function duration(s) {
    if (s == null || !isFinite(s)) return "-";
    s = Math.max(0, Math.round(s));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor(s / 3600) % 24}h`;
  }

  function clock(t) {
    const d = new Date(t * 1000);
    const time = d.toLocaleTimeString("en-GB", { hour12: false });
    return d.toDateString() === new Date().toDateString() ? time
      : `${d.toLocaleDateString("en-CA")} ${time}`;
  }

  function mmss(s) {  // an elapsed-time tick: 0:45, 12:30, 1:05:00
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60, sec = String(s % 60).padStart(2, "0");
    return h ? `${h}:${String(m).padStart(2, "0")}:${sec}` : `${m}:${sec}`;
  }

  // The display scale of an axis: values are divided by `div` and shown in `name`.
  function scaleFor(unit, maxAbs) {
    switch (unit) {
      case "pct": return { div: 0.01, name: "%" };  // stored as a 0..1 ratio
      case "samples": return maxAbs >= 1e4 ? { div: 1e3, name: "k samples/s" } : { div: 1, name: "samples/s" };
      case "bytes":
        if (maxAbs >= 2 ** 30) return { div: 2 ** 30, name: "GiB" };
        return maxAbs >= 2 ** 20 ? { div: 2 ** 20, name: "MiB" } : { div: 2 ** 10, name: "KiB" };
      case "seconds": return maxAbs >= 1 ? { div: 1, name: "s" } : { div: 1e-3, name: "ms" };
      case "bw":
        if (maxAbs >= 1e9) return { div: 1e9, name: "GB/s" };
        return maxAbs >= 1e6 ? { div: 1e6, name: "MB/s" } : { div: 1e3, name: "kB/s" };
      default: return { div: 1, name: "" };
    }
  }

  function shown(v, scale) {  // one value with its unit, e.g. "314 MiB", "7%"
    const x = v / scale.div, a = Math.abs(x);
    const digits = a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3;
    return num(x, digits, false) + (scale.name === "%" ? "%" : scale.name ? " " + scale.name : "");
  }

  function niceStep(range, count) {
    const raw = range / Math.max(1, count), p = 10 ** Math.floor(Math.log10(raw)), f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }

  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
    21600, 43200, 86400];

  // ---- the network --------------------------------------------------------------------------
  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function get(path) {
    let r;
    try {
      r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (e) {
      throw new HttpError(0, "cannot reach the dashboard server");
    }
    if (!r.ok) {
      let msg = r.statusText;
      try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
      throw new HttpError(r.status, msg);
    }
    return r.json();
  }

  function banner(text, kind) {
    const b = $("banner");
    b.hidden = !text;
    b.className = "banner " + (kind || "");
    b.textContent = text || "";
  }

  function failed(e) {
    if (e.status === 401) {
      halted = true;
      clearTimeout(jobTimer);
      banner("Not authorized (401): this dashboard needs its access token. Open the exact address `gpufleet dashboard` " +
        "printed (it ends in ?token=…); the token is also in $GPUFLEET_HOME/dashboard-token.", "auth");
      document.body.classList.add("locked");
    } else if (e.status === 0) {
      banner("Cannot reach the dashboard server (stopped?). Retrying…", "warn");
    } else {
      banner(`The server answered ${e.status}: ${e.message}`, "warn");
    }
  }

  // ---- lists --------------------------------------------------------------------------------
  async function pollLists() {
    if (halted) return;
    try {
      const [clusters, jobs] = await Promise.all([get("/api/clusters?all=true"), get("/api/jobs")]);
      lists = { clusters, jobs };
      if (!$("banner").classList.contains("auth")) banner("");
      if (sel.kind === null) choose(initial());
      $("empty").hidden = sel.kind !== null;
      renderLists();
      if (sel.kind === "cluster") renderCluster();
    } catch (e) {
      failed(e);
    }
    if (!halted) setTimeout(pollLists, LIST_POLL_MS);
  }

  function initial() {
    const hash = decodeURIComponent(location.hash.slice(1));
    const [kind, name] = hash.includes("=") ? hash.split(/=(.*)/s) : [null, hash];
    const want = name || window.GPUFLEET_FOCUS || "";
    if (want) {
      const c = lists.clusters.find((x) => x.name === want);
      if (kind !== "cluster" && (lists.jobs.some((j) => j.job === want) || !c)) return { kind: "job", name: want };
      if (c) return c.job ? { kind: "job", name: c.job } : { kind: "cluster", name: c.name };
    }
    if (lists.jobs.length) return { kind: "job", name: lists.jobs[0].job };
    if (lists.clusters.length) return { kind: "cluster", name: lists.clusters[0].name };
    return { kind: null, name: null };
  }

  function choose(s) {
    if (s.kind === sel.kind && s.name === sel.name) return;
    Object.assign(sel, s);
    // keep the choice across reloads, and drop ?token= from the address bar (the cookie has it)
    history.replaceState(null, "", location.pathname + (s.kind ? `#${s.kind}=${encodeURIComponent(s.name)}` : ""));
    detail = null;
    $("empty").hidden = s.kind !== null;
    $("job-view").hidden = s.kind !== "job";
    $("cluster-view").hidden = s.kind !== "cluster";
    if (s.kind === "job") {
      buildCharts();
      pollJob();
    } else {
      clearTimeout(jobTimer);
      jobGen++;
      renderCluster();
    }
    renderLists();
  }

  function renderLists() {
    const shownCluster = sel.kind === "cluster" ? sel.name : detail?.cluster;
    $("jobs").innerHTML = lists.jobs.map((j) => {
      const pct = j.total_steps ? Math.min(100, 100 * (j.step || 0) / j.total_steps) : 0;
      return `<li class="item${sel.kind === "job" && sel.name === j.job ? " sel" : ""}" data-kind="job"
          data-name="${esc(j.job)}" title="${esc(j.layout || "")}">
        <div class="r1"><span class="dot st-${esc(j.status)}"></span><b>${esc(j.job)}</b>
          <span class="right">${usd(j.cost_usd)}</span></div>
        <div class="r2">${esc(j.gpu)} × ${esc(j.world_size)} · ${esc(j.step ?? 0)}/${esc(j.total_steps ?? "?")}
          · ${j.status === "running" && j.samples_per_s != null ? num(j.samples_per_s) + "/s" : esc(j.status)}</div>
        <div class="mini"><div style="width:${pct}%"></div></div></li>`;
    }).join("") || `<li class="muted">none yet</li>`;
    $("clusters").innerHTML = lists.clusters.map((c) => `<li class="item${c.name === shownCluster ? " sel" : ""}"
        data-kind="cluster" data-name="${esc(c.name)}">
        <div class="r1"><span class="dot st-${esc(c.status)}"></span><b>${esc(c.name)}</b>
          <span class="right">${usd(c.cost_usd)}</span></div>
        <div class="r2">${esc(c.gpu)} × ${esc(c.count)} · ${esc(c.network)} · $${num(c.usd_per_hour, 2)}/h</div>
        <div class="r2">${c.job ? `job ${esc(c.job)} (${esc(c.job_status)})` : "no job"} · ${esc(c.status)}</div>
      </li>`).join("") || `<li class="muted">none</li>`;
  }

  function onListClick(ev) {
    const li = ev.target.closest("li.item");
    if (!li) return;
    const name = li.dataset.name;
    if (li.dataset.kind === "job") return choose({ kind: "job", name });
    const c = lists.clusters.find((x) => x.name === name);
    choose(c && c.job ? { kind: "job", name: c.job } : { kind: "cluster", name });
  }

  function renderCluster() {
    const c = lists.clusters.find((x) => x.name === sel.name);
    if (!c) return;
    $("c-name").textContent = c.name;
    setBadge($("c-status"), c.status);
    const cells = [["Devices", `${c.gpu} × ${c.count}` + (c.nodes > 1 ? ` on ${c.nodes} nodes` : "")],
      ["Network", c.network], ["Device ids", (c.devices || []).join(", ")],
      ["Price book", c.price_book || "-"], ["Rate", `$${num(c.usd_per_hour, 4)}/h`],
      ["Cost so far", usd(c.cost_usd)], ["Started", c.started_at ? clock(c.started_at) : "-"],
      ["Stopped", c.stopped_at ? clock(c.stopped_at) : "-"]];
    $("c-stats").innerHTML = cells.map(([k, v]) =>
      `<div class="stat"><span class="label">${k}</span><span class="value small">${esc(v)}</span></div>`).join("");
  }

  function setBadge(el, status) {
    el.textContent = status;
    el.className = "badge st-" + status;
  }

  // ---- one job ------------------------------------------------------------------------------
  async function pollJob() {
    clearTimeout(jobTimer);
    if (halted || sel.kind !== "job") return;
    const gen = ++jobGen, name = sel.name;
    let delay = JOB_POLL_MS;
    try {
      const d = await get(`/api/jobs/${encodeURIComponent(name)}`);
      if (gen !== jobGen) return;
      const active = ACTIVE.has(d.status);
      const st = seriesState(name);
      if (!st.final) {
        await fetchSeries(name, st);
        if (!active) st.final = true;  // one fetch after the end has everything
      }
      if (gen !== jobGen) return;
      const first = detail === null;
      detail = d;
      if (first) renderLists();  // now the job's cluster can be marked too
      if (!$("banner").classList.contains("auth")) banner("");
      renderJob();
      renderCharts();
      delay = active ? JOB_POLL_MS : ENDED_POLL_MS;
    } catch (e) {
      if (gen !== jobGen) return;
      if (e.status === 404) {
        $("j-name").textContent = name;
        $("j-reason").hidden = false;
        $("j-reason").textContent = `No job called '${name}': ${e.message}`;
      }
      failed(e);
      delay = LIST_POLL_MS;
    }
    if (!halted && gen === jobGen) jobTimer = setTimeout(pollJob, delay);
  }

  function seriesState(name) {
    if (!seriesByJob.has(name)) seriesByJob.set(name, { data: {}, maxT: 0, now: 0, final: false });
    return seriesByJob.get(name);
  }

  async function fetchSeries(name, st) {
    const since = st.maxT ? st.maxT - OVERLAP_S : 0;
    const r = await get(`/api/jobs/${encodeURIComponent(name)}/series?since=${since}&names=${SERIES_NAMES}`);
    st.now = r.now;
    for (const [metric, byLabel] of Object.entries(r.series)) {
      const m = (st.data[metric] ||= {});
      for (const [label, points] of Object.entries(byLabel)) {
        const line = (m[label] ||= []);
        const last = line.length ? line[line.length - 1][0] : -Infinity;
        for (const p of points) {
          if (p[0] > last) line.push(p);  // the overlap repeats points we have
          if (p[0] > st.maxT) st.maxT = p[0];
        }
        if (line.length > MAX_KEEP) thin(line);
      }
    }
  }

  function thin(line) {  // halve the older points, keep the newest quarter whole
    const keep = Math.floor(MAX_KEEP / 4), old = line.length - keep;
    const out = line.slice(0, old).filter((_, i) => i % 2 === 0);
    line.splice(0, old, ...out);
  }

  function renderJob() {
    const d = detail;
    $("j-name").textContent = d.job;
    setBadge($("j-status"), d.status);
    $("j-layout").textContent = d.layout || "";
    const c = d.cluster_info || {};
    $("j-cluster").textContent = `on ${d.cluster}: ${d.gpu} × ${c.count ?? d.world_size}` +
      (c.network ? `, ${c.network}` : "") + (d.price_book ? `, ${d.price_book} prices` : "");
    const pct = d.total_steps ? Math.min(100, 100 * (d.step || 0) / d.total_steps) : 0;
    $("progress-bar").style.width = pct + "%";
    $("progress-bar").className = "st-" + d.status;
    $("step").textContent = `step ${num(d.step ?? 0)} / ${d.total_steps ? num(d.total_steps) : "?"}` +
      (d.total_steps ? `  (${pct.toFixed(1)}%)` : "");
    $("samples-per-s").textContent = d.samples_per_s == null ? "-" : num(d.samples_per_s);
    $("loss").textContent = d.loss == null ? "-" : num(d.loss, 4, false);
    $("first-loss").textContent = d.first_loss == null ? "" : `first ${num(d.first_loss, 4, false)}`;
    $("elapsed").textContent = duration(d.elapsed_s);
    $("eta").textContent = ACTIVE.has(d.status) ? duration(d.eta_s) : "-";
    $("eta-at").textContent = ACTIVE.has(d.status) && d.eta_s != null ? `about ${clock(d.now + d.eta_s)}` : "";
    $("cost").textContent = usd(d.cost_usd);
    $("projected-cost").textContent = usd(d.projected_cost_usd);
    $("rate").textContent = `$${num(d.usd_per_hour, 4)}/h`;
    const reason = !ACTIVE.has(d.status) && d.reason ? d.reason : "";
    $("j-reason").hidden = !reason;
    $("j-reason").textContent = reason;
    $("j-reason").className = "reason st-" + d.status;
    renderFindings(d.findings || [], ACTIVE.has(d.status));
    renderEvents(d.events || []);
  }

  function renderFindings(list, running) {
    const el = $("findings");
    if (!list.length) {
      el.innerHTML = `<div class="ok">No problems found</div>`;
      return;
    }
    el.innerHTML = list.map((f) => `<div class="finding sev-${esc(f.severity)}${f.active ? "" : " cleared"}"
        data-rule="${esc(f.rule)}">
      <div class="f-head"><span class="sev">${esc(f.severity)}</span><b>${esc(f.title)}</b>
        ${f.subject ? `<span class="subject">${esc(f.subject)}</span>` : ""}
        <span class="when">${!f.active ? "cleared, last seen " + clock(f.last_seen)
          : running ? "since " + clock(f.first_seen) : `${clock(f.first_seen)} to the end`}</span></div>
      <div class="detail">${esc(f.detail)}</div>
      <div class="fix"><b>Try:</b> ${esc(f.fix)}</div></div>`).join("");
  }

  function renderEvents(events) {
    $("events").innerHTML = events.slice().reverse().map((e) =>
      `<li><span class="time">${clock(e.time)}</span><span class="kind k-${esc(e.kind)}">${esc(e.kind)}</span>
        <span class="why">${esc(e.reason || "")}</span></li>`).join("") || `<li class="muted">no events</li>`;
  }

  // ---- charts -------------------------------------------------------------------------------
  function buildCharts() {
    const box = $("charts");
    box.innerHTML = CHARTS.map((c) => `<section class="card${c.wide ? " wide" : ""}" id="card-${c.id}">
        <header><h3>${esc(c.title)}</h3><span class="note"></span><span class="now"></span></header>
        <div class="legend"></div>
        <svg data-chart="${c.id}" class="chart" role="img" aria-label="${esc(c.title)}"></svg>
      </section>`).join("");
    for (const c of CHARTS) {
      const card = $("card-" + c.id);
      const chart = { def: c, card, svg: card.querySelector("svg"), lines: [], hoverX: null };
      chart.svg.addEventListener("mousemove", (ev) => { chart.hoverX = ev.offsetX; hover(chart, ev); });
      chart.svg.addEventListener("mouseleave", () => { chart.hoverX = null; $("tip").hidden = true; hover(chart); });
      charts[c.id] = chart;
    }
  }

  const naturally = (a, b) => a.localeCompare(b, "en", { numeric: true });

  function linesOf(def, data) {
    const out = [];
    const labels = [...new Set(def.metrics.flatMap((m) => Object.keys(data[m] || {})))].sort(naturally);
    let keep = def.only ? labels.filter((l) => def.only.includes(l)) : labels;
    if (def.rank0) keep = keep.includes("rank 0") ? ["rank 0"] : keep.slice(0, 1);
    def.metrics.forEach((m, mi) => keep.forEach((label, li) => {
      const points = (data[m] || {})[label];
      if (!points || !points.length) return;
      const name = def.metrics.length > 1 ? `${label} ${def.names[mi]}` : label;
      out.push({ metric: m, label, name, points, color: COLORS[li % COLORS.length], dash: mi > 0 });
    }));
    return out;
  }

  function renderCharts() {
    if (!detail) return;
    const st = seriesState(detail.job);
    // every chart shares one time axis: from the job's start to now (or its last sample)
    let first = Infinity;
    for (const byLabel of Object.values(st.data)) {
      for (const line of Object.values(byLabel)) if (line.length) first = Math.min(first, line[0][0]);
    }
    const started = (detail.events || []).find((e) => e.kind === "running") || (detail.events || [])[0];
    const x0 = Math.min(first, started ? started.time : Infinity);
    const x1 = ACTIVE.has(detail.status) ? Math.max(st.now, st.maxT) : st.maxT;
    for (const def of CHARTS) draw(charts[def.id], linesOf(def, st.data), x0, x1);
    const total = Object.values(detail.latest || {}).find((v) => v.gpu_memory_total_bytes)?.gpu_memory_total_bytes;
    charts.gpu_memory_used_bytes.card.querySelector(".note").textContent =
      total ? `of ${shown(total, scaleFor("bytes", total))} each` : "";
  }

  function draw(chart, lines, x0, x1) {
    const { def, svg, card } = chart;
    const W = Math.max(240, svg.clientWidth || card.clientWidth - 24), H = 190;
    const m = { l: 56, r: 14, t: 12, b: 30 }, pw = W - m.l - m.r, ph = H - m.t - m.b;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("height", H);
    chart.lines = lines;
    const legend = card.querySelector(".legend"), now = card.querySelector(".now");
    if (!lines.length || !(x1 > x0) || !isFinite(x0)) {
      svg.innerHTML = `<text class="nodata" x="${W / 2}" y="${H / 2}">no data yet</text>`;
      legend.innerHTML = "";
      now.textContent = "";
      chart.geom = null;
      return;
    }
    let lo = Infinity, hi = -Infinity;
    for (const ln of lines) for (const p of ln.points) { if (p[1] < lo) lo = p[1]; if (p[1] > hi) hi = p[1]; }
    const scale = scaleFor(def.unit, Math.max(Math.abs(lo), Math.abs(hi)));
    lo /= scale.div; hi /= scale.div;
    if (def.fixed) [lo, hi] = [Math.min(def.fixed[0], lo), Math.max(def.fixed[1], hi)];
    else if (def.fromZero !== false) lo = Math.min(0, lo);
    if (hi - lo < 1e-12) { hi += Math.abs(hi) * 0.1 || 1; lo -= def.fromZero === false ? Math.abs(lo) * 0.1 || 1 : 0; }
    const step = niceStep(hi - lo, 4);
    if (!def.fixed) { lo = Math.floor(lo / step) * step; hi = Math.ceil(hi / step) * step; }
    const X = (t) => m.l + (t - x0) / (x1 - x0) * pw;
    const Y = (v) => m.t + ph - (v / scale.div - lo) / (hi - lo) * ph;
    chart.geom = { X, x0, x1, m, pw, scale };

    const parts = [];
    const decimals = Math.max(0, Math.min(3, -Math.floor(Math.log10(step) + 1e-9)));
    for (let v = lo; v <= hi + step * 1e-6; v += step) {
      const y = m.t + ph - (v - lo) / (hi - lo) * ph;
      parts.push(`<line class="grid" x1="${m.l}" x2="${m.l + pw}" y1="${y}" y2="${y}"/>`,
        `<text class="tick y" x="${m.l - 6}" y="${y + 4}">${num(v, decimals)}</text>`);
    }
    const span = x1 - x0, maxTicks = Math.max(2, Math.floor(pw / 70));
    const tstep = TIME_STEPS.find((s) => span / s <= maxTicks) || Math.ceil(span / maxTicks / 86400) * 86400;
    for (let s = 0; s <= span + 1e-6; s += tstep) {
      const x = X(x0 + s);
      parts.push(`<line class="xtick" x1="${x}" x2="${x}" y1="${m.t + ph}" y2="${m.t + ph + 4}"/>`,
        `<text class="tick x" x="${x}" y="${m.t + ph + 16}">${mmss(s)}</text>`);
    }
    parts.push(`<line class="axis" x1="${m.l}" x2="${m.l + pw}" y1="${m.t + ph}" y2="${m.t + ph}"/>`,
      `<line class="axis" x1="${m.l}" x2="${m.l}" y1="${m.t}" y2="${m.t + ph}"/>`,
      `<text class="unit" x="${m.l + 4}" y="${m.t + 10}">${esc(scale.name)}</text>`,
      `<text class="unit xu" x="${m.l + pw}" y="${H - 2}">time since start (m:ss)</text>`);
    for (const ln of lines) {
      const pts = ln.points, stride = Math.max(1, Math.ceil(pts.length / (pw * 1.5)));
      let d = "", prevT = -Infinity;
      for (let i = 0; i < pts.length; i += stride) {
        const p = i + stride >= pts.length ? pts[pts.length - 1] : pts[i];
        d += `${p[0] - prevT > GAP_S ? "M" : "L"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
        prevT = p[0];
        if (p === pts[pts.length - 1]) break;
      }
      parts.push(`<path d="${d}" stroke="${ln.color}" class="line${ln.dash ? " dash" : ""}${def.smooth ? " raw" : ""}"
        data-points="${pts.length}" data-series="${esc(ln.metric)}/${esc(ln.label)}"/>`);
      if (def.smooth) parts.push(`<path d="${smoothed(pts, def.smooth, X, Y)}" stroke="${ln.color}" class="line"/>`);
      const end = pts[pts.length - 1];
      parts.push(`<circle cx="${X(end[0]).toFixed(1)}" cy="${Y(end[1]).toFixed(1)}" r="2.5" fill="${ln.color}"/>`);
    }
    parts.push(`<line class="guide" y1="${m.t}" y2="${m.t + ph}" visibility="hidden"/>`);
    svg.innerHTML = parts.join("");

    const latest = (ln) => shown(ln.points[ln.points.length - 1][1], scale);
    now.textContent = lines.length === 1 ? latest(lines[0]) : "";
    legend.innerHTML = lines.length > 1 ? lines.map((ln) => `<span class="key">
        <svg width="18" height="8"><line x1="0" x2="18" y1="4" y2="4" stroke="${ln.color}"
          class="${ln.dash ? "dash" : ""}" stroke-width="2"/></svg>${esc(ln.name)}
        <b>${latest(ln)}</b></span>`).join("") : "";
    if (chart.hoverX != null) hover(chart);
  }

  // An exponential moving average (as TensorBoard smooths a noisy per-step loss).
  function smoothed(pts, weight, X, Y) {
    let d = "", avg = pts[0][1];
    const stride = Math.max(1, Math.floor(pts.length / 1000));
    pts.forEach((p, i) => {
      avg = weight * avg + (1 - weight) * p[1];
      if (i % stride === 0 || i === pts.length - 1) d += `${d ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(avg).toFixed(1)}`;
    });
    return d;
  }

  function nearest(points, t) {
    let a = 0, b = points.length - 1;
    while (b - a > 1) { const mid = (a + b) >> 1; if (points[mid][0] < t) a = mid; else b = mid; }
    return Math.abs(points[a][0] - t) <= Math.abs(points[b][0] - t) ? points[a] : points[b];
  }

  function hover(chart, ev) {
    const guide = chart.svg.querySelector(".guide"), tip = $("tip"), g = chart.geom;
    if (!guide || !g || chart.hoverX == null || chart.hoverX < g.m.l || chart.hoverX > g.m.l + g.pw) {
      if (guide) guide.setAttribute("visibility", "hidden");
      tip.hidden = true;
      return;
    }
    const t = g.x0 + (chart.hoverX - g.m.l) / g.pw * (g.x1 - g.x0);
    guide.setAttribute("x1", chart.hoverX);
    guide.setAttribute("x2", chart.hoverX);
    guide.setAttribute("visibility", "visible");
    tip.innerHTML = `<div class="t">${mmss(t - g.x0)} · ${clock(t)}</div>` + chart.lines.map((ln) =>
      `<div><i style="background:${ln.color}"></i>${esc(ln.name)}: <b>${shown(nearest(ln.points, t)[1], g.scale)}</b></div>`).join("");
    tip.hidden = false;
    if (ev) {
      tip.style.left = Math.min(ev.pageX + 14, window.scrollX + window.innerWidth - tip.offsetWidth - 8) + "px";
      tip.style.top = ev.pageY + 14 + "px";
    }
  }

  // ---- start --------------------------------------------------------------------------------
  $("jobs").addEventListener("click", onListClick);
  $("clusters").addEventListener("click", onListClick);
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(renderCharts, 150);
  });
  pollLists();
})();
