// hetrl's run viewer: every page fetches /api/... (JSON from hetrl.view.run_data) and draws it.
// No framework and nothing from the internet: uPlot (vendored beside this file) draws the charts.
"use strict";

const REFRESH_MS = 3000; // how often a page looks for new steps of a live run
const FETCH_TIMEOUT_MS = 120000; // a request that takes longer is abandoned (and retried at the next refresh)
const GAP_FULL = 0.2; // |log pi_trainer - log pi_engine| drawn at full red: where PPO-style clipping (0.2) bites
const SURPRISAL_FULL = 4.0; // -log p (nats) drawn at full blue

function fill(node, ...children) {
  // replaceChildren that flattens arrays and leaves out null (optional parts of a page).
  node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined));
  return node;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const shownMissing = new Set();
function showMissing(lines) {
  for (const line of lines || []) shownMissing.add(line);
  const box = document.getElementById("missing");
  box.hidden = shownMissing.size === 0;
  box.textContent = [...shownMissing].join("\n");
}

async function api(path) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
  try {
    const resp = await fetch(path, { signal: ctl.signal });
    const body = await resp.json();
    showMissing(body.missing);
    return resp.ok ? body : null;
  } catch (err) {
    showMissing([`${path}: ${err}`]);
    return null;
  } finally {
    clearTimeout(timer);
  }
}

function fmt(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(4);
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function table(headers, rows) {
  return el("table", {}, el("tr", {}, headers.map((h) => el("th", {}, h))),
    rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c instanceof Node ? c : fmt(c))))));
}

function live(text) { document.getElementById("live").textContent = text; }

// ---------------------------------------------------------------- Overview

async function overview(main) {
  const d = await api("/api/overview");
  if (!d) return;
  fill(main, el("h2", {}, `Run ${d.run}`));
  if (d.hang_report) main.append(el("h2", {}, "Hang report"), el("pre", { id: "hang" }, d.hang_report));
  if (d.summary) {
    main.append(el("h2", {}, "Summary and eval results"),
      table(["key", "value"], Object.entries(d.summary).map(([k, v]) =>
        [k, typeof v === "object" && v !== null ? el("pre", {}, JSON.stringify(v, null, 1)) : v])));
  }
  main.append(el("h2", {}, `Alerts (${d.alerts.length})`),
    d.alerts.length ? table(["step", "guard", "action", "message"], d.alerts.map((a) => [a.step, a.guard, a.action, a.message]))
      : el("p", { class: "muted" }, "none"));
  if (d.health.length) {
    main.append(el("h2", {}, "Role health"), table(["rank", "role", "host", "state", "activity", "beat age s", "progress age s"],
      d.health.map((h) => [h.rank, h.role, h.host, h.state, h.activity, h.beat_age_s, h.progress_age_s])));
  }
  if (d.plan) {
    main.append(el("h2", {}, `Plan: ${d.plan.nodes} node(s), ${d.plan.gpus_per_node} GPU(s) per node`),
      table(["role", "ranks"], Object.entries(d.plan.roles)),
      table(["world rank", "role", "component", "node", "gpus"],
        d.plan.ranks.map((r) => [r.world_rank, r.role, r.component, r.node, r.gpus.join(",") || "-"])));
  }
  if (d.config) main.append(el("h2", {}, "Resolved recipe (config.yaml)"), el("pre", { id: "config" }, d.config));
}

// ---------------------------------------------------------------- Metrics

function yRange(u, min, max) {
  // uPlot's own range fails ("Invalid array length") on a series whose values differ by ~1e-13
  // (mismatch/k3_kl of a bit-exact run): keep a span of at least 1e-3 of the values' size.
  if (min === null || max === null) return [0, 1];
  const pad = Math.max((max - min) * 0.05, Math.abs(max) * 1e-3, 1e-9);
  return [min - pad, max + pad];
}

function smooth(values, weight) {
  // TensorBoard-style exponential moving average that skips gaps and is debiased at the start.
  if (weight <= 0) return values;
  let last = 0, n = 0;
  return values.map((v) => {
    if (v === null) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

async function metrics(main) {
  const state = { offset: 0, byStep: new Map(), families: {}, charts: new Map(), smoothing: 0, cursor: null };
  const count = el("span", { id: "num-steps" }, "0");
  const slider = el("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: "0", id: "smoothing" });
  const sval = el("span", {}, "0");
  const cursor = el("input", { type: "number", id: "step-cursor", min: "0" });
  const families = el("div", { id: "families" });
  fill(main, el("div", { class: "controls" },
    el("span", {}, "steps: ", count),
    el("label", {}, "smoothing", slider, sval),
    el("label", {}, "step cursor", cursor),
    el("span", { class: "muted" }, "drag on a chart to zoom, double-click to reset")), families);
  slider.addEventListener("input", () => { state.smoothing = Number(slider.value); sval.textContent = slider.value; redraw(); });
  cursor.addEventListener("change", () => { state.cursor = Number(cursor.value); placeCursor(); });

  function series(name) {
    const steps = [...state.byStep.keys()].sort((a, b) => a - b);
    const raw = steps.map((s) => (name in state.byStep.get(s) ? state.byStep.get(s)[name] : null));
    return [steps, raw, smooth(raw, state.smoothing)];
  }
  function placeCursor() {
    if (state.cursor === null) return;
    for (const u of state.charts.values()) {
      const i = u.data[0].indexOf(state.cursor);
      if (i >= 0) u.setCursor({ left: u.valToPos(u.data[0][i], "x"), top: 10 });
    }
  }
  function chart(name) {
    const opts = {
      title: name, width: 380, height: 190,
      cursor: { sync: { key: "steps" } },
      scales: { x: { time: false }, y: { range: yRange } },
      axes: [{ incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000] }, {}], // whole steps
      series: [{ label: "step" }, { label: "raw", stroke: "#9ab", width: 1 }, { label: "smoothed", stroke: "#c33", width: 1.5 }],
    };
    return new uPlot(opts, series(name), el("div", { class: "chart", "data-metric": name }));
  }
  function redraw() {
    for (const [name, u] of state.charts) u.setData(series(name));
    placeCursor();
  }
  async function poll() {
    const d = await api(`/api/metrics?offset=${state.offset}`);
    if (!d) return;
    state.offset = d.offset;
    for (const row of d.rows) {
      const { step, ...values } = row;
      state.byStep.set(step, Object.assign(state.byStep.get(step) || {}, values));
    }
    Object.assign(state.families, d.families);
    for (const [name, family] of Object.entries(state.families)) {
      if (state.charts.has(name)) continue;
      let section = document.getElementById(`family-${family}`);
      if (!section) {
        section = el("section", { id: `family-${family}` }, el("h2", {}, family), el("div", { class: "charts" }));
        families.append(section);
        [...families.children].sort((a, b) => familyRank(a.id) - familyRank(b.id)).forEach((c) => families.append(c));
      }
      const u = chart(name);
      state.charts.set(name, u);
      section.querySelector(".charts").append(u.root.parentNode || u.root);
    }
    if (d.rows.length) redraw();
    count.textContent = String(state.byStep.size);
    const last = Math.max(...state.byStep.keys());
    live(state.byStep.size ? `last step ${last} · refreshing every ${REFRESH_MS / 1000} s` : "waiting for steps");
  }
  await poll();
  setInterval(poll, REFRESH_MS);
}

const FAMILY_ORDER = ["reward", "lengths", "policy", "mismatch", "staleness", "throughput", "time", "routing", "eval", "other"];
function familyRank(id) { return FAMILY_ORDER.indexOf(id.replace("family-", "")); }

// ---------------------------------------------------------------- Rollouts

const FILTER_FIELDS = [
  ["task", "select"], ["flag", "select"], ["finish", "select"],
  ["min_len", "number"], ["max_len", "number"], ["min_reward", "number"], ["max_reward", "number"],
  ["worst", "number"], ["best", "number"],
];

const GROUPS_PER_PAGE = 20; // groups drawn at once (a step of a large run holds hundreds)

async function rollouts(main) {
  const state = { step: null, colour: "gap", sample: null, steps: {}, numGroups: GROUPS_PER_PAGE };
  const stepsBox = el("div", { class: "steps", id: "steps" });
  const filters = el("form", { class: "controls", id: "filters" });
  const inputs = {};
  for (const [name, kind] of FILTER_FIELDS) {
    inputs[name] = kind === "select" ? el("select", { name }, el("option", { value: "" }, "all"))
      : el("input", { type: "number", name, step: name.includes("reward") ? "any" : "1" });
    filters.append(el("label", {}, name.replace("_", " "), inputs[name]));
  }
  filters.append(el("button", { type: "submit" }, "apply"));
  filters.addEventListener("submit", (e) => { e.preventDefault(); state.numGroups = GROUPS_PER_PAGE; loadStep(); });
  const colour = el("select", { id: "colour" }, el("option", { value: "gap" }, "colour: engine/trainer log-prob gap"),
    el("option", { value: "entropy" }, "colour: entropy (surprisal -log p of the sampled token)"));
  colour.addEventListener("change", () => { state.colour = colour.value; if (state.sample) drawSample(state.sample); });
  const groupsBox = el("div", { id: "groups" });
  const sampleBox = el("div", { id: "sample" });
  fill(main, el("div", { class: "layout" }, stepsBox,
    el("div", { style: "flex: 1; min-width: 0" }, filters, el("div", { class: "controls" }, colour, el("span", { id: "counts", class: "muted" })),
      groupsBox, sampleBox)));

  function fillSelect(select, values, keepAny) {
    const current = select.value;
    fill(select, el("option", { value: "" }, "all"), keepAny ? el("option", { value: "any" }, "any flag") : null,
      values.map((v) => el("option", { value: v }, v)));
    select.value = current;
  }
  async function loadSteps() {
    const d = await api("/api/steps");
    if (!d) return;
    const steps = Object.keys(d.steps).map(Number);
    const grew = steps.length !== Object.keys(state.steps).length;
    state.steps = d.steps;
    if (grew) {
      fill(stepsBox, el("b", {}, "step (samples)"), steps.map((s) =>
        el("div", { "data-step": s, class: s === state.step ? "current" : "", onclick: () => { state.step = s; state.numGroups = GROUPS_PER_PAGE; loadStep(); } },
          `${s} (${d.steps[s]})`)));
    }
    live(steps.length ? `${steps.length} steps stored · refreshing every ${REFRESH_MS / 1000} s` : "no rollouts yet");
    if (state.step === null && steps.length) state.step = steps[steps.length - 1];
    if (state.step !== null && !state.shown) await loadStep(); // the first view, or one whose request failed
  }
  async function loadStep() {
    // One request at a time; a click during one is served right after it, with the latest choice.
    if (state.loading) { state.again = true; return; }
    state.loading = true;
    try {
      do { state.again = false; state.shown = await drawStep(); } while (state.again);
    } finally { state.loading = false; }
  }
  async function drawStep() {
    for (const div of stepsBox.querySelectorAll("div[data-step]")) div.className = Number(div.dataset.step) === state.step ? "current" : "";
    const q = new URLSearchParams();
    for (const [name] of FILTER_FIELDS) if (inputs[name].value !== "") q.set(name, inputs[name].value);
    q.set("groups", state.numGroups);
    const d = await api(`/api/step/${state.step}?${q}`);
    if (!d) return false;
    fillSelect(inputs.task, d.tasks); fillSelect(inputs.flag, d.flags, true); fillSelect(inputs.finish, d.finishes);
    document.getElementById("counts").textContent =
      `step ${d.step}: ${d.num_shown} of ${d.num_samples} samples in ${d.num_groups} groups, worst group first` +
      (d.estimator ? ` · advantage: ${d.estimator}` : "");
    fill(groupsBox, d.groups.map((g) => el("div", { class: "group", "data-group": g.group_id },
      el("div", {}, el("b", {}, g.group_id), ` · ${g.task} · mean reward ${fmt(g.mean_reward)}`),
      el("div", { class: "members" }, g.samples.map((s) => el("div", {
        class: "member", "data-sample": s.sample_id, onclick: () => openSample(s),
      }, el("div", {}, el("b", {}, s.sample_id)),
      el("div", {}, `reward ${fmt(s.reward)} · adv ${fmt(s.advantage)}`),
      el("div", {}, `${s.length} tok · ${s.finish}`),
      el("div", {}, s.flags.map((f) => el("span", { class: "flag" }, f))),
      el("div", { class: "text" }, s.preview)))))));
    if (d.groups.length < d.num_groups) {
      groupsBox.append(el("button", { id: "more-groups", onclick: () => { state.numGroups += GROUPS_PER_PAGE; loadStep(); } },
        `show ${Math.min(GROUPS_PER_PAGE, d.num_groups - d.groups.length)} more of ${d.num_groups - d.groups.length} groups`));
    }
    return true;
  }
  async function openSample(row) {
    for (const m of groupsBox.querySelectorAll(".member")) m.classList.toggle("current", m.dataset.sample === row.sample_id);
    const d = await api(`/api/sample/${state.step}/${encodeURIComponent(row.sample_id)}`);
    if (!d) return;
    d.advantage = row.advantage;
    state.sample = d;
    drawSample(d);
  }
  function tokenSpan(t) {
    let bg = "";
    if (state.colour === "gap" && t.gap !== null && t.mask) {
      bg = `rgba(220,30,30,${Math.min(1, Math.abs(t.gap) / GAP_FULL).toFixed(3)})`;
    } else if (state.colour === "entropy") {
      bg = `rgba(40,90,220,${Math.min(1, -t.engine_lp / SURPRISAL_FULL).toFixed(3)})`;
    }
    const title = `id ${t.id} · mask ${t.mask} · version ${t.version} · engine ${fmt(t.engine_lp)} · trainer ${fmt(t.trainer_lp)} · gap ${fmt(t.gap)}`;
    return el("span", { class: t.mask ? "tok" : "tok env", style: bg ? `background:${bg}` : null, title }, t.text);
  }
  function drawSample(d) {
    const turns = d.turns.map((turn, i) => el("div", { class: `turn ${turn.who}` },
      el("div", { class: "who" }, turn.who === "policy"
        ? `turn ${i + 1}: policy (trained, loss mask 1)` : `turn ${i + 1}: environment (tool result / observation, loss mask 0)`),
      el("div", { class: "tokens" }, d.tokens.slice(turn.start, turn.end).map(tokenSpan))));
    const images = [...Array(d.num_images).keys()].map((k) =>
      el("img", { src: `/api/image/${d.step}/${k}/${encodeURIComponent(d.sample_id)}`, alt: `image ${k}` }));
    fill(sampleBox, 
      el("h2", {}, `${d.sample_id} · step ${d.step} · group ${d.group_id} · task ${d.task}`),
      table(["reward", "advantage", "rewards by source", "flags", "finish", "turns", "tool calls", "weight versions"],
        [[d.reward, d.advantage, d.rewards, d.flags.join(", ") || "-", d.finish, d.num_turns, d.num_tool_calls,
          d.versions.join("..")]]),
      d.tokenized ? null : el("p", { class: "muted" }, "no tokenizer found for this run: tokens shown as ids"),
      images.length ? el("div", { class: "images" }, el("h3", {}, "images"), images) : null,
      el("h3", {}, "prompt"), el("pre", { class: "prompt" }, d.prompt),
      el("h3", {}, d.turns.length > 1 ? "episode, turn by turn" : "completion"),
      el("div", { id: "turns" }, turns),
      el("h3", {}, "answer and env info"), el("pre", {}, JSON.stringify({ answer: d.answer, info: d.info }, null, 1)));
  }
  await loadSteps();
  setInterval(loadSteps, REFRESH_MS);
}

// ---------------------------------------------------------------- Timeline

const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
  "#bab0ac", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#17becf"];

async function timelinePage(main) {
  const steps = el("input", { type: "number", id: "num-steps", min: "1", value: "3" });
  const chartBox = el("div", { id: "gantt" });
  const medians = el("div", { id: "medians" });
  fill(main, el("div", { class: "controls" }, el("label", {}, "last RL steps", steps),
    el("span", { class: "muted" }, "wheel: zoom · drag: pan · double-click: reset")), chartBox, medians);
  steps.addEventListener("change", load);

  async function load() {
    const d = await api(`/api/timeline?steps=${Math.max(1, Number(steps.value) || 3)}`);
    if (!d || !d.steps.length) { fill(chartBox, el("p", { class: "muted" }, "no timeline recorded")); return; }
    live(`${d.num_steps} RL steps recorded`);
    drawGantt(chartBox, d);
    fill(medians, el("h2", {}, "Where a step goes (median per RL step after the first)"),
      table(["ms", "phase"], Object.entries(d.phases).map(([k, v]) => [(v * 1000).toFixed(1), k])),
      table(["ms", "messages per step", "hop"], Object.entries(d.hop_latencies).map(([k, v]) => [(v[0] * 1000).toFixed(2), v[1].toFixed(1), k])));
  }
  await load();
}

function drawGantt(box, d) {
  const ns = "http://www.w3.org/2000/svg";
  const rows = [...new Set(d.spans.map((s) => s.who).concat(d.hops.map((h) => h.to)))]
    .sort((a, b) => (a !== "orchestrator_0") - (b !== "orchestrator_0") || a.localeCompare(b));
  const names = [...new Set(d.spans.map((s) => s.name))].sort();
  const colour = Object.fromEntries(names.map((n, i) => [n, PALETTE[i % PALETTE.length]]));
  const left = 130, rowH = 26, width = Math.max(600, box.clientWidth || 1000), height = 30 + rows.length * rowH;
  const full = [d.steps[0].t0, d.steps[d.steps.length - 1].t1];
  let view = full.slice();
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height); svg.setAttribute("class", "gantt");
  const x = (t) => left + ((t - view[0]) / (view[1] - view[0])) * (width - left - 10);
  const y = (who) => 20 + rows.indexOf(who) * rowH;
  function node(tag, attrs, text) {
    const n = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    return n;
  }
  function render() {
    svg.replaceChildren();
    for (const s of d.steps) {
      svg.append(node("rect", { x: x(s.t0), y: 0, width: Math.max(0, x(s.t1) - x(s.t0)), height, fill: s.step % 2 ? "#f4f6fa" : "#fff" }),
        node("text", { x: x(s.t0) + 3, y: 12, "font-size": 11, fill: "#667" }, `RL step ${s.step + 1}`));
    }
    rows.forEach((who) => svg.append(node("text", { x: 4, y: y(who) + 16, "font-size": 11 }, who)));
    for (const s of d.spans) {
      if (!rows.includes(s.who) || x(s.t1) < left || x(s.t0) > width) continue;
      const r = node("rect", { x: Math.max(left, x(s.t0)), y: y(s.who) + 4, width: Math.max(1, x(s.t1) - Math.max(left, x(s.t0))),
        height: rowH - 8, fill: colour[s.name], class: "span" });
      r.append(node("title", {}, `${s.who}: ${s.name} ${((s.t1 - s.t0) * 1000).toFixed(1)} ms`));
      svg.append(r);
    }
    for (const h of d.hops) {
      if (!h.from || !rows.includes(h.from) || x(h.t1) < left || x(h.t0) > width) continue;
      const line = node("line", { x1: x(h.t0), y1: y(h.from) + rowH / 2, x2: x(h.t1), y2: y(h.to) + rowH / 2,
        stroke: "#000", "stroke-opacity": 0.35, "stroke-width": 0.8 });
      line.append(node("title", {}, `${h.name}: ${h.from} -> ${h.to} ${((h.t1 - h.t0) * 1000).toFixed(2)} ms`));
      svg.append(line);
    }
    svg.append(node("text", { x: left, y: height - 2, "font-size": 10, fill: "#667" },
      `${view[0].toFixed(3)} s .. ${view[1].toFixed(3)} s since the start of RL step ${d.steps[0].step + 1}`));
  }
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const t = view[0] + ((e.offsetX - left) / (width - left - 10)) * (view[1] - view[0]);
    const k = e.deltaY < 0 ? 0.8 : 1.25;
    view = [t - (t - view[0]) * k, t + (view[1] - t) * k];
    render();
  });
  let drag = null;
  svg.addEventListener("mousedown", (e) => { drag = { x: e.clientX, view: view.slice() }; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const dt = ((e.clientX - drag.x) / (width - left - 10)) * (drag.view[1] - drag.view[0]);
    view = [drag.view[0] - dt, drag.view[1] - dt];
    render();
  });
  svg.addEventListener("dblclick", () => { view = full.slice(); render(); });
  render();
  fill(box, svg, el("div", { class: "legend" },
    names.map((n) => el("span", {}, el("i", { style: `background:${colour[n]}` }), n))));
}

// ---------------------------------------------------------------- start

const PAGES = { overview, metrics, rollouts, timeline: timelinePage };
const page = document.body.dataset.page;
for (const a of document.querySelectorAll("nav a")) a.classList.toggle("current", a.dataset.page === page);
PAGES[page](document.getElementById("main"));
