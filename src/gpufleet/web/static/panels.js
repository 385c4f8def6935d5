// Which charts one job's page shows and what goes on each: the fixed panels, a small chart
// for every other metric the job has (what a script passed to train.report), the x axis
// (step or wall time) and the loss smoothing. Both settings are kept in localStorage.
"use strict";

window.GFPanels = (() => {
  const { esc, num, plain, scaleFor, shown, ema, draw, hover, throughput, lossText } = GF;
  const COLORS = ["#5aa2ff", "#f5a524", "#3ecf8e", "#ef6b73", "#b48cf2", "#2dd4bf", "#f778ba",
    "#c9d1d9", "#e3b341", "#79c0ff"];
  const SMOOTH_COLOR = "#e8edf3";
  // where the loss comes from (docs/watching.md), for a loss chart that has seen none
  const LOSS_SOURCES = "gpufleet reads the loss from train.report(step, loss=...) or rank 0's " +
    "printed lines (loss 2.31, loss=2.31, train loss 2.31, {'loss': 2.31}); --loss-pattern REGEX " +
    "reads any other shape";
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
      <svg data-chart="${esc(def.id)}" class="chart" role="img" aria-label="${esc(def.title)}"></svg>
      <div class="why" hidden></div>`;
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
  // with no step yet is left off a step axis), one per label and run of the workers (`starts`:
  // each run's start time), so a restart that counts from step 1 again is a line of its own.
  // A smoothed chart adds the EMA of each line.
  function linesOf(def, data, starts) {
    const out = [], byStep = prefs.axis === "step";
    const labels = [...new Set(def.metrics.flatMap((m) => Object.keys(data[m] || {})))].sort(naturally);
    let keep = def.only ? labels.filter((l) => def.only.includes(l)) : labels;
    if (def.rank0) keep = keep.includes("rank 0") ? ["rank 0"] : keep.slice(0, 1);
    const runs = starts.length > 1;
    def.metrics.forEach((m, mi) => keep.forEach((label, li) => {
      byRun((data[m] || {})[label] || [], starts).forEach((points, ri) => {
        const xy = byStep ? perStep(points) : points.map((p) => [p[0], p[1]]);
        if (!xy.length) return;
        let name = def.metrics.length > 1 ? `${label} ${def.names[mi]}` : def.smooth ? `raw, ${label}` : label;
        if (runs) name += `, run ${ri + 1}`;
        // one label: a color per run; several: a color per label, its runs apart by their gap
        const color = COLORS[(keep.length === 1 ? ri : li) % COLORS.length];
        out.push({ metric: m, label, name, xy, color, dash: mi > 0, run: ri + 1 });
      });
    }));
    const newest = Math.max(...out.map((ln) => ln.run));
    for (const ln of out) ln.old = ln.run < newest;  // drawn fainter: the current run stands out
    if (def.smooth && prefs.smoothing > 0) {
      for (const ln of out.slice()) {
        const values = ema(ln.xy.map((p) => p[1]), prefs.smoothing);
        out.push({ ...ln, name: smoothingLabel() + (runs ? `, run ${ln.run}` : ""), smooth: true,
          color: SMOOTH_COLOR, xy: ln.xy.map((p, i) => [p[0], values[i]]) });
      }
    }
    return out;
  }

  // [time, ...] points split by run: each run's from its start to the next one's (a point
  // before the first start, a device sample as the workers start, goes with the first run).
  function byRun(points, starts) {
    if (starts.length < 2) return [points];
    const out = starts.map(() => []);
    let r = 0;
    for (const p of points) {
      while (r + 1 < starts.length && p[0] >= starts[r + 1]) r++;
      out[r].push(p);
    }
    return out;
  }

  // The job's markers (restarts, resizes: `detail.markers`, from its events) on this axis.
  function marksOf(detail) {
    const byStep = prefs.axis === "step";
    return (detail.markers || []).map((mk) => ({ x: byStep ? mk.step : mk.time, kind: mk.kind,
      label: mk.label, text: mk.text })).filter((mk) => mk.x != null);
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
    const starts = (detail.runs || []).map((r) => r.start);
    const all = defs.map((c) => linesOf(c.def, st.data, starts));
    const [x0, x1] = range(all, detail, st, active);
    const marks = marksOf(detail);
    defs.forEach((chart, i) => paint(chart, all[i], x0, x1, detail, st, active, marks));
    const total = Object.values(detail.latest || {}).find((v) => v.gpu_memory_total_bytes)?.gpu_memory_total_bytes;
    const mem = charts.get("gpu_memory_used_bytes");
    if (mem) mem.card.querySelector(".note").textContent = total ? `of ${shown(total, scaleFor("bytes", total))} each` : "";
  }

  // One chart: drawn; or, with nothing to draw, what it waits for and why. A figure this
  // script does not produce says so (`detail.not_measured`, running or ended); one that is
  // expected waits while the job runs and is hidden once it has ended.
  function paint(chart, lines, x0, x1, detail, st, active, marks) {
    const { def, card } = chart;
    const had = def.metrics.some((m) => Object.values(st.data[m] || {}).some((p) => p.length));
    const unmeasured = def.metrics.map((m) => (detail.not_measured || {})[m]).find(Boolean);
    card.hidden = !lines.length && !had && !active && !unmeasured;
    const [empty, why] = emptyText(def, had, unmeasured, detail);
    const geom = card.hidden ? null : draw(chart, lines, prefs.axis, x0, x1, empty, marks);
    const whyEl = card.querySelector(".why");
    whyEl.hidden = !!geom || !why;
    whyEl.textContent = geom ? "" : why;
    const raw = lines.filter((ln) => !ln.smooth);
    const newest = raw.filter((ln) => ln.run === Math.max(...raw.map((r) => r.run)));
    const fmt = def.fmt || ((v) => geom ? shown(v, geom.scale) : "");
    const latest = (ln) => fmt(ln.xy[ln.xy.length - 1][1]);
    card.querySelector(".now").textContent = def.headline ? def.headline(detail)
      : newest.length === 1 ? latest(newest[0]) : "";
    if (def.smooth) card.querySelector(".note").textContent = smoothingLabel();
    card.querySelector(".legend").innerHTML = geom && lines.length > 1 ? lines.map((ln) => `<span class="key" data-name="${esc(ln.name)}">
        <svg width="18" height="8"><line x1="0" x2="18" y1="4" y2="4" stroke="${ln.color}"
          class="${ln.dash ? "dash" : ""}" stroke-width="2"/></svg>${esc(ln.name)}
        <b>${latest(ln)}</b></span>`).join("") : "";
    if (geom && chart.hoverX != null) hover(chart, null, $("tip"));
  }

  // What an empty chart says, and why underneath: not measured for this script; or, once a
  // step came, that none of its samples did yet; else that it waits for the first step.
  function emptyText(def, had, unmeasured, detail) {
    if (unmeasured) return ["not measured for this script", unmeasured];
    if (had) return ["no step reported with these samples: see them by time", ""];
    if (detail.step != null) return def.id === "loss" ? ["no loss seen yet", LOSS_SOURCES]
      : ["no samples yet", ""];
    return [prefs.axis === "step" ? "waiting for the first step" : "waiting for data", ""];
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
