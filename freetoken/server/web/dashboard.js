// The live dashboard: /metrics (numbers, by the data-metric attribute of each element), /api/stats
// (the engine snapshot behind /metrics with its per-(layer, expert) counters, and the last
// finished requests) and /v1/memory (the plan), polled every POLL_MS while the tab is visible.
"use strict";

(() => {
  const POLL_MS = 2000, MEMORY_EVERY = 5, THROUGHPUT_POINTS = 150;
  const KINDS = ["hits", "fills", "cpu_experts"];
  const $ = (id) => document.getElementById(id);
  const dash = FT.dash = { polls: 0, metrics: {}, stats: null, memory: null, throughput: [], busy: false };

  function metricValue(name, labels, how) {
    const m = dash.metrics;
    const match = (e) => Object.entries(labels).every(([k, v]) => e.labels[k] === v) &&
                         (Object.keys(labels).length || how === "sum" || !Object.keys(e.labels).length);
    if (how === "mean") {
      const s = (m[name + "_sum"] || []).find(match), c = (m[name + "_count"] || []).find(match);
      return s && c && c.value ? s.value / c.value : null;
    }
    const es = (m[name] || m[name + "_total"] || []).filter(match);   // a gauge that became a counter
    if (!es.length) return null;
    return how === "sum" ? es.reduce((a, e) => a + e.value, 0) : es[0].value;
  }

  function parseLabels(s) {
    const out = {};
    for (const kv of (s || "").split(",").filter(Boolean)) { const [k, v] = kv.split("="); out[k] = v; }
    return out;
  }

  function show(el, v) {
    el.dataset.value = v === null ? "" : String(v);
    el.textContent = FT.fmt(v);
  }

  function fillMetrics() {
    for (const el of document.querySelectorAll("[data-metric]")) {
      const how = el.dataset.sum ? "sum" : el.dataset.mean ? "mean" : "one";
      show(el, metricValue(el.dataset.metric, parseLabels(el.dataset.labels), how));
    }
  }

  // ---- experts ------------------------------------------------------------------------------
  function grid(kind) {
    const pe = dash.stats && dash.stats.engine && dash.stats.engine.per_expert;
    if (!pe) return null;
    if (kind !== "all") return pe[kind];
    return pe.hits.map((row, l) => row.map((v, e) => v + pe.fills[l][e] + pe.cpu_experts[l][e]));
  }

  function drawExperts() {
    const eng = (dash.stats && dash.stats.engine) || {};
    const g = grid($("heat-kind").value);
    $("heat-empty").hidden = !!g;
    $("heat-empty").textContent = eng.dense ? "Dense model: no experts to show (every layer is a dense MLP)."
      : "No per-expert counters (a backend without them).";
    $("dense-note").hidden = !eng.dense;
    $("split-list").hidden = !!eng.dense;
    $("heat-wrap").hidden = !g;
    const cache = eng.cache || {};
    $("expert-summary").textContent = eng.backend ? `backend ${eng.backend}` +
      (cache.slots !== undefined ? `, ${cache.resident}/${cache.slots} slots resident` : "") : "";
    if (!g) return;
    dash.heat = FT.charts.heatmap($("heatmap"), g);
    // per-layer sums of the heat map, each marked with the /metrics series it must equal
    const body = $("layer-table").querySelector("tbody");
    const pe = eng.per_expert;
    while (body.rows.length > pe.hits.length) body.deleteRow(-1);
    pe.hits.forEach((_, l) => {
      const row = body.rows[l] || body.insertRow();
      if (!row.cells.length) {
        row.insertCell().textContent = String(l);
        for (const k of KINDS) {
          const c = row.insertCell();
          c.dataset.check = "freetoken_engine_layer_" + k;
          c.dataset.labels = "layer=" + l;
        }
      }
      KINDS.forEach((k, i) => show(row.cells[i + 1], pe[k][l].reduce((a, b) => a + b, 0)));
    });
  }

  function heatTip(ev) {
    const tip = $("heat-tip"), h = dash.heat, pe = dash.stats && dash.stats.engine && dash.stats.engine.per_expert;
    if (!h || !pe) return;
    const r = ev.target.getBoundingClientRect();
    const e = Math.floor((ev.clientX - r.left - h.label) / h.cell), l = Math.floor((ev.clientY - r.top - h.top) / h.cell);
    if (l < 0 || l >= pe.hits.length || e < 0 || e >= pe.hits[0].length) { tip.hidden = true; return; }
    tip.textContent = `layer ${l}, expert ${e}: ${pe.hits[l][e]} hits, ${pe.fills[l][e]} fills, ${pe.cpu_experts[l][e]} CPU runs`;
    tip.style.left = (ev.clientX - r.left + 12) + "px";
    tip.style.top = (ev.clientY - r.top + 12) + "px";
    tip.hidden = false;
  }

  // ---- split --------------------------------------------------------------------------------
  function drawSplit() {
    const eng = (dash.stats && dash.stats.engine) || {};
    const bw = eng.bandwidth, tot = eng.total || {};
    $("policy").textContent = eng.policy || eng.backend || "–";
    $("qstar-ratio").textContent = bw && bw.b_h_gbs ? FT.fmt(Math.min(1, bw.b_p_gbs / bw.b_h_gbs)) : "–";
    $("guard").textContent = eng.guard ? `${eng.guard.winner} (${eng.guard.switches} switches)` : "–";
    const fill = tot.fill_fraction || 0, any = tot.fills || tot.cpu_experts;
    $("split-fill").style.width = (any ? 100 * fill : 0) + "%";
    $("split-cpu").style.width = (any ? 100 * (1 - fill) : 0) + "%";
  }

  // ---- speculative decoding: per drafter, each number marked with the /metrics series it must equal
  const SPEC_FIELDS = ["drafts", "proposed_tokens", "accepted_tokens"];
  function drawSpec() {
    const sp = dash.stats && dash.stats.engine && dash.stats.engine.speculative;
    const drafters = (sp && sp.drafters) || {};
    const names = Object.keys(drafters).sort();
    $("spec-mode").textContent = sp ? `(${sp.mode}, at most ${sp.max_draft} a step)` : "(off)";
    $("spec-none").hidden = names.length > 0;
    $("spec-table").hidden = !names.length;
    const body = $("spec-table").querySelector("tbody");
    while (body.rows.length > names.length) body.deleteRow(-1);
    names.forEach((name, i) => {
      const row = body.rows[i] || body.insertRow();
      if (row.dataset.drafter !== name) {
        while (row.cells.length) row.deleteCell(-1);
        row.dataset.drafter = name;
        row.insertCell().textContent = name;
        for (const f of [...SPEC_FIELDS, null, "mean_accepted_length"]) {
          const c = row.insertCell();
          if (f) c.dataset.check = `freetoken_engine_speculative_drafters_${name}_${f}`;
        }
      }
      const d = drafters[name];
      SPEC_FIELDS.forEach((f, k) => show(row.cells[k + 1], d[f]));
      show(row.cells[4], d.proposed_tokens ? d.accepted_tokens / d.proposed_tokens : null);
      show(row.cells[5], d.mean_accepted_length);
    });
    const extra = [];
    if (sp && sp.draft_model) extra.push(`draft model: ${FT.fmt(1000 * sp.draft_model.per_token_s)} ms a drafted token, ` +
      `${sp.draft_model.rows_rolled_back} rows rolled back`);
    if (sp && sp.lookahead && sp.lookahead.prefetched !== undefined) extra.push(`expert lookahead: ${sp.lookahead.prefetched} prefetched, ` +
      `${sp.lookahead.used} used, ${sp.lookahead.wasted} wasted`);
    $("spec-extra").textContent = extra.join(" · ");
  }

  // ---- charts -------------------------------------------------------------------------------
  function drawCharts() {
    const reqs = (dash.stats && dash.stats.requests) || [];
    FT.charts.series($("chart-tps"), reqs.filter((r) => r.decode_tps > 0).map((r) => ({ t: r.time, y: r.decode_tps })),
                     dash.throughput, " tok/s");
    FT.charts.series($("chart-ttft"), reqs.filter((r) => r.ttft_s !== null).map((r) => ({ t: r.time, y: r.ttft_s })), null, " s");
    FT.charts.stacked($("chart-prefix"), reqs.slice(-60).map((r) => ({ a: r.cached_tokens, b: r.prompt_tokens - r.cached_tokens })));
  }

  function throughputPoint() {
    const now = Date.now() / 1000, gen = metricValue("freetoken_generation_tokens_total", {}, "one");
    if (gen === null) return;
    if (dash.lastGen) dash.throughput.push({ t: now, y: Math.max(0, gen - dash.lastGen.v) / (now - dash.lastGen.t) });
    dash.lastGen = { t: now, v: gen };
    if (dash.throughput.length > THROUGHPUT_POINTS) dash.throughput.shift();
  }

  // ---- memory -------------------------------------------------------------------------------
  function drawMemory() {
    const box = $("memory"), plan = dash.memory;
    box.textContent = "";
    if (!plan) { box.append(FT.el("p", "muted", "No memory plan.")); return; }
    for (const [dev, d] of Object.entries(plan.devices || {})) {
      const wrap = FT.el("div", "mem-device");
      wrap.append(FT.el("div", "mem-title", `${dev}: ${FT.bytes(d.planned)} planned of ${FT.bytes(d.available)}`));
      const use = FT.el("div", "mem-bar");       // the plan against what the device has
      const used = FT.el("span", "mem-seg used");
      used.style.width = Math.min(100, 100 * d.planned / Math.max(1, d.available)) + "%";
      use.append(used);
      wrap.append(use);
      const bar = FT.el("div", "mem-bar");       // the plan's parts, to the planned total
      bar.dataset.device = dev;
      (plan.items || []).filter((i) => i.device === dev).forEach((i, k) => {
        const seg = FT.el("span", "mem-seg c" + (k % 6));
        seg.style.width = (100 * i.nbytes / Math.max(1, d.planned)) + "%";
        seg.title = `${i.name}: ${FT.bytes(i.nbytes)} — ${i.note}`;
        seg.dataset.name = i.name;
        bar.append(seg);
      });
      wrap.append(bar);
      const legend = FT.el("ul", "mem-legend");
      (plan.items || []).filter((i) => i.device === dev).forEach((i, k) => {
        const li = FT.el("li");
        li.append(FT.el("span", "sw c" + (k % 6)), document.createTextNode(`${i.name} ${FT.bytes(i.nbytes)}`));
        legend.append(li);
      });
      wrap.append(legend);
      box.append(wrap);
    }
    if (plan.current) {
      const now = FT.el("p", "muted");
      // a budget is not a use: where a component reports its use, show it beside the budget
      now.textContent = "now: " + Object.entries(plan.current).filter(([, s]) => s)
        .map(([k, s]) => `${k.replace("_", " ")} ` + (s.used_bytes !== undefined
          ? `${FT.bytes(s.used_bytes)} used of ${FT.bytes(s.bytes)} budget` : FT.bytes(s.bytes))).join(", ");
      box.append(now);
    }
  }

  async function resize(ev) {
    ev.preventDefault();
    const body = {};
    for (const input of ev.target.querySelectorAll("input")) if (input.value !== "") body[input.name] = Number(input.value);
    const out = $("resize-result");
    try {
      const r = await FT.postJSON("/admin/memory", body, "admin");
      const b = await r.json();
      if (!r.ok) throw new Error(`${r.status}: ${(b.error && b.error.message) || r.statusText}`);
      out.textContent = "done: " + Object.entries(b.components || {}).filter(([, c]) => c)
        .map(([k, c]) => `${k} ${FT.bytes(c.before)} → ${FT.bytes(c.after)}`).join(", ");
      dash.memory = await FT.json("/v1/memory");
      drawMemory();
    } catch (e) { out.textContent = String(e.message || e); }
  }

  // ---- the loop -----------------------------------------------------------------------------
  async function refresh() {
    if (dash.busy) return;
    dash.busy = true;
    try {
      const [mr, stats] = await Promise.all([FT.fetch("/metrics"), FT.json("/api/stats")]);
      if (!mr.ok) throw new Error(`/metrics: ${mr.status}`);
      dash.metrics = FT.parseMetrics(await mr.text());
      dash.stats = stats;
      FT.model = FT.model || stats.model;
      $("model-name").textContent = stats.model;
      $("model-kind").textContent = stats.random_demo ? "(random weights)" : stats.engine && stats.engine.dense ? "(dense)" : "(MoE)";
      $("demo-banner").hidden = !stats.random_demo;
      $("status").textContent = `${stats.running} running · ${stats.waiting} waiting`;
      $("resize-form").hidden = !stats.admin;
      if (dash.polls % MEMORY_EVERY === 0) {
        dash.memory = await FT.json("/v1/memory").catch(() => null);
        drawMemory();
      }
      fillMetrics(); throughputPoint(); drawExperts(); drawSplit(); drawSpec(); drawCharts();
      dash.polls++;
      dash.error = null;
    } catch (e) {
      dash.error = String(e.message || e);
      $("status").textContent = "not updating: " + dash.error;
    } finally {
      dash.busy = false;
    }
  }
  dash.refresh = refresh;

  document.addEventListener("DOMContentLoaded", () => {
    $("heat-kind").onchange = drawExperts;
    $("heatmap").addEventListener("mousemove", heatTip);
    $("heatmap").addEventListener("mouseleave", () => { $("heat-tip").hidden = true; });
    $("resize-form").addEventListener("submit", resize);
    refresh();
    setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
  });
})();
