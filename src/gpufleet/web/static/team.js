// The dashboard behind a team server (loaded only there): who is signed in and the sign-out,
// and the Queue and Usage panels. The server answers as the signed-in user: a user sees
// their own jobs, their own usage and their team; an admin everyone's. The token lives only
// in an HTTP-only cookie, never in this page's storage.
"use strict";

window.GFTeam = (() => {
  const POLL_MS = 3000;
  const USAGE_POLL_MS = 10000;  // each summary books running jobs' cost first: a write, so less often
  const ACTIVE = new Set(["starting", "running", "restarting", "resizing"]);
  const { esc, num, clock, usd } = GF;
  const me = window.GPUFLEET_ME;  // {user, team, admin}, put in the page by the server
  const $ = (id) => document.getElementById(id);
  let timer = null, shown = false, gen = 0, usageAt = 0;

  function signedOut() {
    location.replace("/" + location.hash);
  }

  async function get(path) {
    const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401) signedOut();
    if (!r.ok) {
      let msg = r.statusText;
      try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    return r.json();
  }

  // "in 2m 05s" from now; "now" for a moment already reached
  function fromNow(t) {
    const s = Math.round(t - Date.now() / 1000);
    if (s <= 0) return "now";
    if (s < 60) return `in ${s}s`;
    if (s < 3600) return `in ${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
    return `in ${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
  }

  const NUMERIC = new Set(["Priority", "Step", "Cost", "GPU-hours", "Jobs"]);  // right-aligned
  const th = (h) => `<th${NUMERIC.has(h) ? ` class="num"` : ""}>${esc(h)}</th>`;

  function table(el, head, rows, none) {
    el.innerHTML = `<thead><tr>${head.map(th).join("")}</tr></thead>` +
      `<tbody>${rows.join("") || `<tr><td class="muted" colspan="${head.length}">${esc(none)}</td></tr>`}</tbody>`;
  }

  // ---- Queue: what waits (in order, with why and when it should start) and what runs -----
  function renderQueue(rows) {
    const waiting = rows.filter((r) => r.status === "queued")
      .sort((a, b) => (a.position ?? 1e9) - (b.position ?? 1e9));
    const running = rows.filter((r) => ACTIVE.has(r.status));
    $("queue-sub").textContent = `${waiting.length} waiting, ${running.length} running` +
      (me.admin ? " (everyone's jobs)" : ` (your jobs, ${me.user})`);
    table($("queue"), ["#", "Job", "User", "Team", "Priority", "Devices", "Estimated start", "Why it waits"],
      waiting.map((r) => `<tr data-job="${esc(r.name)}">
        <td class="pos">${esc(r.position ?? "-")}</td><td><b>${esc(r.name)}</b></td>
        <td>${esc(r.user)}</td><td>${esc(r.team ?? "-")}</td><td class="num">${esc(r.priority)}</td>
        <td>${esc(r.gpu)} × ${esc(r.count)}</td>
        <td class="est">${r.est_start == null ? `<span class="muted">not known</span>`
          : `${clock(r.est_start)} <span class="muted">(${fromNow(r.est_start)})</span>`}</td>
        <td class="why">${esc(r.reason || "waiting for the next pass")}</td></tr>`),
      "nothing waits");
    table($("running"), ["Job", "User", "Team", "Devices", "Status", "Started", "Step", "Cost"],
      running.map((r) => `<tr data-job="${esc(r.name)}" data-kind="job" data-name="${esc(r.name)}" class="click">
        <td><b>${esc(r.name)}</b></td><td>${esc(r.user)}</td><td>${esc(r.team ?? "-")}</td>
        <td>${esc(r.gpu)} × ${esc(r.count)}</td><td><span class="dot st-${esc(r.status)}"></span> ${esc(r.status)}</td>
        <td>${r.started_at ? clock(r.started_at) : "-"}</td>
        <td class="num">${esc(r.step ?? 0)}/${esc(r.total_steps ?? "?")}</td><td class="num">${usd(r.cost_usd)}</td></tr>`),
      "nothing runs");
  }

  // ---- Usage: each team's limits against what it holds and has spent; dollars and GPU-hours
  function renderTeams(teams) {
    $("teams").innerHTML = teams.map((t) => {
      const gpus = [...new Set([...Object.keys(t.quotas), ...Object.keys(t.in_use)])].sort();
      const quotas = gpus.map((g) => {
        const held = t.in_use[g] || 0, cap = t.quotas[g];
        const pct = cap ? Math.min(100, 100 * held / cap) : 0;
        return `<li data-gpu="${esc(g)}"><span>${esc(g)}</span>
          <b class="num">${held} in use${cap == null ? " (no quota)" : ` of ${cap}`}</b>
          ${cap == null ? "" : `<div class="mini${held >= cap ? " full" : ""}"><div style="width:${pct}%"></div></div>`}</li>`;
      }).join("") || `<li class="muted">no quota</li>`;
      const pct = t.budget_usd ? Math.min(100, 100 * t.spent_usd / t.budget_usd) : 0;
      const budget = t.budget_usd == null ? `<span class="muted">no budget; ${usd(t.spent_usd)} spent</span>`
        : `<b class="num">${usd(t.spent_usd)} of ${usd(t.budget_usd)}</b> spent
           <span class="muted">(${usd(t.left_usd)} left)</span>
           <div class="mini${t.left_usd <= 0 ? " full" : ""}"><div style="width:${pct}%"></div></div>`;
      return `<div class="team-card" data-team="${esc(t.team)}">
        <h3>Team ${esc(t.team)} <span class="sub">${esc(t.users.join(", "))}</span></h3>
        <div class="budget"><span class="label">Budget ${esc(t.month)}</span> ${budget}</div>
        <div class="quotas"><span class="label">Quotas</span><ul>${quotas}</ul></div></div>`;
    }).join("") || `<div class="muted">${me.admin ? "No teams yet." : me.team ? "" : "You are in no team."}</div>`;
  }

  function usageTable(by, got) {
    const rows = got.groups.map((g) => `<tr data-${by}="${esc(g[by])}"><td>${esc(g[by])}</td>
      <td class="num usd">${usd(g.usd)}</td><td class="num">${num(g.gpu_hours, 3)}</td>
      <td class="num">${g.jobs}</td></tr>`);
    if (got.groups.length > 1) {
      rows.push(`<tr class="total"><td>total</td><td class="num">${usd(got.usd)}</td>
        <td class="num">${num(got.gpu_hours, 3)}</td><td></td></tr>`);
    }
    return `<table class="table" data-by="${by}"><thead><tr>${[by === "user" ? "User" : "Team",
      "Cost", "GPU-hours", "Jobs"].map(th).join("")}</tr></thead>
      <tbody>${rows.join("") || `<tr><td class="muted" colspan="4">nothing yet</td></tr>`}</tbody></table>`;
  }

  function renderUsage(summary) {
    renderTeams(summary.teams);
    $("usage-sub").textContent = me.admin ? "every user and team" : `you and ${me.team ? "team " + me.team : "no team"}`;
    $("usage").innerHTML = summary.windows.map((w) => `<div class="window" data-window="${esc(w.window)}">
      <h2>${w.window === "month" ? `This month (${esc(summary.month)}, UTC)` : "Last 30 days"}</h2>
      ${usageTable("user", w.users)}${usageTable("team", w.teams)}</div>`).join("");
  }

  async function poll() {
    clearTimeout(timer);
    if (!shown) return;
    const mine = ++gen;
    try {
      const due = Date.now() - usageAt >= USAGE_POLL_MS;
      const [rows, summary] = await Promise.all([get("/api/v1/jobs"),
        due ? get("/api/v1/usage/summary") : null]);
      if (mine !== gen) return;
      renderQueue(rows);
      if (summary) {
        renderUsage(summary);
        usageAt = Date.now();
      }
      $("team-error").hidden = true;
    } catch (e) {
      if (mine !== gen) return;
      $("team-error").hidden = false;
      $("team-error").textContent = `The server answered: ${e.message}`;
    }
    if (shown && mine === gen) timer = setTimeout(poll, POLL_MS);
  }

  function show(on) {
    shown = on;
    clearTimeout(timer);
    gen++;
    usageAt = 0;  // coming back to the panel: fresh numbers at once
    if (on) poll();
  }

  function mark(on) {
    $("team-list").querySelector("li").classList.toggle("sel", on);
  }

  async function signOut() {
    try {
      await fetch("/api/v1/session", { method: "DELETE", credentials: "same-origin" });
    } finally {
      location.replace("/");
    }
  }

  $("me").hidden = false;
  $("me-name").textContent = me.user + (me.team ? ` · team ${me.team}` : "") + (me.admin ? " · admin" : "");
  $("team-list").hidden = false;
  $("sign-out").addEventListener("click", signOut);
  return { show, mark, signedOut };
})();
