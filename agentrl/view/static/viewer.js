"use strict";
/* agentrl view: the page of `agentrl view RUN_DIR` and of its `--export` file.
 *
 * One script for both: served, it asks the viewer's JSON routes and polls them for new steps;
 * exported, it reads the data embedded in <script id="agentrl-data"> and asks nothing. Every
 * string of a run (tokens, rows, config) goes into the page as text, never as HTML.
 *
 * Views (the URL's hash): #curves, #steps/RUN/STEP, #t/RUN/STEP/INDEX (one trajectory),
 * #eval/RUN, #e/RUN/PROBLEM/SAMPLE (one evaluation sample), #run.
 */

// ------------------------------------------------------------------ data sources

function readEmbedded() {
  const node = document.getElementById("agentrl-data");
  const text = node ? node.textContent.trim() : "";
  return text && text !== "null" ? JSON.parse(text) : null;
}

const EMBEDDED = readEmbedded();

function embeddedSource(data) {
  return {
    live: false,
    runs: async () => data.runs.map(r => r.info),
    metrics: async (r, since) => ({rows: data.runs[r].metrics.slice(since), total: data.runs[r].metrics.length, reset: false}),
    step: async (r, step) => data.runs[r].trajectories[String(step)] || [],
    evaluation: async r => data.runs[r].eval || [],
  };
}

function httpSource() {
  async function get(path) {
    const res = await fetch(path, {cache: "no-store"});
    if (!res.ok) throw new Error(`${path}: HTTP ${res.status}`);
    return res.json();
  }
  return {
    live: true,
    runs: () => get("api/runs"),
    metrics: (r, since) => get(`api/runs/${r}/metrics?since=${since}`),
    step: (r, step) => get(`api/runs/${r}/steps/${step}`),
    evaluation: r => get(`api/runs/${r}/eval`),
  };
}

const source = EMBEDDED ? embeddedSource(EMBEDDED) : httpSource();

// ------------------------------------------------------------------ state

const state = {
  runs: [],            // info of each run (name, config, summary, steps, has_eval)
  metrics: [],         // rows of metrics.jsonl, per run
  steps: new Map(),    // "r/step" -> trajectories
  evals: new Map(),    // r -> eval rows
  updated: null,       // when the last poll brought something new
  follow: true,        // the trajectory list follows the newest step
  filters: {env: "", status: "", rmin: "", rmax: "", stale: "", turns: "", q: ""},
  evalFilter: {solved: "", q: ""},
  colour: "role",      // how tokens are coloured
  gapThreshold: 0.5,   // |behaviour - trainer| log-probability past which a token is flagged
  extraKey: "",        // the "any metric" panel's choice
};

const DASHES = ["", "6 4", "2 3", "8 3 2 3"];
const SERIES_COLOURS = ["#2f6fdf", "#e8772e", "#2e9d57", "#c23b8f", "#7b3fe4", "#8a6d1f", "#16a3b5", "#d62d2d"];
const ROLE_COLOURS = {prompt: "#e9ebef", sampled: "#cfe8d6", env: "#fde3b5"};
const ROLE_NAMES = {prompt: "prompt (not trained)", sampled: "sampled by the policy (loss mask 1)",
                    env: "env / tool output (loss mask 0)"};
const VERSION_COLOURS = ["#cfe3ff", "#ffd8b0", "#cdeccd", "#f6cdea", "#e0d4ff", "#fff0a8", "#c6eef2", "#ffc9c9",
                         "#dfe6c0", "#e5d3c1"];

// ------------------------------------------------------------------ DOM helpers

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

function svg(tag, attrs, ...kids) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) node.setAttribute(k, v);
  for (const kid of kids.flat(Infinity)) if (kid) node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  return node;
}

function fmt(x, digits = 4) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  const a = Math.abs(x);
  if (a >= 10000) return x.toFixed(0);
  if (a >= 100) return x.toFixed(1);
  if (a === 0) return "0";
  if (a < 1e-3) return x.toExponential(2);
  return String(Number(x.toPrecision(digits)));
}

const tip = document.getElementById("tip");
function showTip(event, content) {
  tip.replaceChildren(content);
  tip.hidden = false;
  const pad = 14, w = tip.offsetWidth, h = tip.offsetHeight;
  let x = event.clientX + pad, y = event.clientY + pad;
  if (x + w > window.innerWidth - 4) x = event.clientX - w - pad;
  if (y + h > window.innerHeight - 4) y = event.clientY - h - pad;
  tip.style.left = `${Math.max(4, x)}px`;
  tip.style.top = `${Math.max(4, y)}px`;
}
function hideTip() { tip.hidden = true; }
function tipTable(rows) { return el("table", {}, rows.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v)))); }

function mean(xs) { return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null; }
function std(xs) { const m = mean(xs); return xs.length ? Math.sqrt(mean(xs.map(x => (x - m) ** 2))) : null; }

// ------------------------------------------------------------------ curves

const PANELS = [  // [title, metric keys; a key ending in "*" takes every key with that prefix]
  ["reward", ["rollout/reward_mean", "rollout/success_rate"]],
  ["held-out evaluation (pass@1, 95% interval)", ["eval/pass@1"]],
  ["response length (tokens)", ["rollout/response_tokens_mean", "rollout/sequence_tokens_mean"]],
  ["turns per episode", ["rollout/turns_mean"]],
  ["loss", ["train/loss", "train/policy_loss"]],
  ["entropy and KL", ["train/entropy", "train/approx_kl"]],
  ["clip fraction", ["train/clip_frac", "train/capped_frac"]],
  ["importance weights (behaviour)", ["train/behaviour_weight_mean", "train/behaviour_weight_max"]],
  ["staleness (versions)", ["batch/staleness_mean", "batch/staleness_max"]],
  ["advantages and group spread", ["batch/adv/adv_abs_mean", "batch/adv/reward_std", "batch/adv/frac_groups_zero_std"]],
  ["gradient norm", ["train/grad_norm"]],
  ["learning rate", ["train/lr"]],
  ["throughput (tokens/s)", ["perf/generation_tokens_per_s", "perf/train_tokens_per_s"]],
  ["time per step (s)", ["perf/step_s", "perf/train_s", "perf/trainer_wait_s", "perf/weight_stage_s", "perf/weight_pause_s"]],
  ["idle fraction (waiting on the other side)", ["perf/trainer_idle_fraction", "perf/generator_idle_fraction"]],
  ["failed episodes", ["rollout/failed", "rollout/failed_*", "batch/num_stale"]],
];

function allKeys() {
  const keys = new Set();
  for (const rows of state.metrics) for (const row of rows) for (const k of Object.keys(row)) if (k !== "step") keys.add(k);
  return [...keys].sort();
}

function expandKeys(keys, present) {
  const out = [];
  for (const k of keys) {
    if (k.endsWith("*")) out.push(...present.filter(p => p.startsWith(k.slice(0, -1)) && !out.includes(p)));
    else if (present.includes(k) && !out.includes(k)) out.push(k);
  }
  return out;
}

function seriesOf(r, key) {
  const pts = [];
  for (const row of state.metrics[r] || []) {
    const v = row[key];
    if (typeof v === "number" && Number.isFinite(v)) pts.push([row.step, v]);
  }
  return pts;
}

function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
  const raw = (hi - lo) / n, mag = 10 ** Math.floor(Math.log10(raw));
  const stepSize = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  const first = Math.floor(lo / stepSize + 1e-9), last = Math.ceil(hi / stepSize - 1e-9), ticks = [];
  for (let i = first; i <= last; i++) ticks.push(i * stepSize);  // the data lies within the first and last tick
  ticks.size = stepSize;
  return ticks;
}

function tickLabel(t, size) {  // as many decimals as the tick spacing needs
  if (t === 0) return "0";
  if (size < 1e-3 || Math.abs(t) >= 1e6) return t.toExponential(1);
  let decimals = Math.max(0, -Math.floor(Math.log10(size) + 1e-9));
  if (Math.abs(size * 10 ** decimals - Math.round(size * 10 ** decimals)) > 1e-6) decimals += 1;  // 0.25 needs 2
  return t.toFixed(Math.min(6, decimals));
}

/* One chart: series = [{label, colour, dash, pts: [[step, y]], band: {step: halfwidth}}]; bars = optional stacked
 * bars [{step, parts: [[label, value, colour]]}]. */
function drawChart(box, series, bars) {
  const W = Math.max(280, box.clientWidth), H = 170, L = 46, R = 10, T = 8, B = 22;
  const xs = series.flatMap(s => s.pts.map(p => p[0])).concat((bars || []).map(b => b.step));
  let ys = series.flatMap(s => s.pts.flatMap(p => s.band && s.band[p[0]] !== undefined ?
    [p[1] - s.band[p[0]], p[1] + s.band[p[0]]] : [p[1]]));
  if (bars) ys = ys.concat(bars.map(b => b.parts.reduce((a, p) => a + p[1], 0)), [0]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (bars) { x0 -= 0.5; x1 += 0.5; }  // room for the first and last bar
  const yt = niceTicks(Math.min(...ys), Math.max(...ys), 4);
  const y0 = yt[0], y1 = yt[yt.length - 1];
  const X = s => L + (s - x0) / (x1 - x0) * (W - L - R), Y = v => T + (1 - (v - y0) / (y1 - y0 || 1)) * (H - T - B);
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H});
  for (const t of yt) {
    root.append(svg("line", {class: "grid", x1: L, x2: W - R, y1: Y(t), y2: Y(t)}));
    root.append(svg("text", {x: L - 5, y: Y(t) + 3, "text-anchor": "end"}, tickLabel(t, yt.size)));
  }
  for (const t of niceTicks(x0, x1, 5).filter(t => t >= x0 && t <= x1 && Number.isInteger(t))) {
    root.append(svg("text", {x: X(t), y: H - 6, "text-anchor": "middle"}, t));
  }
  root.append(svg("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
  if (bars) {
    const steps = [...new Set(bars.map(b => b.step))];
    const bw = Math.max(2, Math.min(24, (W - L - R) / Math.max(steps.length, 1) * 0.7));
    for (const b of bars) {
      let acc = 0;
      for (const [, v, colour] of b.parts) {
        root.append(svg("rect", {x: X(b.step) - bw / 2, y: Y(acc + v), width: bw, height: Math.max(0, Y(acc) - Y(acc + v)),
                                 fill: colour}));
        acc += v;
      }
    }
  }
  for (const s of series) {
    if (s.band) {
      const up = s.pts.map(p => `${X(p[0])},${Y(p[1] + (s.band[p[0]] || 0))}`);
      const down = s.pts.slice().reverse().map(p => `${X(p[0])},${Y(p[1] - (s.band[p[0]] || 0))}`);
      root.append(svg("polygon", {points: up.concat(down).join(" "), fill: s.colour, "fill-opacity": 0.12}));
    }
    root.append(svg("polyline", {points: s.pts.map(p => `${X(p[0])},${Y(p[1])}`).join(" "), fill: "none",
                                 stroke: s.colour, "stroke-width": 1.8, "stroke-dasharray": s.dash || null}));
    if (s.pts.length <= 40) {
      for (const p of s.pts) root.append(svg("circle", {cx: X(p[0]), cy: Y(p[1]), r: 2.4, fill: s.colour}));
    }
  }
  const hover = svg("line", {class: "hover", y1: T, y2: H - B, visibility: "hidden"});
  root.append(hover);
  const steps = [...new Set(xs)].sort((a, b) => a - b);
  root.addEventListener("mousemove", event => {
    const rect = root.getBoundingClientRect();
    const sx = x0 + (event.clientX - rect.left - L) / (W - L - R) * (x1 - x0);
    const step = steps.reduce((best, s) => Math.abs(s - sx) < Math.abs(best - sx) ? s : best, steps[0]);
    hover.setAttribute("x1", X(step)); hover.setAttribute("x2", X(step)); hover.setAttribute("visibility", "visible");
    const rows = [["step", step]];
    for (const s of series) {
      const p = s.pts.find(q => q[0] === step);
      if (p) rows.push([s.label, fmt(p[1]) + (s.band && s.band[step] !== undefined ? ` ± ${fmt(s.band[step], 2)}` : "")]);
    }
    for (const b of (bars || []).filter(q => q.step === step)) for (const [label, v] of b.parts) rows.push([label, fmt(v)]);
    showTip(event, tipTable(rows));
  });
  root.addEventListener("mouseleave", () => { hover.setAttribute("visibility", "hidden"); hideTip(); });
  box.replaceChildren(root);
}

function chartPanel(title, keys, {select} = {}) {
  const present = allKeys();
  const expanded = expandKeys(keys, present);
  const series = [];
  const legend = el("div", {class: "legend"});
  expanded.forEach((key, i) => {
    const colour = SERIES_COLOURS[i % SERIES_COLOURS.length];
    legend.append(el("span", {}, el("i", {style: `background:${colour}`}), key.split("/").slice(1).join("/") || key));
    state.runs.forEach((run, r) => {
      const pts = seriesOf(r, key);
      if (!pts.length) return;
      let band = null;
      if (present.includes(`${key}_ci95`)) band = Object.fromEntries(seriesOf(r, `${key}_ci95`));
      series.push({label: state.runs.length > 1 ? `${run.name}: ${key}` : key, colour, dash: DASHES[r % DASHES.length], pts, band});
    });
  });
  if (!series.length && !select) return null;
  const box = el("div", {class: "plot"});
  const panel = el("div", {class: "card chart", "data-keys": expanded.join(" ")}, el("h3", {}, title, select || ""), legend, box);
  panel.draw = () => series.length ? drawChart(box, series) : box.replaceChildren(el("div", {class: "empty"}, "no data"));
  return panel;
}

function stalenessPanel() {
  const rows = state.metrics[0] || [];
  const ages = [...new Set(rows.flatMap(row => Object.keys(row).filter(k => k.startsWith("staleness/"))
    .map(k => Number(k.split("/")[1]))))].sort((a, b) => a - b);
  if (!ages.length) return null;
  const colour = age => `hsl(${140 - 140 * Math.min(1, age / Math.max(1, ages[ages.length - 1]))}, 55%, 55%)`;
  const bars = rows.filter(row => ages.some(a => row[`staleness/${a}`] !== undefined)).map(row => ({
    step: row.step, parts: ages.map(a => [`age ${a}`, row[`staleness/${a}`] || 0, colour(a)]),
  }));
  const legend = el("div", {class: "legend"}, ages.map(a => el("span", {}, el("i", {style: `background:${colour(a)}`}), `${a} behind`)));
  const box = el("div", {class: "plot"});
  const title = `trajectories by staleness (versions behind)${state.runs.length > 1 ? ` — ${state.runs[0].name}` : ""}`;
  const panel = el("div", {class: "card chart", "data-keys": "staleness/*"}, el("h3", {}, title), legend, box);
  panel.draw = () => drawChart(box, [], bars);
  return panel;
}

function summaryFacts(run, rows) {
  const s = run.summary || {};
  const last = key => { for (let i = rows.length - 1; i >= 0; i--) if (typeof rows[i][key] === "number") return rows[i][key]; return null; };
  const trainSteps = rows.filter(row => row["rollout/reward_mean"] !== undefined || row["train/loss"] !== undefined);
  const facts = [
    ["steps", trainSteps.length ? trainSteps[trainSteps.length - 1].step : (s.steps ?? 0)],
    ["reward (last step)", fmt(last("rollout/reward_mean"), 3)],
    ["success rate (last)", fmt(last("rollout/success_rate"), 3)],
    ["eval pass@1", s.eval_before !== undefined || s.eval_after !== undefined ?
      el("span", {}, fmt(s.eval_before, 3), el("small", {}, " → "), s.eval_after === undefined ? "…" : fmt(s.eval_after, 3))
      : fmt(last("eval/pass@1"), 3)],
    ["minutes", fmt(s.minutes ?? last("perf/elapsed_min"), 3)],
  ];
  return el("div", {class: "facts"}, facts.map(([k, v]) => el("div", {class: "fact"}, el("div", {class: "k"}, k), el("div", {class: "v"}, v))));
}

function renderCurves(main) {
  if (!state.runs.length) return;
  const rows = state.metrics[0] || [];
  main.append(summaryFacts(state.runs[0], rows));
  const grid = el("div", {class: "charts"});
  const panels = [];
  for (const [title, keys] of PANELS) {
    const p = chartPanel(title, keys);
    if (p) panels.push(p);
    if (title.startsWith("staleness")) { const h = stalenessPanel(); if (h) panels.push(h); }
  }
  const keys = allKeys().filter(k => !k.startsWith("staleness/"));
  if (keys.length) {
    if (!keys.includes(state.extraKey)) state.extraKey = keys[0];
    const select = el("select", {onchange: e => { state.extraKey = e.target.value; render(); }},
      keys.map(k => el("option", {value: k, selected: k === state.extraKey}, k)));
    panels.push(chartPanel("any metric", [state.extraKey], {select}));
  }
  if (!panels.length) {
    const run = state.runs[0];
    main.append(run.has_eval && !run.has_training ?
      el("div", {class: "card empty"}, "This folder holds an evaluation (`agentrl eval`), not a training run: it has no curves. ",
        el("a", {href: "#eval/0"}, "See the evaluation.")) :
      el("div", {class: "card empty"}, "No metrics yet: metrics.jsonl is empty or absent. ",
        source.live ? "This page polls it and shows the first step as soon as it is written." : ""));
    return;
  }
  grid.append(...panels);
  main.append(grid);
  for (const p of panels) p.draw();
}

// ------------------------------------------------------------------ one step's trajectories

function roleOf(t) {
  const mask = t.loss_mask || [];
  const first = mask.indexOf(1);
  return mask.map((m, i) => m ? "sampled" : (first < 0 || i < first ? "prompt" : "env"));
}

// What a segment of the stream is, read from its own text: the chat template's role marker at the
// head of an env segment (a tool's result, or a user turn such as feedback; Qwen-style templates
// wrap a tool result in a user turn's <tool_response>), a tool call in a sampled one.
const TOOL_TURN = /<\|tool\|>|<\|im_start\|>\s*tool|<tool_response>|ipython|<\|observation\|>|^\W*tool\b/;
const USER_TURN = /<\|user\|>|<\|im_start\|>\s*user|^\W*user\b/;
const TOOL_CALL = /<tool_call>|<\|tool_call|<\|python_tag\|>|\[TOOL_CALLS\]/;

function segmentKind(t, roles, start) {
  const tokens = t.tokens || [];
  let end = start;
  while (end < roles.length && roles[end] === roles[start]) end += 1;
  if (roles[start] === "prompt") return "";
  if (roles[start] === "sampled") return TOOL_CALL.test(tokens.slice(start, end).join("")) ? "tool call" : "";
  const head = tokens.slice(start, Math.min(end, start + 16)).join("");
  if (TOOL_TURN.test(head)) return "tool result";
  if (USER_TURN.test(head)) return "user turn";
  return "";
}

function segmentLabel(role, kind, turn, continued) {
  if (role === "prompt") return "prompt";
  if (role === "sampled") return `turn ${turn} · sampled by the policy${kind ? ` · ${kind}` : ""}${continued ? " (continued)" : ""} · trained`;
  return `${kind ? `env · ${kind}` : "env / tool output"} · not trained`;
}

function completionText(t) {
  const mask = t.loss_mask || [], tokens = t.tokens || [];
  const first = mask.indexOf(1);
  if (first < 0) return t.error || "";
  let out = "";
  for (let i = first; i < tokens.length; i++) {
    if (!mask[i] && (i === first || mask[i - 1])) out += " ⟦env⟧ ";
    if (mask[i]) out += tokens[i];
  }
  return out.replace(/\n/g, "↵");
}

const SPECIAL = /^<\|[^|]*\|>$|^<\/?s>$|^\[[A-Z]+\]$/;  // chat-template markers, left out of previews

function promptText(t) {  // the end of the prompt, the template's markers left out
  const mask = t.loss_mask || [], tokens = t.tokens || [];
  const first = mask.indexOf(1);
  return tokens.slice(0, first < 0 ? tokens.length : first).filter(x => !SPECIAL.test(x)).join("").replace(/\s+/g, " ").trim();
}

function fullText(t) { return (t.tokens || []).join(""); }

function filterValues(rows, key) {
  return [...new Set(rows.map(t => t[key]).filter(v => v !== undefined && v !== null && v !== ""))].sort((a, b) => a > b ? 1 : -1);
}

function passes(t, f) {
  if (f.env && t.env !== f.env) return false;
  if (f.status && t.status !== f.status) return false;
  if (f.rmin !== "" && !(t.reward >= Number(f.rmin))) return false;
  if (f.rmax !== "" && !(t.reward <= Number(f.rmax))) return false;
  if (f.stale !== "" && String(t.staleness) !== f.stale) return false;
  if (f.turns !== "" && String(t.num_turns) !== f.turns) return false;
  if (f.q && !fullText(t).toLowerCase().includes(f.q.toLowerCase()) && !(t.error || "").toLowerCase().includes(f.q.toLowerCase())) return false;
  return true;
}

function highlighted(text, q, limit = 220) {
  if (text.length > limit) {
    const at = q ? text.toLowerCase().indexOf(q.toLowerCase()) : -1;
    const from = at > limit - 40 ? at - 60 : 0;
    text = (from ? "…" : "") + text.slice(from, from + limit) + "…";
  }
  if (!q) return [text];
  const out = [], lower = text.toLowerCase(), ql = q.toLowerCase();
  let i = 0, j;
  while ((j = lower.indexOf(ql, i)) >= 0) { out.push(text.slice(i, j), el("mark", {}, text.slice(j, j + q.length))); i = j + q.length; }
  out.push(text.slice(i));
  return out;
}

function signedBar(v, scale) {
  const w = Math.min(50, Math.abs(v || 0) / (scale || 1) * 50);
  const colour = v >= 0 ? "var(--good)" : "var(--bad)";
  return el("span", {class: "bar"}, el("span", {style: `left:${v >= 0 ? 50 : 50 - w}%;width:${w}%;background:${colour}`}));
}

function statusBadge(s) { return el("span", {class: "badge" + (s === "ok" ? "" : " bad")}, s || "?"); }

function trajectoryRows(rows, hrefOf, f) {
  const advScale = Math.max(1e-9, ...rows.map(t => Math.abs(t.advantage || 0)));
  const rScale = Math.max(1e-9, ...rows.map(t => Math.abs(t.reward || 0)));
  const columns = [["#", 44], ["reward", 120], ["advantage", 130], ["status", 84], ["turns", 56], ["segment", 70],
                   ["sampled / all tokens", 150], ["stale", 56], ["prompt (its end)", 210], ["completion", null]];
  return el("table", {class: "rows fixed"},
    el("colgroup", {}, columns.map(([, w]) => el("col", {style: w ? `width:${w}px` : null}))),
    el("tr", {}, columns.map(([h], i) => el("th", {class: i && i < 8 && i !== 3 ? "num" : ""}, h))),
    rows.map(t => el("tr", {class: "link", "data-index": t.index, onclick: () => { location.hash = hrefOf(t); }},
      el("td", {}, el("a", {href: hrefOf(t)}, t.index)),
      el("td", {class: "num"}, fmt(t.reward, 3), signedBar(t.reward, rScale)),
      el("td", {class: "num"}, t.advantage === undefined ? "–" : [fmt(t.advantage, 3), signedBar(t.advantage, advScale)]),
      el("td", {}, statusBadge(t.status)),
      el("td", {class: "num"}, t.num_turns),
      el("td", {class: "num"}, t.segments > 1 ? `${t.segment}/${t.segments}` : "–"),
      el("td", {class: "num"}, `${t.sampled_tokens} / ${(t.input_ids || []).length}`),
      el("td", {class: "num"}, t.staleness ?? "–"),
      el("td", {class: "preview prompt"}, highlighted(promptText(t).slice(-70), f.q, 70)),
      failedRow(t) ? el("td", {class: "preview error", title: t.error}, highlighted(t.error, f.q)) :
        el("td", {class: "preview", title: completionText(t)}, highlighted(completionText(t), f.q)))));
}

function failedRow(t) { return t.status !== "ok" && Boolean(t.error); }  // a failed episode: its error, not its text

function toolbarSelect(label, key, values, filters, rerender) {
  return el("label", {}, label, el("select", {onchange: e => { filters[key] = e.target.value; rerender(); }},
    el("option", {value: ""}, "any"), values.map(v => el("option", {value: String(v), selected: filters[key] === String(v)}, String(v)))));
}

function runPicker(r, hrefOf) {
  if (state.runs.length < 2) return null;
  return el("label", {}, "run", el("select", {onchange: e => { location.hash = hrefOf(Number(e.target.value)); }},
    state.runs.map((run, i) => el("option", {value: i, selected: i === r}, run.name))));
}

async function renderSteps(main, r, step) {
  const run = state.runs[r];
  if (!run) return main.append(el("div", {class: "card empty"}, `no run ${r}`));
  const steps = run.steps || [];
  if (!steps.length) {
    main.append(el("div", {class: "card empty"}, "No trajectory samples yet (trajectories/step_NNNNNN.jsonl). ",
      source.live ? "New steps appear here as the run writes them." : ""));
    return;
  }
  if (step === null || !steps.includes(step)) step = steps[steps.length - 1];
  const following = state.follow && step === steps[steps.length - 1];
  const rows = await loadStep(r, step);
  const f = state.filters;
  const list = el("div");
  const count = el("span", {class: "muted"});
  const idx = steps.indexOf(step);
  const go = s => { location.hash = `#steps/${r}/${s}`; };
  const toolbar = el("div", {class: "toolbar card"},
    runPicker(r, i => `#steps/${i}`),
    el("label", {}, "step",
      el("button", {disabled: idx <= 0, onclick: () => { state.follow = false; go(steps[idx - 1]); }}, "◀"),
      el("select", {id: "step-select", onchange: e => { state.follow = false; go(Number(e.target.value)); }},
        steps.map(s => el("option", {value: s, selected: s === step}, s))),
      el("button", {disabled: idx >= steps.length - 1, onclick: () => go(steps[idx + 1])}, "▶")),
    source.live ? el("label", {}, el("input", {type: "checkbox", checked: state.follow, onchange: e => {
      state.follow = e.target.checked; if (state.follow) go(steps[steps.length - 1]);
    }}), "follow the newest step") : null,
    toolbarSelect("env", "env", filterValues(rows, "env"), f, draw),
    toolbarSelect("status", "status", filterValues(rows, "status"), f, draw),
    el("label", {}, "reward", el("input", {type: "number", step: "any", placeholder: "min", value: f.rmin, oninput: e => { f.rmin = e.target.value; draw(); }}),
      "–", el("input", {type: "number", step: "any", placeholder: "max", value: f.rmax, oninput: e => { f.rmax = e.target.value; draw(); }})),
    toolbarSelect("staleness", "stale", filterValues(rows, "staleness"), f, draw),
    toolbarSelect("turns", "turns", filterValues(rows, "num_turns"), f, draw),
    el("label", {}, "search", el("input", {type: "search", id: "search", placeholder: "text in the tokens", value: f.q,
      oninput: e => { f.q = e.target.value; draw(); }})),
    count);
  main.append(el("h2", {}, `Step ${step}`, el("span", {class: "muted"}, ` · ${run.name}${following && source.live ? " · following" : ""}`)),
    toolbar, list);

  function draw() {
    const kept = rows.filter(t => passes(t, f));
    const failed = rows.filter(t => t.status !== "ok").length;
    count.textContent = `${kept.length} of ${rows.length} trajectories` + (failed ? ` (${failed} failed, not trained on)` : "");
    const groups = new Map();
    for (const t of kept) { const g = String(t.group_id ?? ""); if (!groups.has(g)) groups.set(g, []); groups.get(g).push(t); }
    list.replaceChildren();
    if (!kept.length) list.append(el("div", {class: "card empty"}, "No trajectory passes the filters."));
    for (const [gid, members] of groups) {
      const all = rows.filter(t => String(t.group_id ?? "") === gid);
      const rewards = all.filter(t => t.status === "ok").map(t => t.reward);
      const advs = all.map(t => t.advantage).filter(a => typeof a === "number");
      list.append(el("div", {class: "card group", "data-group": gid},
        el("div", {class: "head"}, el("span", {}, "GRPO group ", el("b", {}, gid || "(none)")),
          el("span", {class: "muted"}, `${all.length} in this sample`),
          el("span", {}, `reward ${fmt(mean(rewards), 3)} ± ${fmt(std(rewards), 3)}`),
          advs.length ? el("span", {}, `advantages ${fmt(Math.min(...advs), 3)} … ${fmt(Math.max(...advs), 3)}`) : null,
          rewards.length > 1 && std(rewards) === 0 ? el("span", {class: "badge warn"}, "equal rewards: no signal") : null),
        trajectoryRows(members, t => `#t/${r}/${step}/${t.index}`, f)));
    }
  }
  draw();
}

async function loadStep(r, step) {
  const key = `${r}/${step}`;
  if (!state.steps.has(key)) state.steps.set(key, await source.step(r, step));
  return state.steps.get(key);
}

// ------------------------------------------------------------------ one trajectory, token by token

function heat(v, hue) {  // v in [0, 1] -> a light-to-strong tint
  const x = Math.max(0, Math.min(1, v));
  return `hsl(${hue}, ${40 + 45 * x}%, ${96 - 38 * x}%)`;
}

function tokenColouring(t, mode) {
  const roles = roleOf(t), versions = t.versions || [];
  const sampledVersions = [...new Set(versions.filter((v, i) => t.loss_mask[i] && v >= 0))].sort((a, b) => a - b);
  const vColour = v => VERSION_COLOURS[sampledVersions.indexOf(v) % VERSION_COLOURS.length];
  const trainer = t.trainer_logprobs, ent = t.entropy;
  if (mode === "version") {
    return {colour: i => roles[i] === "sampled" ? vColour(versions[i]) : ROLE_COLOURS.prompt,
            keys: [["not sampled", ROLE_COLOURS.prompt, "-1"], ...sampledVersions.map(v => [`policy version ${v}`, vColour(v), String(v)])]};
  }
  if (mode === "gap" && trainer) {
    return {colour: i => roles[i] === "sampled" && i > 0 ? heat(Math.abs(t.logprobs[i] - trainer[i]) / state.gapThreshold / 2, 0) : ROLE_COLOURS.prompt,
            keys: [["not sampled", ROLE_COLOURS.prompt], ["|gap| = 0", heat(0, 0)], [`|gap| ≥ ${2 * state.gapThreshold}`, heat(1, 0)]]};
  }
  if (mode === "logprob") {
    return {colour: i => roles[i] === "sampled" ? heat(-t.logprobs[i] / 4, 220) : ROLE_COLOURS.prompt,
            keys: [["not sampled", ROLE_COLOURS.prompt], ["log p = 0", heat(0, 220)], ["log p ≤ −4", heat(1, 220)]]};
  }
  if (mode === "entropy" && ent) {
    const top = Math.max(1e-6, ...ent);
    return {colour: i => roles[i] === "sampled" ? heat(ent[i] / top, 275) : ROLE_COLOURS.prompt,
            keys: [["not sampled", ROLE_COLOURS.prompt], ["entropy 0", heat(0, 275)], [`entropy ${fmt(top, 3)}`, heat(1, 275)]]};
  }
  return {colour: i => ROLE_COLOURS[roles[i]],
          keys: Object.entries(ROLE_COLOURS).map(([role, c]) => [ROLE_NAMES[role], c, role])};
}

function originalPosition(t, i) {  // token i of a truncated export -> its position in the trajectory
  const cut = t.truncated;
  return cut && i >= cut.head ? cut.total - (t.input_ids.length - i) : i;
}

function tokenTip(t, i, role) {
  const rows = [["position", originalPosition(t, i)], ["token id", t.input_ids[i]],
                ["text", el("span", {class: "t"}, JSON.stringify(t.tokens ? t.tokens[i] : "").slice(1, -1))],
                ["role", role], ["loss mask", t.loss_mask[i]], ["version", t.versions[i] < 0 ? "– (not sampled)" : t.versions[i]]];
  if (t.loss_mask[i]) {
    rows.push(["behaviour log p", fmt(t.logprobs[i])]);
    if (t.trainer_logprobs) {
      const gap = t.logprobs[i] - t.trainer_logprobs[i];
      rows.push(["trainer log p", fmt(t.trainer_logprobs[i])], ["gap", fmt(gap) + (Math.abs(gap) > state.gapThreshold ? "  ⚠" : "")]);
    }
  }
  if (t.entropy) rows.push(["entropy", fmt(t.entropy[i])]);
  return tipTable(rows);
}

function tokenStream(t) {
  const roles = roleOf(t), {colour, keys} = tokenColouring(t, state.colour);
  const box = el("div", {class: "tokens", id: "tokens"});
  const trainer = t.trainer_logprobs;
  let turn = 0, flagged = 0;
  for (let i = 0; i < t.input_ids.length; i++) {
    const role = roles[i];
    const cut = t.truncated && i === t.truncated.head;
    if (cut) {
      box.append(el("span", {class: "cut-note"}, `… ${t.truncated.total - t.input_ids.length} tokens left out of this export (the trajectory has ${t.truncated.total}) …`));
      turn = t.truncated.turns_before_tail ?? turn;
    }
    if (i === 0 || role !== roles[i - 1] || cut) {
      const continued = cut && role === "sampled" && t.truncated.tail_continues;
      if (role === "sampled" && !continued) turn += 1;
      const kind = segmentKind(t, roles, i);
      box.append(el("span", {class: "turn", "data-role": role, "data-kind": kind}, segmentLabel(role, kind, turn, continued)));
    } else if (role === "sampled" && t.versions[i] !== t.versions[i - 1]) {
      box.append(el("span", {class: "vcut", "data-label": `v${t.versions[i - 1]}→v${t.versions[i]}`,
        title: `weight update: the generation was interrupted at version ${t.versions[i - 1]} and resumed at ${t.versions[i]}`}));
    }
    const text = t.tokens ? t.tokens[i] : `[${t.input_ids[i]}]`;
    const gap = trainer && t.loss_mask[i] && i > 0 && Math.abs(t.logprobs[i] - trainer[i]) > state.gapThreshold;
    if (gap) flagged += 1;
    const span = el("span", {class: "tok" + (gap ? " gap" : "") + (text.includes("\n") ? " nl" : ""), "data-i": i,
      "data-pos": originalPosition(t, i),
      "data-mask": t.loss_mask[i], "data-version": t.versions[i], "data-role": role, style: `background:${colour(i)}`},
      text.includes("\n") ? text.replace(/\n/g, "↵") : text);
    span.addEventListener("mousemove", e => showTip(e, tokenTip(t, i, role)));
    span.addEventListener("mouseleave", hideTip);
    box.append(span);
    if (text.includes("\n")) box.append("\n");
  }
  return {box, keys, flagged};
}

function lpStrip(t, tokensBox) {  // behaviour vs trainer log-probabilities along the sampled tokens
  if (!t.trainer_logprobs) return null;
  const idx = t.loss_mask.map((m, i) => m && i > 0 ? i : -1).filter(i => i >= 0);
  if (!idx.length) return null;
  const box = el("div", {class: "plot"});
  const card = el("div", {class: "card lpstrip"}, el("div", {class: "legend"},
    el("span", {}, el("i", {style: "background:#2f6fdf"}), "behaviour log p (sampler)"),
    el("span", {}, el("i", {style: "background:#e8772e"}), "trainer log p (before the update)"),
    el("span", {}, el("i", {style: "background:#d62d2d"}), `|gap| > ${state.gapThreshold}`),
    el("span", {}, "— over the sampled tokens, in order; dotted lines separate turns")), box);
  card.draw = () => {
    const W = Math.max(300, box.clientWidth), H = 110, L = 40, R = 6, T = 8, B = 8;
    const lo = Math.min(-0.5, ...idx.flatMap(i => [t.logprobs[i], t.trainer_logprobs[i]]));
    const X = k => L + (idx.length === 1 ? 0.5 : k / (idx.length - 1)) * (W - L - R), Y = v => T + (v / lo) * (H - T - B);
    const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H});
    root.append(svg("line", {x1: L, x2: W - R, y1: Y(0), y2: Y(0), stroke: "#e2e5eb"}),
      svg("text", {x: L - 5, y: Y(0) + 3, "text-anchor": "end"}, "0"), svg("text", {x: L - 5, y: Y(lo), "text-anchor": "end"}, fmt(lo, 2)));
    idx.forEach((i, k) => {
      if (k && idx[k - 1] !== i - 1) root.append(svg("line", {x1: X(k - 0.5), x2: X(k - 0.5), y1: T, y2: H - B, stroke: "#9aa3b5", "stroke-dasharray": "2 3"}));
      if (Math.abs(t.logprobs[i] - t.trainer_logprobs[i]) > state.gapThreshold) {
        root.append(svg("line", {x1: X(k), x2: X(k), y1: T, y2: H - B, stroke: "#d62d2d", "stroke-opacity": 0.6}));
      }
    });
    for (const [key, colour] of [["logprobs", "#2f6fdf"], ["trainer_logprobs", "#e8772e"]]) {
      const d = idx.map((i, k) => `${k && idx[k - 1] === i - 1 ? "L" : "M"}${X(k).toFixed(1)},${Y(t[key][i]).toFixed(1)}`).join("");
      root.append(svg("path", {d, fill: "none", stroke: colour, "stroke-width": 1.5}));
    }
    let lit = null;
    root.addEventListener("mousemove", event => {
      const rect = root.getBoundingClientRect();
      const k = Math.max(0, Math.min(idx.length - 1, Math.round((event.clientX - rect.left - L) / (W - L - R) * (idx.length - 1))));
      const span = tokensBox.querySelector(`.tok[data-i="${idx[k]}"]`);
      if (lit && lit !== span) lit.classList.remove("lit");
      if (span) { span.classList.add("lit"); lit = span; }
      showTip(event, tokenTip(t, idx[k], "sampled"));
    });
    root.addEventListener("mouseleave", () => { if (lit) lit.classList.remove("lit"); hideTip(); });
    box.replaceChildren(root);
  };
  return card;
}

function factsTable(pairs) {
  return el("table", {}, pairs.filter(p => p[1] !== undefined && p[1] !== null && p[1] !== "").map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v))));
}

function recordCard(record) {
  // the episode's environment inputs and outputs (agentrl/rollout/record.py), one event a line
  if (!record) return el("div", {class: "card", id: "env-record"}, el("h3", {}, "Environment record"),
    el("div", {class: "muted"}, "not on this trajectory (an episode's record is on its first trajectory)"));
  const head = e => e.kind === "step" ? `step · reward ${fmt(e.reward, 4)}${e.terminated ? " · terminated" : ""}${e.truncated ? " · truncated" : ""}`
    : e.kind === "generate" ? `generate · ${e.tokens} tokens · seed ${e.seed ?? "none"}` : e.kind;
  return el("div", {class: "card", id: "env-record"}, el("h3", {}, "Environment record"),
    el("div", {class: "muted"}, `${record.bytes} bytes of at most ${record.max_bytes}`,
      record.truncated ? el("span", {class: "badge bad"}, ` ${record.cut_events} events cut, ${record.dropped_events || 0} dropped`) : null),
    (record.events || []).map(e => el("details", {class: "record-event"}, el("summary", {}, head(e), e.cut ? " (cut)" : ""),
      el("pre", {class: "mono", style: "white-space:pre-wrap;max-height:240px;overflow:auto"}, JSON.stringify(e, null, 1)))));
}

function renderTrajectory(main, t, {title, back, siblings, evaluation}) {
  if (!t) return main.append(el("div", {class: "card empty"}, "No such trajectory in this step's sample."));
  const roles = roleOf(t);
  const count = role => roles.filter(x => x === role).length;
  const versions = [...new Set(t.versions.filter(v => v >= 0))].sort((a, b) => a - b);
  const interruptions = t.versions.filter((v, i) => i > 0 && t.loss_mask[i] && t.loss_mask[i - 1] && v !== t.versions[i - 1]).length;
  const modes = [["role", "role & loss mask"], ["version", "policy version"], ["logprob", "behaviour log p"]];
  if (t.trainer_logprobs) modes.push(["gap", "behaviour − trainer gap"]);
  if (t.entropy) modes.push(["entropy", "entropy"]);
  if (!modes.some(m => m[0] === state.colour)) state.colour = "role";
  const {box, keys, flagged} = tokenStream(t);
  const rerender = () => render();
  const controls = el("div", {class: "keys"},
    el("label", {}, "colour by ", el("select", {id: "colour-by", onchange: e => { state.colour = e.target.value; rerender(); }},
      modes.map(([v, label]) => el("option", {value: v, selected: v === state.colour}, label)))),
    t.trainer_logprobs ? el("label", {}, " flag |behaviour − trainer| > ",
      el("input", {type: "number", id: "gap-threshold", step: "0.05", min: "0", value: state.gapThreshold, style: "width:70px",
        onchange: e => { state.gapThreshold = Math.max(0, Number(e.target.value) || 0); rerender(); }}),
      el("span", {class: flagged ? "badge bad" : "badge", id: "gap-count"}, `${flagged} flagged`)) : el("span", {class: "muted"}, "no trainer log-probabilities recorded"),
    el("span", {class: "muted"}, "hover a token for its id, text and numbers"));
  const legend = el("div", {class: "keys", id: "legend"}, keys.map(([label, c, value]) => el("span", {class: "key", "data-value": value ?? ""},
      el("span", {class: "sw", style: `background:${c}`}), label)),
    el("span", {}, el("span", {class: "vcut", "data-label": ""}), " version change inside a turn (interrupted by a weight update, resumed)"),
    t.trainer_logprobs ? el("span", {}, el("span", {class: "sw gap-sw"}), `|behaviour − trainer| > ${state.gapThreshold}`) : null);
  const rewardParts = Object.entries(t.metrics || {}).filter(([k]) => k.startsWith("reward/"));
  const otherMetrics = Object.entries(t.metrics || {}).filter(([k]) => !k.startsWith("reward/"));
  const side = el("div", {class: "side"},
    el("div", {class: "card"}, el("h3", {}, "Outcome"), factsTable([
      ["reward", fmt(t.reward, 4)], ["advantage", t.advantage !== undefined ? fmt(t.advantage, 4) : evaluation ? null : "not recorded"],
      ["status", statusBadge(t.status)], ["error", t.error], ["turns", t.num_turns],
      ["staleness (versions)", evaluation ? null : t.staleness ?? "–"], ["versions", versions.join(", ") || "–"],
      ["interruptions (weight updates)", interruptions]])),
    el("div", {class: "card"}, el("h3", {}, "Reward breakdown (env)"), rewardParts.length ?
      factsTable(rewardParts.map(([k, v]) => [k.slice(7), fmt(v, 4)])) : el("div", {class: "muted"}, "the env reported no reward terms"),
      otherMetrics.length ? [el("h3", {style: "margin-top:10px"}, "Other metrics"), factsTable(otherMetrics.map(([k, v]) => [k, fmt(v, 4)]))] : null),
    el("div", {class: "card"}, el("h3", {}, t.truncated ? "Tokens (in this export)" : "Tokens"), factsTable([
      ["prompt", count("prompt")], ["sampled (loss mask 1)", count("sampled")], ["env / tool output", count("env")],
      ["all", t.truncated ? `${t.truncated.total} (${t.input_ids.length} in this export)` : t.input_ids.length]])),
    el("div", {class: "card"}, el("h3", {}, "Ids"), factsTable([["group", el("span", {class: "mono"}, t.group_id)],
      ["episode", el("span", {class: "mono"}, t.episode_id)],
      ["segment", t.segments > 1 ? `${t.segment} of ${t.segments}` : "whole episode"]]),
      siblings && siblings.length > 1 ? el("div", {class: "keys"}, "segments: ", siblings.map(s =>
        s.index === t.index ? el("b", {}, s.segment) : el("a", {href: s.href}, s.segment))) : null),
    recordCard(t.record));
  main.append(el("div", {class: "traj-head"}, el("a", {href: back}, "← back"), el("h2", {style: "margin:0"}, title),
    el("span", {class: "muted"}, t.env || "")));
  if (t.truncated) {
    main.append(el("div", {class: "cut-note"}, `This export keeps ${t.input_ids.length} of the trajectory's ${t.truncated.total} tokens ` +
      `(the first ${t.truncated.head} and the last ${t.input_ids.length - t.truncated.head}).`));
  }
  main.append(el("div", {class: "traj-grid"}, el("div", {}, el("div", {class: "card"}, controls, legend, box), lpStrip(t, box)), side));
}

async function renderOneTrajectory(main, r, step, index) {
  const rows = await loadStep(r, step);
  const t = rows.find(x => x.index === index);
  const siblings = t ? rows.filter(x => x.episode_id === t.episode_id).map(x => ({index: x.index, segment: x.segment, href: `#t/${r}/${step}/${x.index}`})) : [];
  renderTrajectory(main, t, {title: `Step ${step} · trajectory ${index}`, back: `#steps/${r}/${step}`, siblings});
}

// ------------------------------------------------------------------ evaluation (agentrl eval)

function passAtK(n, c, k) {  // unbiased estimator (Chen et al. 2021)
  if (n - c < k) return 1;
  let p = 1;
  for (let i = 0; i < k; i++) p *= (n - c - i) / (n - i);
  return 1 - p;
}

function rowText(row) {
  if (!row) return "";
  for (const key of ["question", "prompt", "problem", "task", "input"]) if (typeof row[key] === "string") return row[key];
  return JSON.stringify(row);
}

function sampleSolved(s) {
  if (s.status !== "ok") return false;
  return s.metrics && s.metrics.success !== undefined ? Boolean(s.metrics.success) : s.reward > 0;
}

async function renderEval(main, r) {
  const run = state.runs[r];
  if (!state.evals.has(r)) state.evals.set(r, await source.evaluation(r));
  const rows = state.evals.get(r);
  if (!rows.length) {
    main.append(el("div", {class: "card empty"}, "This run has no evaluation (eval/eval.jsonl, written by `agentrl eval`)."));
    return;
  }
  const k = Math.max(...rows.map(x => x.k || 1));
  const same = rows.filter(x => (x.k || 1) === k);
  const ks = [...new Set([1, 2, 4, 8, 16, 32, k])].filter(x => x <= k);
  const f = state.evalFilter;
  main.append(el("h2", {}, "Evaluation", el("span", {class: "muted"}, ` · ${run.name} · ${same.length} problems · k = ${k}`)));
  main.append(el("div", {class: "facts"}, ks.map(kk => el("div", {class: "fact"}, el("div", {class: "k"}, `pass@${kk}`),
    el("div", {class: "v"}, fmt(mean(same.map(x => passAtK(k, x.successes, kk))), 3)))),
    el("div", {class: "fact"}, el("div", {class: "k"}, "failed episodes"), el("div", {class: "v"}, same.reduce((a, x) => a + (x.failed || 0), 0)))));
  const list = el("div", {class: "card", style: "padding:0"}), count = el("span", {class: "muted"});
  main.append(el("div", {class: "toolbar card"}, runPicker(r, i => `#eval/${i}`),
    el("label", {}, "solved", el("select", {onchange: e => { f.solved = e.target.value; draw(); }},
      [["", "any"], ["all", `in all ${k}`], ["some", "in some"], ["none", "in none"]].map(([v, label]) => el("option", {value: v, selected: f.solved === v}, label)))),
    el("label", {}, "search", el("input", {type: "search", value: f.q, placeholder: "text in the problem or samples", oninput: e => { f.q = e.target.value; draw(); }})),
    count), list);
  function draw() {
    const q = f.q.toLowerCase();
    const kept = same.filter(x => (!f.solved || (f.solved === "all" ? x.successes === k : f.solved === "none" ? x.successes === 0 : x.successes > 0 && x.successes < k))
      && (!q || rowText(x.row).toLowerCase().includes(q) || (x.samples || []).some(s => fullText(s).toLowerCase().includes(q))));
    count.textContent = `${kept.length} of ${same.length} problems`;
    const errors = same.some(x => x.error);
    list.replaceChildren(el("table", {class: "rows"},
      el("tr", {}, ["problem", "row", "successes", "pass@1", "failed", errors ? "error" : null, "samples"].map(h => h && el("th", {}, h))),
      kept.slice(0, 1000).map(x => el("tr", {"data-problem": x.index},
        el("td", {class: "num"}, x.index), el("td", {class: "preview"}, highlighted(rowText(x.row), f.q, 140)),
        el("td", {class: "num"}, `${x.successes} / ${x.k}`, signedBar(x.successes / x.k, 1)),
        el("td", {class: "num"}, fmt(x.successes / x.k, 3)), el("td", {class: "num"}, x.failed || 0),
        errors ? el("td", {class: "preview error", title: x.error || ""}, x.error ? highlighted(x.error, "", 160) : "") : null,
        el("td", {}, (x.samples || []).length ? (x.samples || []).map(s => [el("a", {href: `#e/${r}/${x.index}/${s.index}`,
          class: "badge" + (sampleSolved(s) ? "" : " bad"), title: `reward ${fmt(s.reward, 3)}`},
          `sample ${s.sample ?? s.index}${s.segments > 1 ? "." + s.segment : ""} ${sampleSolved(s) ? "✓" : "✗"}`), " "])
          : el("span", {class: "muted"}, "not recorded"))))));
    if (kept.length > 1000) list.append(el("div", {class: "empty"}, `the first 1000 of ${kept.length} are listed; narrow the search`));
  }
  draw();
}

async function renderEvalSample(main, r, problem, j) {
  if (!state.evals.has(r)) state.evals.set(r, await source.evaluation(r));
  const p = state.evals.get(r).find(x => x.index === problem);
  const samples = p ? p.samples || [] : [];
  const t = samples.find(s => s.index === j);
  const siblings = t ? samples.filter(s => s.episode_id === t.episode_id).map(s => ({index: s.index, segment: s.segment, href: `#e/${r}/${problem}/${s.index}`})) : [];
  renderTrajectory(main, t, {title: `Evaluation · problem ${problem} · sample ${t ? t.sample ?? j : j}`, back: `#eval/${r}`, siblings, evaluation: true});
}

// ------------------------------------------------------------------ the run (config, summary)

function flatten(obj, prefix = "") {  // {a: {b: 1}} -> [["a.b", "1"]]
  return Object.entries(obj).flatMap(([k, v]) => v !== null && typeof v === "object" && !Array.isArray(v) ?
    flatten(v, `${prefix}${k}.`) : [[prefix + k, Array.isArray(v) ? v.join("; ") : fmt(v)]]);
}

function renderRun(main) {
  for (const run of state.runs) {
    main.append(el("h2", {}, run.name, el("span", {class: "muted mono", style: "font-size:12px;margin-left:10px"}, run.path)));
    main.append(el("div", {class: "traj-grid", style: "margin-bottom:18px"},
      el("div", {class: "card"}, el("h3", {}, "config.yaml"), el("pre", {class: "config"}, run.config_text || "(none)")),
      el("div", {class: "card side"}, el("h3", {}, "summary.json"), factsTable(flatten(run.summary || {})))));
  }
}

// ------------------------------------------------------------------ routing, header, polling

function defaultView() {  // a folder that holds only an evaluation opens on it, not on empty curves
  const run = state.runs[0];
  return run && run.has_eval && !run.has_training ? "eval" : "curves";
}

function route() {
  const parts = (location.hash || `#${defaultView()}`).slice(1).split("/");
  const num = i => (parts[i] === undefined || parts[i] === "" ? null : Number(parts[i]));
  return {view: parts[0] || "curves", a: num(1), b: num(2), c: num(3)};
}

let rendering = Promise.resolve();
function render() { rendering = rendering.then(renderNow).catch(showError); return rendering; }

async function renderNow() {
  const {view, a, b, c} = route();
  const tab = {t: "steps", e: "eval"}[view] || view;
  for (const link of document.querySelectorAll("nav#tabs a")) {
    link.classList.toggle("on", link.dataset.tab === tab);
    if (link.dataset.tab === "eval") link.classList.toggle("off", !state.runs.some(run => run.has_eval));
  }
  const main = el("main", {id: "view"});
  if (view === "steps") await renderSteps(main, a ?? 0, b);
  else if (view === "t") await renderOneTrajectory(main, a ?? 0, b, c);
  else if (view === "eval") await renderEval(main, a ?? 0);
  else if (view === "e") await renderEvalSample(main, a ?? 0, b, c);
  else if (view === "run") renderRun(main);
  else renderCurves(main);
  const old = document.getElementById("view");
  old.replaceWith(main);
  for (const node of main.querySelectorAll(".chart, .lpstrip")) if (node.draw) node.draw();
  hideTip();
  document.body.dataset.ready = view;
}

function showError(err) {
  document.getElementById("view").replaceChildren(el("div", {class: "card empty"}, `Could not load: ${err.message || err}`));
  console.error(err);
}

function renderHeader() {
  const legend = document.getElementById("runs-legend");
  legend.replaceChildren(...state.runs.map((run, r) => el("span", {class: "run"},
    state.runs.length > 1 ? svg("svg", {width: 26, height: 8}, svg("line", {x1: 0, x2: 26, y1: 4, y2: 4, "stroke-width": 2, "stroke-dasharray": DASHES[r % DASHES.length] || null})) : null,
    run.name)));
  const status = document.getElementById("status");
  const evalOnly = state.runs.every(run => run.has_eval && !run.has_training);
  // a training run is finished when its summary has its minutes; an evaluation when its report is written
  const done = state.runs.every(run => (run.summary && run.summary.minutes !== undefined) ||
    (!run.has_training && Object.keys(run.eval_summary || {}).length > 0));
  const training = state.metrics.some(rows => rows.length) || state.runs.some(run => run.steps.length);
  if (!source.live) status.replaceChildren(`offline copy · exported ${EMBEDDED.exported || ""}`);
  else status.replaceChildren(el("span", {class: done ? "" : "live"},
    done ? "finished" : evalOnly ? "● evaluating" : training ? "● live" : "watching"),
    state.updated ? ` · updated ${state.updated.toLocaleTimeString()}` : "");
  const notes = document.getElementById("notes");
  notes.replaceChildren(...((EMBEDDED && EMBEDDED.notes) || []).map(n => el("div", {}, n)), ...failureNotes());
}

function failureNotes() {  // failed episodes, said where one looks first: how many, of which kinds, the first error
  const out = [];
  state.runs.forEach((run, r) => {
    const name = state.runs.length > 1 ? `${run.name}: ` : "";
    let failed = 0, total = 0, step = null;
    const kinds = {};
    for (const row of state.metrics[r] || []) {
      if (row["rollout/trajectories"] === undefined) continue;
      failed += row["rollout/failed"] || 0;
      total += row["rollout/trajectories"];
      for (const [k, v] of Object.entries(row)) if (k.startsWith("rollout/failed_")) kinds[k.slice(15)] = (kinds[k.slice(15)] || 0) + v;
      if (row["rollout/failed"] && (run.steps || []).includes(row.step)) step = row.step;
    }
    const first = run.summary && run.summary.first_error;
    if (failed) out.push(el("div", {class: "failures"},
      `${name}${failed} of ${total} episodes failed (${Object.entries(kinds).map(([k, v]) => `${k} ${v}`).join(", ")}).`,
      first ? [" First error: ", el("span", {class: "mono"}, first)] : null,
      step !== null ? [" ", el("a", {href: `#steps/${r}/${step}`, onclick: () => { state.follow = false; }}, `See them at step ${step}.`)] : null));
    const report = run.eval_summary || {};
    if (report.failed_episodes) out.push(el("div", {class: "failures"},
      `${name}evaluation: ${report.failed_episodes} of ${report.problems * report.k} episodes failed.`,
      report.first_error ? [" First error: ", el("span", {class: "mono"}, report.first_error)] : null,
      " ", el("a", {href: `#eval/${r}`}, "See them.")));
  });
  return out;
}

const POLL_MS = 2000;

async function poll() {
  let changed = false, newSteps = false, evalChanged = false;
  const runs = await source.runs();
  for (let r = 0; r < runs.length; r++) {
    const have = state.metrics[r] || [];
    const got = await source.metrics(r, have.length);
    // got.rows are the run's rows from `have.length` on (from 0 after a reset): put them there, never append
    // blindly, so an answer that arrives twice cannot draw a step twice
    if (got.rows.length || got.reset) changed = true;
    state.metrics[r] = got.reset ? got.rows : have.slice(0, got.total - got.rows.length).concat(got.rows);
    const before = state.runs[r];
    if (!before || before.steps.length !== runs[r].steps.length || JSON.stringify(before.summary) !== JSON.stringify(runs[r].summary)) {
      changed = true;
      newSteps = newSteps || !before || before.steps.length !== runs[r].steps.length;
    }
    if (before && (before.has_eval !== runs[r].has_eval ||
                   JSON.stringify(before.eval_summary) !== JSON.stringify(runs[r].eval_summary))) {
      state.evals.delete(r);  // an evaluation that finished (or started): read its rows again
      changed = evalChanged = true;
    }
  }
  state.runs = runs;
  if (changed) state.updated = new Date();
  return {changed, newSteps, evalChanged};
}

async function main() {
  document.querySelectorAll("nav#tabs a").forEach(link => {
    link.addEventListener("click", () => { if (link.dataset.tab === "steps") state.follow = true; });
  });
  window.addEventListener("hashchange", render);
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(() => {
    for (const node of document.querySelectorAll(".chart, .lpstrip")) if (node.draw) node.draw();
  }, 150); });
  try { await poll(); } catch (err) { showError(err); return; }
  renderHeader();
  await render();
  if (!source.live) return;
  for (;;) {  // one poll at a time: the next is asked POLL_MS after the last answer, however slow the link
    await new Promise(resolve => setTimeout(resolve, POLL_MS));
    try {
      const {changed, newSteps, evalChanged} = await poll();
      renderHeader();
      const {view, b} = route();
      const followed = view === "steps" && state.follow && (b === null || newSteps);
      if ((changed && view === "curves") || (evalChanged && view === "eval") || (newSteps && followed)) {
        if (followed && view === "steps") {
          const steps = state.runs[route().a ?? 0].steps;
          if (b !== null && steps.length) { location.hash = `#steps/${route().a ?? 0}/${steps[steps.length - 1]}`; continue; }
        }
        render();
      }
    } catch (err) {
      document.getElementById("status").textContent = `lost the server (${err.message}); retrying`;
    }
  }
}

main();
