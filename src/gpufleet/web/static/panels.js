// Which charts one job's page shows and what goes on each: the fixed panels, a small chart
// for every other metric the job has (what a script passed to train.report), the x axis
// (step or wall time) and the loss smoothing. Both settings are kept in localStorage.
"use strict";

window.GFPanels = (() => {
  const { esc, num, plain, scaleFor, shown, ema, draw, hover, throughput, lossText } = GF;
  const COLORS = ["#5aa2ff", "#f5a524", "#3ecf8e", "#ef6b73", "#b48cf2", "#2dd4bf", "#f778ba",
    "#c9d1d9", "#e3b341", "#79c0ff"];
  const SMOOTH_COLOR = "#e8edf3";
  const AXES = ["step", "time"];

  // One chart per entry. `unit` picks the axis scale; `only`: labels to draw (default: all);
  // `headline`: the header's number from the job's detail; `fmt`: how its values read.
  const FIXED = [
    { id: "job_samples_per_second", title: "Throughput", metrics: ["job_samples_per_second"],
      unit: "samples", only: ["job"], headline: (d) => throughput(d) },
    { id: "loss", title: "Loss (rank 0)", metrics: ["loss"], unit: "plain", rank0: true,
      fromZero: false, smooth: true, fmt: (v) => lossText(v) },
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
  // on a fixed chart already, or shown in a note (the memory size): no chart of their own
  const NOT_CUSTOM = new Set([...FIXED.flatMap((c) => c.metrics), "gpu_memory_total_bytes",
    "samples"]);  // the batch each report counted: the throughput chart has it

  const prefs = (() => {
    const read = (k, dflt) => { try { return localStorage.getItem(k) ?? dflt; } catch (e) { return dflt; } };
    const axis = read("gpufleet.axis", "step"), smoothing = Number(read("gpufleet.smoothing", "0.6"));
    return { axis: AXES.includes(axis) ? axis : "step",
      smoothing: isFinite(smoothing) ? Math.min(0.99, Math.max(0, smoothing)) : 0.6 };
  })();

  function save(key, value) {
    prefs[key] = value;
    try { localStorage.setItem("gpufleet." + key, String(value)); } catch (e) { /* storage off */ }
    if (last) render(...last);
  }

  const $ = (id) => document.getElementById(id);
  const charts = new Map();  // id -> {def, card, svg, lines, geom, hoverX}
  let fixedBox = null, customBox = null, last = null;

  // The unit of a metric a script named: by its suffix, as schema.py names ours.
  function unitOf(name) {
    if (name.endsWith("_bytes_per_second")) return "bw";
    if (name.endsWith("_bytes")) return "bytes";
    if (name.endsWith("_seconds")) return "seconds";
    return "plain";
  }

  function addCard(box, def) {
    const card = document.createElement("section");
    card.className = "card" + (def.wide ? " wide" : "");
    card.id = "card-" + def.id;
    card.innerHTML = `<header><h3>${esc(def.title)}</h3><span class="note"></span><span class="now"></span></header>
      <div class="legend"></div>
      <svg data-chart="${esc(def.id)}" class="chart" role="img" aria-label="${esc(def.title)}"></svg>`;
    box.appendChild(card);
    const chart = { def, card, svg: card.querySelector("svg"), lines: [], geom: null, hoverX: null };
    chart.svg.addEventListener("mousemove", (ev) => { chart.hoverX = ev.offsetX; hover(chart, ev, $("tip")); });
    chart.svg.addEventListener("mouseleave", () => { chart.hoverX = null; hover(chart, null, $("tip")); });
    charts.set(def.id, chart);
  }

  function build(fixed, custom) {
    fixedBox = fixed; customBox = custom; last = null;
    charts.clear();
    fixed.innerHTML = custom.innerHTML = "";
    $("custom-head").hidden = true;
    for (const def of FIXED) addCard(fixed, def);
  }

  // A chart for each metric of the job that no fixed chart shows, in name order.
  function addCustom(data) {
    const names = Object.keys(data).filter((n) => !NOT_CUSTOM.has(n) && !charts.has(n)).sort();
    for (const name of names) {
      const labels = Object.keys(data[name]);
      const perRank = labels.every((l) => l.startsWith("rank "));
      addCard(customBox, { id: name, title: perRank ? `${name} (rank 0)` : name, metrics: [name],
        unit: unitOf(name), rank0: perRank, fromZero: false, small: true, custom: true,
        fmt: unitOf(name) === "plain" ? plain : null });
    }
    if (names.length) {
      $("custom-head").hidden = false;
      $("custom-names").textContent = [...charts.values()].filter((c) => c.def.custom)
        .map((c) => c.def.id).join(", ");
    }
  }

  const naturally = (a, b) => a.localeCompare(b, "en", { numeric: true });

  // The lines of one chart on the current axis: [x, value] with x a time or a step (a sample
  // with no step yet is left off a step axis). A smoothed chart adds the EMA of each line.
  function linesOf(def, data) {
    const out = [], byStep = prefs.axis === "step";
    const labels = [...new Set(def.metrics.flatMap((m) => Object.keys(data[m] || {})))].sort(naturally);
    let keep = def.only ? labels.filter((l) => def.only.includes(l)) : labels;
    if (def.rank0) keep = keep.includes("rank 0") ? ["rank 0"] : keep.slice(0, 1);
    def.metrics.forEach((m, mi) => keep.forEach((label, li) => {
      const points = (data[m] || {})[label] || [];
      const xy = byStep ? perStep(points) : points.map((p) => [p[0], p[1]]);
      if (!xy.length) return;
      const name = def.metrics.length > 1 ? `${label} ${def.names[mi]}` : def.smooth ? `raw, ${label}` : label;
      out.push({ metric: m, label, name, xy, color: COLORS[li % COLORS.length], dash: mi > 0 });
    }));
    if (def.smooth && prefs.smoothing > 0) {
      for (const ln of out.slice()) {
        const values = ema(ln.xy.map((p) => p[1]), prefs.smoothing);
        out.push({ ...ln, name: smoothingLabel(), smooth: true, color: SMOOTH_COLOR,
          xy: ln.xy.map((p, i) => [p[0], values[i]]) });
      }
    }
    return out;
  }

  // [step, value] of [time, value, step] points; the samples a device gave within one step
  // (or after the last one) are drawn as their mean, one point per step as for a rank's.
  function perStep(points) {
    const out = [];
    let sum = 0, n = 0;
    for (const p of points) {
      if (p[2] == null) continue;
      if (n && out[out.length - 1][0] === p[2]) {
        sum += p[1]; n++;
        out[out.length - 1][1] = sum / n;
      } else {
        out.push([p[2], p[1]]);
        sum = p[1]; n = 1;
      }
    }
    return out;
  }

  const smoothingLabel = () => prefs.smoothing > 0 ? `smoothed, EMA ${Number(prefs.smoothing.toFixed(2))}`
    : "smoothing off";

  // The x range all charts share: the job's start to now (time), or the steps seen (step).
  function range(all, detail, st, active) {
    if (prefs.axis === "step") {
      let lo = Infinity, hi = -Infinity;
      for (const lines of all) for (const ln of lines) for (const p of ln.xy) {
        if (p[0] < lo) lo = p[0];
        if (p[0] > hi) hi = p[0];
      }
      return [lo, hi];
    }
    let first = Infinity;
    for (const byLabel of Object.values(st.data)) {
      for (const line of Object.values(byLabel)) if (line.length) first = Math.min(first, line[0][0]);
    }
    const started = (detail.events || []).find((e) => e.kind === "running") || (detail.events || [])[0];
    return [Math.min(first, started ? started.time : Infinity),
      active ? Math.max(st.now, st.maxT) : st.maxT];
  }

  function render(detail, st, active) {
    last = [detail, st, active];
    addCustom(st.data);
    syncTools();
    const defs = [...charts.values()];
    const all = defs.map((c) => linesOf(c.def, st.data));
    const [x0, x1] = range(all, detail, st, active);
    defs.forEach((chart, i) => paint(chart, all[i], x0, x1, detail, st, active));
    const total = Object.values(detail.latest || {}).find((v) => v.gpu_memory_total_bytes)?.gpu_memory_total_bytes;
    const mem = charts.get("gpu_memory_used_bytes");
    if (mem) mem.card.querySelector(".note").textContent = total ? `of ${shown(total, scaleFor("bytes", total))} each` : "";
  }

  // One chart: drawn; or, with nothing to draw, a placeholder while the job runs and hidden
  // once it has ended (a script that never measured communication has no such chart).
  function paint(chart, lines, x0, x1, detail, st, active) {
    const { def, card } = chart;
    const had = def.metrics.some((m) => Object.values(st.data[m] || {}).some((p) => p.length));
    card.hidden = !lines.length && !had && !active;
    const empty = had ? "no step reported with these samples: see them by time"
      : prefs.axis === "step" ? "waiting for the first step" : "waiting for data";
    const geom = card.hidden ? null : draw(chart, lines, prefs.axis, x0, x1, empty);
    const raw = lines.filter((ln) => !ln.smooth);
    const fmt = def.fmt || ((v) => geom ? shown(v, geom.scale) : "");
    const latest = (ln) => fmt(ln.xy[ln.xy.length - 1][1]);
    card.querySelector(".now").textContent = def.headline ? def.headline(detail)
      : raw.length === 1 ? latest(raw[0]) : "";
    if (def.smooth) card.querySelector(".note").textContent = smoothingLabel();
    card.querySelector(".legend").innerHTML = geom && lines.length > 1 ? lines.map((ln) => `<span class="key">
        <svg width="18" height="8"><line x1="0" x2="18" y1="4" y2="4" stroke="${ln.color}"
          class="${ln.dash ? "dash" : ""}" stroke-width="2"/></svg>${esc(ln.name)}
        <b>${latest(ln)}</b></span>`).join("") : "";
    if (geom && chart.hoverX != null) hover(chart, null, $("tip"));
  }

  function syncTools() {
    for (const b of document.querySelectorAll("#chart-tools [data-axis]")) {
      b.classList.toggle("on", b.dataset.axis === prefs.axis);
      b.setAttribute("aria-pressed", String(b.dataset.axis === prefs.axis));
    }
    const slider = $("smoothing");
    if (document.activeElement !== slider) slider.value = String(prefs.smoothing);
    $("smoothing-out").textContent = prefs.smoothing > 0 ? num(prefs.smoothing, 2) : "off";
  }

  for (const b of document.querySelectorAll("#chart-tools [data-axis]")) {
    b.addEventListener("click", () => save("axis", b.dataset.axis));
  }
  $("smoothing").addEventListener("input", (ev) => save("smoothing", Number(ev.target.value)));

  return { build, render, prefs };
})();
