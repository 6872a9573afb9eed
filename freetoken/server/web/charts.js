// Small canvas charts (no library): time series, per-request bars, and the layer x expert heat map.
"use strict";

FT.charts = (() => {
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  function setup(canvas) {
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.font = "11px system-ui, sans-serif";
    return ctx;
  }

  function axes(ctx, w, h, pad, yMax, unit) {
    ctx.strokeStyle = css("--grid"); ctx.fillStyle = css("--muted");
    ctx.beginPath(); ctx.moveTo(pad, 4); ctx.lineTo(pad, h - pad); ctx.lineTo(w - 4, h - pad); ctx.stroke();
    ctx.fillText(FT.fmt(yMax) + (unit || ""), 2, 12);
    ctx.fillText("0", 2, h - pad);
  }

  function empty(ctx, w, h, text) {
    ctx.fillStyle = css("--muted");
    ctx.fillText(text || "no finished requests yet", w / 2 - 55, h / 2);
  }

  // points: [{t, y}] dots; line: [{t, y}] a polyline on the same time axis
  function series(canvas, points, line, unit) {
    const ctx = setup(canvas), w = canvas.width, h = canvas.height, pad = 22;
    const all = points.concat(line || []);
    if (!all.length) return empty(ctx, w, h);
    if (!all.some((p) => p.y > 0)) return empty(ctx, w, h, "no data yet");   // not a 1e-9 axis
    const t0 = Math.min(...all.map((p) => p.t)), t1 = Math.max(...all.map((p) => p.t), t0 + 1);
    const yMax = Math.max(...all.map((p) => p.y), 1e-9) * 1.1;
    axes(ctx, w, h, pad, yMax, unit);
    const x = (t) => pad + (w - pad - 8) * (t - t0) / (t1 - t0);
    const y = (v) => h - pad - (h - pad - 8) * v / yMax;
    if (line && line.length > 1) {
      ctx.strokeStyle = css("--accent2"); ctx.beginPath();
      line.forEach((p, i) => (i ? ctx.lineTo(x(p.t), y(p.y)) : ctx.moveTo(x(p.t), y(p.y))));
      ctx.stroke();
    }
    ctx.fillStyle = css("--accent");
    for (const p of points) { ctx.beginPath(); ctx.arc(x(p.t), y(p.y), 2.5, 0, 2 * Math.PI); ctx.fill(); }
  }

  // bars: [{a, b}] stacked per request (a: cached, b: computed)
  function stacked(canvas, bars) {
    const ctx = setup(canvas), w = canvas.width, h = canvas.height, pad = 22;
    if (!bars.length) return empty(ctx, w, h);
    const yMax = Math.max(...bars.map((b) => b.a + b.b), 1);
    axes(ctx, w, h, pad, yMax, " tok");
    const bw = Math.max(1, (w - pad - 8) / bars.length - 1);
    bars.forEach((b, i) => {
      const x0 = pad + 1 + i * (bw + 1), sy = (h - pad - 8) / yMax;
      ctx.fillStyle = css("--good"); ctx.fillRect(x0, h - pad - b.a * sy, bw, b.a * sy);
      ctx.fillStyle = css("--accent"); ctx.fillRect(x0, h - pad - (b.a + b.b) * sy, bw, b.b * sy);
    });
  }

  // grid [L][E] of counts -> cells, darker to brighter on a log scale; returns the cell size
  function heatmap(canvas, grid) {
    const L = grid.length, E = L ? grid[0].length : 0;
    const label = 26;
    const cell = Math.max(3, Math.min(18, Math.floor((canvas.parentElement.clientWidth - label - 4) / Math.max(E, 1))));
    canvas.width = label + E * cell + 2; canvas.height = 14 + L * cell + 2;
    const ctx = setup(canvas);
    const max = Math.max(1, ...grid.map((r) => Math.max(...r)));
    for (let l = 0; l < L; l++) {
      if (cell >= 9 || l % 4 === 0) { ctx.fillStyle = css("--muted"); ctx.fillText(String(l), 2, 14 + l * cell + cell - 1); }
      for (let e = 0; e < E; e++) {
        const v = grid[l][e];
        const f = v ? Math.log1p(v) / Math.log1p(max) : 0;
        ctx.fillStyle = v ? `hsl(${240 - 190 * f}, 80%, ${22 + 45 * f}%)` : css("--cell0");
        ctx.fillRect(label + e * cell, 14 + l * cell, cell - 1, cell - 1);
      }
    }
    ctx.fillStyle = css("--muted");
    ctx.fillText("expert →", label, 10);
    return { cell, label, top: 14 };
  }

  return { series, stacked, heatmap };
})();
