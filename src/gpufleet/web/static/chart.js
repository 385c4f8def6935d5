// The dashboard's charts: number formats, axes, lines, smoothing and the hover tip, in plain
// SVG. No library: the page must work offline. app.js decides what goes on which chart.
"use strict";

window.GF = (() => {
  const GAP_S = 15;  // on a time axis, a longer silence breaks the line
  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
    21600, 43200, 86400];

  const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const num = (v, digits = 0, fixed = true) => v == null || !isFinite(v) ? "-"
    : v.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: fixed ? digits : 0 });

  // The throughput card and the throughput chart's header: one source, one rounding; the
  // loss card and the loss chart's header likewise.
  const throughput = (d) => d.samples_per_s == null ? "-" : num(d.samples_per_s);
  const lossText = (v) => v == null ? "-" : num(v, 4, false);

  function usd(v) {
    if (v == null || !isFinite(v)) return "-";
    if (v === 0) return "$0.00";
    // small amounts keep enough digits that a few seconds of billing show
    return "$" + (v < 0.01 ? v.toFixed(6) : v < 100 ? v.toFixed(4) : num(v, 2));
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

  // A number a script reported (a learning rate of 3e-4 as well as a grad norm of 12.5).
  function plain(v) {
    if (v == null || !isFinite(v)) return "-";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return num(v, a >= 100 ? 1 : 4, false);
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
    if (!scale.name) return plain(v);
    const x = v / scale.div, a = Math.abs(x);
    const digits = a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3;
    return num(x, digits, false) + (scale.name === "%" ? "%" : " " + scale.name);
  }

  function niceStep(range, count) {
    const raw = range / Math.max(1, count), p = 10 ** Math.floor(Math.log10(raw)), f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }

  function tick(v, step) {  // a y tick: enough decimals for the step, exponents for tiny ones
    if (step < 1e-3 || Math.abs(v) >= 1e6) return v === 0 ? "0" : v.toExponential(1);
    return num(v, Math.max(0, Math.min(3, -Math.floor(Math.log10(step) + 1e-9))));
  }

  // An exponential moving average with its start debiased (the first values are not pulled
  // towards zero): the EMA TensorBoard and W&B smooth with, 0 = off, near 1 = heavy
  // (docs.wandb.ai, "Smoothing" in line plots).
  function ema(values, weight) {
    let last = 0, n = 0;
    return values.map((v) => {
      last = last * weight + (1 - weight) * v;
      n++;
      return weight > 0 ? last / (1 - weight ** n) : v;
    });
  }

  // The x ticks of one axis: elapsed time (m:ss) from x0, or steps.
  function xTicks(axis, x0, x1, pw) {
    const span = x1 - x0, maxTicks = Math.max(2, Math.floor(pw / 70)), out = [];
    if (axis === "time") {
      const st = TIME_STEPS.find((s) => span / s <= maxTicks) || Math.ceil(span / maxTicks / 86400) * 86400;
      for (let s = 0; s <= span + 1e-6; s += st) out.push([x0 + s, mmss(s)]);
      return out;
    }
    const nice = niceStep(span, maxTicks);  // whole steps only (2.5 becomes 5)
    const st = nice <= 1 ? 1 : Number.isInteger(nice) ? nice : nice * 2;
    for (let v = Math.ceil(x0 / st) * st; v <= x1 + 1e-6; v += st) out.push([v, num(v)]);
    return out;
  }

  // The SVG path of [[x, y]]: a line broken at a long silence (time) or where the step goes
  // back (a restart resumed from an earlier checkpoint).
  function path(xy, X, Y, axis, maxPoints) {
    const stride = Math.max(1, Math.ceil(xy.length / maxPoints));
    let d = "", prev = null;
    for (let i = 0; i < xy.length; i += stride) {
      const p = i + stride >= xy.length ? xy[xy.length - 1] : xy[i];
      const jump = prev === null || (axis === "time" ? p[0] - prev > GAP_S : p[0] < prev);
      d += `${jump ? "M" : "L"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`;
      prev = p[0];
      if (p === xy[xy.length - 1]) break;
    }
    return d;
  }

  // Draw `lines` ({name, color, dash, xy, smooth?}) over [x0, x1] on `axis` ("time"|"step"),
  // with `marks` ({x, kind, label, text}: a restart, a resize) as labelled vertical lines.
  // `empty`: what an empty chart says. Returns the geometry hover() needs, or null.
  function draw(chart, lines, axis, x0, x1, empty, marks = []) {
    const { def, svg, card } = chart;
    const W = Math.max(240, svg.clientWidth || card.clientWidth - 24), H = def.small ? 150 : 190;
    const m = { l: 56, r: 14, t: 12, b: 30 }, pw = W - m.l - m.r, ph = H - m.t - m.b;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("height", H);
    chart.lines = lines;
    if (!lines.length || !isFinite(x0) || !isFinite(x1)) {
      svg.innerHTML = `<text class="nodata" x="${W / 2}" y="${H / 2}">${esc(empty)}</text>`;
      chart.geom = null;
      return null;
    }
    if (!(x1 > x0)) x1 = x0 + 1;  // one point: a unit-wide axis around it
    let lo = Infinity, hi = -Infinity;
    for (const ln of lines) for (const p of ln.xy) { if (p[1] < lo) lo = p[1]; if (p[1] > hi) hi = p[1]; }
    const scale = scaleFor(def.unit, Math.max(Math.abs(lo), Math.abs(hi)));
    lo /= scale.div; hi /= scale.div;
    if (def.fixed) [lo, hi] = [Math.min(def.fixed[0], lo), Math.max(def.fixed[1], hi)];
    else if (def.fromZero !== false) lo = Math.min(0, lo);
    if (hi - lo < 1e-12 * Math.max(1, Math.abs(hi))) {
      const pad = Math.abs(hi) * 0.1 || 1;
      hi += pad; lo -= def.fromZero === false ? pad : 0;
    }
    const step = niceStep(hi - lo, 4);
    if (!def.fixed) { lo = Math.floor(lo / step) * step; hi = Math.ceil(hi / step) * step; }
    const X = (x) => m.l + (x - x0) / (x1 - x0) * pw;
    const Y = (v) => m.t + ph - (v / scale.div - lo) / (hi - lo) * ph;

    const parts = [];
    for (let v = lo; v <= hi + step * 1e-6; v += step) {
      const y = m.t + ph - (v - lo) / (hi - lo) * ph;
      parts.push(`<line class="grid" x1="${m.l}" x2="${m.l + pw}" y1="${y}" y2="${y}"/>`,
        `<text class="tick y" x="${m.l - 6}" y="${y + 4}">${tick(v, step)}</text>`);
    }
    for (const [xv, text] of xTicks(axis, x0, x1, pw)) {
      const x = X(xv);
      parts.push(`<line class="xtick" x1="${x}" x2="${x}" y1="${m.t + ph}" y2="${m.t + ph + 4}"/>`,
        `<text class="tick x" x="${x}" y="${m.t + ph + 16}">${text}</text>`);
    }
    const xName = axis === "time" ? "time since start (m:ss)" : "step";
    parts.push(`<line class="axis" x1="${m.l}" x2="${m.l + pw}" y1="${m.t + ph}" y2="${m.t + ph}"/>`,
      `<line class="axis" x1="${m.l}" x2="${m.l}" y1="${m.t}" y2="${m.t + ph}"/>`,
      `<text class="unit" x="${m.l + 4}" y="${m.t + 10}">${esc(scale.name)}</text>`,
      `<text class="unit xu" data-axis="${axis}" x="${m.l + pw}" y="${H - 2}">${xName}</text>`);
    for (const mk of marks) {
      if (!(mk.x >= x0 && mk.x <= x1)) continue;
      const x = X(mk.x).toFixed(1);
      parts.push(`<g class="marker" data-kind="${esc(mk.kind)}"><title>${esc(mk.text)}</title>
        <line x1="${x}" x2="${x}" y1="${m.t}" y2="${m.t + ph}"/>
        <text x="${Number(x) + 3}" y="${m.t + 9}">${esc(mk.label)}</text></g>`);
    }
    for (const ln of lines) {
      parts.push(`<path d="${path(ln.xy, X, Y, axis, pw * 1.5)}" stroke="${ln.color}"
        class="line${ln.dash ? " dash" : ""}${ln.smooth ? " smooth" : ""}${ln.old ? " old" : ""}"
        ${ln.smooth ? "data-smoothed" : "data-points"}="${ln.xy.length}"
        data-series="${esc(ln.metric)}/${esc(ln.label)}" data-run="${ln.run ?? 1}"/>`);
      if (!ln.smooth) {
        const end = ln.xy[ln.xy.length - 1];
        parts.push(`<circle cx="${X(end[0]).toFixed(1)}" cy="${Y(end[1]).toFixed(1)}" r="2.5" fill="${ln.color}"/>`);
      }
    }
    parts.push(`<line class="guide" y1="${m.t}" y2="${m.t + ph}" visibility="hidden"/>`);
    svg.innerHTML = parts.join("");
    chart.geom = { x0, x1, m, pw, scale, axis };
    return chart.geom;
  }

  function nearest(xy, x) {  // linear: a step axis after a restart is not sorted
    let best = xy[0];
    for (const p of xy) if (Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
    return best;
  }

  function hover(chart, ev, tip) {
    const guide = chart.svg.querySelector(".guide"), g = chart.geom;
    if (!guide || !g || chart.hoverX == null || chart.hoverX < g.m.l || chart.hoverX > g.m.l + g.pw) {
      if (guide) guide.setAttribute("visibility", "hidden");
      tip.hidden = true;
      return;
    }
    const x = g.x0 + (chart.hoverX - g.m.l) / g.pw * (g.x1 - g.x0);
    guide.setAttribute("x1", chart.hoverX);
    guide.setAttribute("x2", chart.hoverX);
    guide.setAttribute("visibility", "visible");
    const head = g.axis === "time" ? `${mmss(x - g.x0)} · ${clock(x)}` : `step ${num(Math.round(x))}`;
    const fmt = chart.def.fmt || ((v) => shown(v, g.scale));
    tip.innerHTML = `<div class="t">${head}</div>` + chart.lines.map((ln) =>
      `<div><i style="background:${ln.color}"></i>${esc(ln.name)}: <b>${fmt(nearest(ln.xy, x)[1])}</b></div>`).join("");
    tip.hidden = false;
    if (ev) {
      tip.style.left = Math.min(ev.pageX + 14, window.scrollX + window.innerWidth - tip.offsetWidth - 8) + "px";
      tip.style.top = ev.pageY + 14 + "px";
    }
  }

  return { esc, num, clock, usd, throughput, lossText, plain, scaleFor, shown, ema, draw, hover };
})();
