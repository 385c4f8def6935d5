// The gpufleet dashboard: lists of clusters and jobs, one job's progress, cost, diagnosis,
// events and live charts. Plain JS and SVG, no libraries: the page must work offline.
"use strict";

(() => {
  const JOB_POLL_MS = 500;       // a running job: detail and new series points
  const ENDED_POLL_MS = 5000;    // an ended job: only the detail (late findings, events)
  const LIST_POLL_MS = 3000;
  const OVERLAP_S = 5;           // re-ask this much history: samples are stored up to ~1 s late
  const MAX_KEEP = 6000;         // per line; older points are thinned beyond it
  const ACTIVE = new Set(["starting", "running", "restarting", "resizing"]);

  const $ = (id) => document.getElementById(id);
  const sel = { kind: null, name: null };  // what is shown: a job, or a cluster with no job
  const seriesByJob = new Map();           // job -> {data: {metric: {label: [[t, v, step]]}}, maxT, now, final}
  let lists = { jobs: [], clusters: [] };
  let detail = null;                       // the shown job's /api/jobs/{name}
  let halted = false;                      // after a 401: nothing more to ask
  let jobTimer = null;
  let jobGen = 0;

  // ---- formatting (chart.js has the rest) -------------------------------------------------
  const { esc, num, clock, usd } = GF;
  const { throughput, lossText } = GF;  // the same text as the charts' headers
  // behind a team server (team.js, loaded only there): sign-in, the Queue and Usage panels
  const TEAM = window.GFTeam || null;

  function duration(s) {
    if (s == null || !isFinite(s)) return "-";
    s = Math.max(0, Math.round(s));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor(s / 3600) % 24}h`;
  }

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
    if (e.status === 401 && TEAM) {
      halted = true;
      TEAM.signedOut();  // the cookie is gone or its user was removed: back to the sign-in form
    } else if (e.status === 401) {
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
    if (TEAM && (kind === "team" || (!name && !window.GPUFLEET_FOCUS))) return { kind: "team", name: "overview" };
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
    $("team-view").hidden = s.kind !== "team";
    if (TEAM) TEAM.show(s.kind === "team");
    if (s.kind === "job") {
      GFPanels.build($("charts"), $("custom-charts"));
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
    if (TEAM) TEAM.mark(sel.kind === "team");
    $("clusters").innerHTML = lists.clusters.map((c) => `<li class="item${c.name === shownCluster ? " sel" : ""}"
        data-kind="cluster" data-name="${esc(c.name)}">
        <div class="r1"><span class="dot st-${esc(c.status)}"></span><b>${esc(c.name)}</b>
          <span class="right">${usd(c.cost_usd)}</span></div>
        <div class="r2">${esc(c.gpu)} × ${esc(c.count)} · ${esc(c.network)} · $${num(c.usd_per_hour, 2)}/h</div>
        <div class="r2">${c.job ? `job ${esc(c.job)} (${esc(c.job_status)})` : "no job"} · ${esc(c.status)}</div>
      </li>`).join("") || `<li class="muted">none</li>`;
  }

  function onListClick(ev) {
    const li = ev.target.closest("[data-kind]");
    if (!li) return;
    const name = li.dataset.name;
    if (li.dataset.kind === "job") return choose({ kind: "job", name });
    if (li.dataset.kind === "team") return choose({ kind: "team", name });
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
    // every metric the job has: the fixed charts' and whatever the script reported
    const r = await get(`/api/jobs/${encodeURIComponent(name)}/series?since=${since}`);
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
    $("samples-per-s").textContent = throughput(d);
    $("loss").textContent = lossText(d.loss);
    $("first-loss").textContent = d.first_loss == null ? "" : `first ${num(d.first_loss, 4, false)}`;
    $("elapsed").textContent = duration(d.elapsed_s);
    $("eta").textContent = ACTIVE.has(d.status) ? duration(d.eta_s) : "-";
    $("eta-at").textContent = ACTIVE.has(d.status) && d.eta_s != null ? `about ${clock(d.now + d.eta_s)}` : "";
    $("cost").textContent = usd(d.cost_usd);
    $("projected-cost").textContent = usd(d.projected_cost_usd);
    $("rate").textContent = `$${num(d.usd_per_hour, 4)}/h`;
    // restarts after a failure, over the job's life (each run is a series of its own)
    $("j-restarts").hidden = !d.restarts;
    $("j-restarts").textContent = d.restarts ? `${d.restarts} restart${d.restarts > 1 ? "s" : ""}` : "";
    $("j-restarts").title = d.runs ? `${d.runs.length} run(s) of the workers` : "";
    // rank 0 has gone quiet while the job runs (the hang timeout may be minutes away)
    $("j-quiet").hidden = d.no_report_s == null;
    $("j-quiet").textContent = d.no_report_s == null ? "" : `no report for ${Math.round(d.no_report_s)} s`;
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

  function renderCharts() {
    if (detail) GFPanels.render(detail, seriesState(detail.job), ACTIVE.has(detail.status));
  }

  // ---- start --------------------------------------------------------------------------------
  $("jobs").addEventListener("click", onListClick);
  $("clusters").addEventListener("click", onListClick);
  if (TEAM) for (const id of ["team-list", "team-view"]) $(id).addEventListener("click", onListClick);
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(renderCharts, 150);
  });
  pollLists();
})();
