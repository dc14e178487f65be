/* agentrl-jax viewer: runs, learning curves, episode browser, turn and token views,
   before/after. Plain JavaScript, no dependencies; builds its HTML with html`` / setHtml() of
   dom.js (loaded first), talks to the JSON API of server.py or reads an export's data. */
"use strict";
const COLORS = ["#2f5fd0", "#d0542f", "#2e9e5b", "#9c3fc0", "#c49a00", "#1b9aaa", "#d0307a", "#6b6b6b"];
const POLL_MS = 2000;
let renderSeq = 0;
let lastListHash = "#episodes";
let lastStatusSig = null;

function parseHash() {
  const h = location.hash.replace(/^#/, "");
  const i = h.indexOf("?");
  const view = (i < 0 ? h : h.slice(0, i)) || (EXPORT ? "episodes" : "runs");
  return {view, params: new URLSearchParams(i < 0 ? "" : h.slice(i + 1))};
}
function hashFor(view, params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== "") qs.set(k, v);
  const s = qs.toString();
  return "#" + view + (s ? "?" + s : "");
}
function go(view, params) { location.hash = hashFor(view, params); }

// ------------------------------------------------------------------ charts (inline SVG)
function niceTicks(lo, hi, n) {
  if (!(hi > lo)) { const d = Math.abs(lo) || 1; lo -= d * 0.5; hi += d * 0.5; }
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return {ticks: out, lo: Math.min(lo, out[0]), hi: Math.max(hi, out[out.length - 1])};
}

function lineChart(title, ylabel, series) {
  const W = 360, H = 210, L = 50, R = 10, T = 24, B = 32;
  const pts = series.flatMap(s => s.xs.map((x, i) => [x, s.ys[i]])).filter(p => typeof p[0] === "number" && typeof p[1] === "number");
  const body = [html`<text x="${W / 2}" y="15" text-anchor="middle" font-size="13" font-weight="600">${title}</text>`];
  if (!pts.length) {
    body.push(html`<text x="${W / 2}" y="${H / 2}" text-anchor="middle" font-size="12" fill="#667085">not logged</text>`);
    return html`<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${title}">${body}</svg>`;
  }
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const xt = niceTicks(Math.min(...xs), Math.max(...xs), 5), yt = niceTicks(Math.min(...ys), Math.max(...ys), 4);
  const sx = x => L + (x - xt.lo) / (xt.hi - xt.lo || 1) * (W - L - R);
  const sy = y => H - B - (y - yt.lo) / (yt.hi - yt.lo || 1) * (H - T - B);
  for (const t of yt.ticks) body.push(html`<line x1="${L}" x2="${W - R}" y1="${sy(t)}" y2="${sy(t)}" stroke="#e6e9ee"/>`,
    html`<text x="${L - 4}" y="${sy(t) + 4}" text-anchor="end" font-size="10" fill="#667085">${fmt(t, 3)}</text>`);
  for (const t of xt.ticks) body.push(html`<text x="${sx(t)}" y="${H - B + 13}" text-anchor="middle" font-size="10" fill="#667085">${fmt(t, 0)}</text>`);
  body.push(html`<line x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}" stroke="#98a2b3"/>
    <line x1="${L}" x2="${L}" y1="${T}" y2="${H - B}" stroke="#98a2b3"/>
    <text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle" font-size="10" fill="#667085">step</text>
    <text x="11" y="${(T + H - B) / 2}" text-anchor="middle" font-size="10" fill="#667085" transform="rotate(-90 11 ${(T + H - B) / 2})">${ylabel}</text>`);
  for (const s of series) {
    const idx = s.xs.map((_, i) => i).filter(i => typeof s.xs[i] === "number" && typeof s.ys[i] === "number");
    if (!idx.length) continue;
    const p = idx.map(i => `${sx(s.xs[i]).toFixed(1)},${sy(s.ys[i]).toFixed(1)}`).join(" ");
    body.push(html`<polyline fill="none" stroke="${s.color}" stroke-width="1.8" points="${p}"/>`);
    if (idx.length <= 40) body.push(idx.map(i => html`<circle cx="${sx(s.xs[i]).toFixed(1)}" cy="${sy(s.ys[i]).toFixed(1)}" r="2.6" fill="${s.color}"><title>${s.name} step ${s.xs[i]}: ${fmt(s.ys[i], 4)}</title></circle>`));
  }
  return html`<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${title}">${body}</svg>`;
}

// ------------------------------------------------------------------ runs view
const SUMMARY_KEYS = ["model.name", "env.names", "learner.advantage_estimator", "learner.learning_rate", "learner.kl_coef",
  "train.total_steps", "train.tasks_per_step", "train.samples_per_task", "horizon.type", "horizon.phases",
  "train.eval_tasks", "train.eval_samples", "rollout.max_new_tokens", "agent.prompt_style"];
const num = x => typeof x === "number";

async function viewRuns(el) {
  const runs = (await api("/api/runs")).runs;
  const metrics = await Promise.all(runs.map(r => api("/api/metrics", {run: r.id})));
  const show = v => v === undefined ? html`<span class=muted>–</span>` : (typeof v === "object" ? JSON.stringify(v) : v);
  const colour = i => COLORS[i % COLORS.length];
  const h = [html`<h2>Runs</h2><table class="runs-table"><tr><th></th>${runs.map((r, i) => html`<th><span style="color:${colour(i)}">&#9632;</span> ${r.name}</th>`)}</tr>`];
  h.push(html`<tr><th>directory</th>${runs.map(r => html`<td class="muted">${r.path}</td>`)}</tr>`);
  for (const k of SUMMARY_KEYS) h.push(html`<tr><th>${k}</th>${runs.map(r => html`<td>${show(r.config_flat[k])}</td>`)}</tr>`);
  const sum = [["steps done", s => s.final_step], ["finished", s => s.finished_step != null ? "yes" : "no"],
    ["s / step", s => num(s.mean_step_seconds) ? s.mean_step_seconds.toFixed(1) : s.mean_step_seconds],
    ["reward first → last step", s => s.first_reward != null ? `${fmt(s.first_reward)} → ${fmt(s.last_reward)}` : undefined]];
  for (const [label, f] of sum) h.push(html`<tr><th>${label}</th>${runs.map(r => html`<td>${show(f(r.summary))}</td>`)}</tr>`);
  h.push(html`<tr><th>episodes</th>${runs.map(r => html`<td>${r.files.length ? r.files.map((f, j) => html`${j ? html`<br>` : ""}${f.name}: ${f.episodes}`) : html`<span class=muted>none yet</span>`}</td>`)}</tr></table>`);

  h.push(html`<h2 id="curves">Learning curves</h2><div class="legend">${runs.map((r, i) => html`<span><i style="background:${colour(i)}"></i>${r.name}</span>`)}</div>`);
  const panels = metrics[0] ? metrics[0].curves.map(c => [c.title, c.ylabel]) : [];
  const extra = localStorage.getItem("viewer.extraMetric") || "";
  const charts = [];
  panels.forEach(([title, ylabel], p) => {
    const series = metrics.map((m, i) => ({name: runs[i].name, color: colour(i), xs: m.curves[p].steps, ys: m.curves[p].values}));
    const keys = [...new Set(metrics.map(m => m.curves[p].key).filter(Boolean))];
    charts.push(html`<div class="chart" data-metric="${title}">${lineChart(title, ylabel, series)}<div class="muted" style="font-size:11px;text-align:center">${keys.join(", ") || "–"}</div></div>`);
  });
  if (extra) {
    const series = metrics.map((m, i) => {
      const rows = m.rows.filter(r => num(r[extra]) && num(r.step));
      return {name: runs[i].name, color: colour(i), xs: rows.map(r => r.step), ys: rows.map(r => r[extra])};
    });
    charts.push(html`<div class="chart">${lineChart(extra, "", series)}</div>`);
  }
  const allKeys = [...new Set(metrics.flatMap(m => m.keys))].sort();
  h.push(html`<div class="charts" id="charts">${charts}</div><p><label>another metric: <select id="extra-metric"><option value="">(none)</option>${allKeys.map(k => html`<option ${k === extra ? "selected" : ""}>${k}</option>`)}</select></label></p>`);

  h.push(html`<h2>Evaluations</h2>`);
  const cols = runs.map(r => {
    const envs = [...new Set(r.evals.flatMap(e => Object.keys(e.per_env || {})))];
    if (!r.evals.length) return html`<div class="col"><h3>${r.name}</h3><p class="muted">no evaluation yet</p></div>`;
    const rows = r.evals.map(e => html`<tr><td class=num>${e.step}</td><td>${e.source}</td><td class=num>${fmt(e.k)}</td><td class=num>${fmt(e.avg)}${e.old_metric ? " (old metric)" : ""}</td><td class=num>${fmt(e.pass)}</td><td class=num>${fmt(e.success_rate)}</td><td class=num>${fmt(e.mean_reward)}</td><td class=num>${fmt(e.num_tasks)}</td><td class=num>${fmt(e.dropped)}</td><td class=num>${fmt(e.seconds, 1)}</td>${envs.map(env => html`<td class=num>${fmt(((e.per_env || {})[env] || {}).avg)}</td>`)}</tr>`);
    return html`<div class="col"><h3>${r.name}</h3><table class="evals"><tr><th>step</th><th>source</th><th class=num>k</th><th class=num title="mean task score">Avg@k</th><th class=num title="share of tasks with an episode scoring above 0">Pass@k</th><th class=num title="the environment's completion flag">success rate</th><th class=num>mean reward</th><th class=num>tasks</th><th class=num>dropped</th><th class=num>seconds</th>${envs.map(e => html`<th class=num>${e} Avg@k</th>`)}</tr>${rows}</table></div>`;
  });
  h.push(html`<div class="row">${cols}</div>`);

  const flatKeys = [...new Set(runs.flatMap(r => Object.keys(r.config_flat)))].sort();
  const differs = k => new Set(runs.map(r => JSON.stringify(r.config_flat[k]))).size > 1;
  const onlyDiff = runs.length > 1 && localStorage.getItem("viewer.allKeys") !== "1";
  h.push(html`<h2>Configuration</h2>`);
  if (runs.length > 1) h.push(html`<label><input type="checkbox" id="only-diff" ${onlyDiff ? "checked" : ""}> only keys that differ (${flatKeys.filter(differs).length} of ${flatKeys.length})</label>`);
  const cfgRows = flatKeys.filter(k => !onlyDiff || differs(k)).map(k =>
    html`<tr class="${differs(k) && runs.length > 1 ? "diff" : ""}"><td>${k}</td>${runs.map(r => html`<td>${show(r.config_flat[k])}</td>`)}</tr>`);
  h.push(html`<table class="config"><tr><th>key</th>${runs.map(r => html`<th>${r.name}</th>`)}</tr>${cfgRows}</table>`);
  setHtml(el, html`${h}`);
  const sel = $("#extra-metric", el);
  if (sel) sel.onchange = () => { localStorage.setItem("viewer.extraMetric", sel.value); render(); };
  const od = $("#only-diff", el);
  if (od) od.onchange = () => { localStorage.setItem("viewer.allKeys", od.checked ? "0" : "1"); render(); };
}

// ------------------------------------------------------------------ episode browser
const FILTERS = ["kind", "env", "task", "status", "step_min", "step_max", "reward_min", "reward_max",
  "turns_min", "turns_max", "success", "invalid", "q", "sort", "order", "limit"];
function formKey(params) {
  const p = new URLSearchParams(params);
  p.delete("offset");
  if (!p.get("run")) p.set("run", "0");
  if (p.get("limit") === "50") p.delete("limit");
  return [...p.entries()].filter(([, v]) => v !== "").sort().map(([k, v]) => k + "=" + v).join("&");
}
const SORTS = [["order", "file order"], ["step", "step"], ["reward", "reward"], ["num_turns", "turns"],
  ["invalid", "invalid actions"], ["n_tokens", "tokens"], ["task", "task"], ["env", "environment"], ["status", "status"]];

function runSelect(runs, current, id) {
  if (runs.length < 2) return "";
  return html`<label>run<select id="${id}">${runs.map(r => html`<option value="${r.id}" ${r.id === current ? "selected" : ""}>${r.name}</option>`)}</select></label>`;
}

async function viewEpisodes(el, params) {
  if (EXPORT) return viewExportList(el);
  const run = +(params.get("run") || 0);
  let form = $("form.filters", el);
  if (!form || form.dataset.key !== formKey(params)) {
    const [runs, facets] = await Promise.all([api("/api/runs"), api("/api/facets", {run})]);
    const opt = (vals, cur) => html`<option value="">any</option>${vals.map(v => html`<option ${v === cur ? "selected" : ""}>${v}</option>`)}`;
    const choices = (name, pairs) => html`<select name="${name}">${pairs.map(([v, l]) => html`<option value="${v}" ${params.get(name) === v ? "selected" : ""}>${l}</option>`)}</select>`;
    const cur = k => params.get(k) || "";
    const statuses = (params.get("status") || "").split(",").filter(Boolean);
    setHtml(el, html`<h2>Episodes</h2><form class="filters card" data-key="${formKey(params)}">
      ${runSelect(runs.runs, run, "run-select")}
      <label>kind<select name="kind">${opt(facets.kinds, params.get("kind"))}</select></label>
      <label>environment<select name="env">${opt(facets.envs, params.get("env"))}</select></label>
      <label>task contains<input name="task" value="${cur("task")}" placeholder="e.g. GoToObj"></label>
      <fieldset><legend>status</legend>${facets.statuses.map(s => html`<label style="flex-direction:row;gap:3px"><input type="checkbox" name="status" value="${s}" ${statuses.includes(s) ? "checked" : ""}>${s}</label>`)}</fieldset>
      <label>step ≥<input class="short" name="step_min" value="${cur("step_min")}"></label>
      <label>step ≤<input class="short" name="step_max" value="${cur("step_max")}"></label>
      <label>reward ≥<input class="short" name="reward_min" value="${cur("reward_min")}"></label>
      <label>reward ≤<input class="short" name="reward_max" value="${cur("reward_max")}"></label>
      <label>turns ≥<input class="short" name="turns_min" value="${cur("turns_min")}"></label>
      <label>turns ≤<input class="short" name="turns_max" value="${cur("turns_max")}"></label>
      <label>success${choices("success", [["", "any"], ["true", "yes"], ["false", "no"]])}</label>
      <label>invalid actions${choices("invalid", [["", "any"], ["true", "some"], ["false", "none"]])}</label>
      <label>search text<input name="q" value="${cur("q")}" placeholder="in replies, observations, errors"></label>
      <label>sort${choices("sort", SORTS)}</label>
      <label>order<select name="order"><option value="asc">ascending</option><option value="desc" ${params.get("order") === "desc" ? "selected" : ""}>descending</option></select></label>
      <label>per page<select name="limit">${[25, 50, 100, 200].map(n => html`<option ${String(n) === (params.get("limit") || "50") ? "selected" : ""}>${n}</option>`)}</select></label>
      <button type="button" id="reset">reset</button>
    </form><div id="results"></div>`);
    form = $("form.filters", el);
    const apply = () => {
      const p = {run};
      for (const name of FILTERS) {
        if (name === "status") continue;
        const input = form.elements[name];
        if (input && input.value) p[name] = input.value;
      }
      const st = $$("input[name=status]:checked", form).map(i => i.value);
      if (st.length) p.status = st.join(",");
      if (p.limit === "50") delete p.limit;
      form.dataset.key = formKey(new URLSearchParams(p));
      go("episodes", p);
    };
    let timer = null;
    form.addEventListener("change", apply);
    form.addEventListener("input", e => { if (e.target.tagName === "INPUT" && e.target.type === "text") { clearTimeout(timer); timer = setTimeout(apply, 450); } });
    form.addEventListener("submit", e => { e.preventDefault(); apply(); });
    $("#reset", form).onclick = () => go("episodes", {run});
    const rs = $("#run-select", form);
    if (rs) rs.onchange = e => { e.stopPropagation(); go("episodes", {run: rs.value}); };
  }
  await showResults($("#results", el), run, params);
}

async function showResults(box, run, params) {
  const q = {run};
  for (const k of FILTERS) if (params.get(k)) q[k] = params.get(k);
  q.offset = params.get("offset") || 0;
  let page;
  try { page = await api("/api/episodes", q); } catch (e) {
    if (e instanceof NeedKey) throw e;
    setHtml(box, html`<div class="errorbox">${e.message}</div>`);
    return;
  }
  lastListHash = location.hash || "#episodes";
  const off = page.offset, n = page.rows.length, lim = page.limit;
  const exportParams = Object.fromEntries(Object.entries(q).filter(([k]) => k !== "offset"));
  exportParams.offset = off;
  setHtml(box, html`<div class="pager"><button data-off="0" ${off <= 0 ? "disabled" : ""}>« first</button>
    <button data-off="${Math.max(0, off - lim)}" ${off <= 0 ? "disabled" : ""}>‹ prev</button>
    <span id="range">${page.total ? `${off + 1}–${off + n} of ${page.total}` : "0"} episodes</span>
    <button data-off="${off + lim}" ${off + lim >= page.total ? "disabled" : ""}>next ›</button>
    <button data-off="${Math.max(0, Math.floor((page.total - 1) / lim) * lim)}" ${off + lim >= page.total ? "disabled" : ""}>last »</button>
    <button type="button" id="export-page">export this page (HTML)</button> <span id="export-error" class="bad"></span></div>${episodeTable(page.rows)}`);
  $$(".pager button[data-off]", box).forEach(b => b.onclick = () => { const p = Object.fromEntries(params); p.offset = b.dataset.off; if (p.offset === "0") delete p.offset; go("episodes", p); });
  $("#export-page", box).onclick = () => downloadExport(exportParams).catch(e => { $("#export-error", box).textContent = e.message; });
  $$("tbody tr", box).forEach(tr => tr.onclick = () => go("episode", {run, file: tr.dataset.file, row: tr.dataset.row}));
}

function episodeTable(rows) {
  const body = rows.map(r => html`<tr data-file="${r.file}" data-row="${r.row}"><td>${r.kind}</td><td class=num>${r.step}</td><td>${r.env}</td><td>${r.task_id}</td>
      <td><span class="pill ${r.status}">${r.status}</span></td><td class="num ${r.success ? "good" : ""}">${fmt(r.reward)}</td>
      <td class=num>${r.num_turns}</td><td class="num ${r.invalid > 0 ? "bad" : ""}">${r.invalid}</td><td class=num>${r.n_tokens >= 0 ? r.n_tokens : "–"}</td>
      <td class="num ${r.parse_failures > 0 ? "bad" : ""}" data-col="parse_failures">${orUnknown(r.parse_failures)}</td><td class=num data-col="context_tokens">${orUnknown(r.context_tokens)}</td>
      <td class="muted">${r.error ? html`<span class=bad>${r.error}</span>` : (r.last_reply || "")}</td></tr>`);
  return html`<table class="list"><thead><tr><th>kind</th><th class=num>step</th><th>env</th><th>task</th><th>status</th><th class=num>reward</th><th class=num>turns</th><th class=num>invalid</th><th class=num>tokens</th><th class=num title="replies the parser could not read">parse failures</th><th class=num title="the final context length (prompt + every turn)">context</th><th>last reply</th></tr></thead><tbody>${body}</tbody></table>`;
}

// ------------------------------------------------------------------ one episode
function turnsHtml(ep) {
  const h = [];
  if (ep.system != null) h.push(html`<details><summary>system prompt (${ep.system.length} characters)</summary><pre>${ep.system}</pre></details>`);
  if (ep.first_observation != null) h.push(html`<div class="turn"><div class="head"><span class="n">observation 0</span></div><pre class="obs">${ep.first_observation}</pre></div>`);
  for (const t of ep.turns) {
    const action = t.invalid ? html`<span class="action invalid-action">invalid action: ${t.invalid_reason || "no action"}</span>`
      : html`parsed action: <span class="action ${t.rejected ? "invalid-action" : ""}">${t.action}</span>${t.rejected ? html` <span class="bad">rejected by the environment</span>` : ""}`;
    const obs = t.observation == null ? "" : html`<div class="muted">${t.feedback ? "feedback (the environment was not stepped)" : "observation"}</div><pre class="obs ${t.feedback ? "feedback" : ""}">${t.observation}</pre>`;
    h.push(html`<div class="turn ${t.invalid || t.rejected ? "invalid" : ""}" data-turn="${t.index}"><div class="head"><span class="n">turn ${t.index + 1}</span>
      <span>reward <b>${t.reward == null ? "–" : fmt(t.reward)}</b></span></div>
      <div class="muted">agent output</div><pre class="reply">${t.reply}</pre>
      <div>${action}</div>${obs}</div>`);
  }
  if (!ep.has_messages) h.push(html`<p class="muted">This file holds only the episode's summary (no messages or tokens).</p>`);
  return html`${h}`;
}

/* A count the record may not hold (parse_failures, context_tokens: not in older runs). */
function orUnknown(x) { return x == null ? html`<span class="muted unknown">unknown</span>` : x; }

/* A field's value, or a marker when the record holds a value of the wrong type there. */
function fieldValue(ep, key, value) {
  const bad = (ep.malformed || {})[key];
  if (bad) return html`<span class="malformed" data-field="${key}" title="${bad}">malformed</span>`;
  return value == null || value === "" ? "–" : value;
}

function fieldsHtml(ep) {
  const f = ep.fields, v = (key, value) => fieldValue(ep, key, value === undefined ? f[key] : value);
  const inv = f.invalid_actions ? ` (${ep.format_invalid} unparsable, ${ep.env_rejected} rejected${ep.unlocated_invalid ? `, ${ep.unlocated_invalid} not located` : ""})` : "";
  const items = [["status", v("status", f.status == null ? null : html`<span class="pill ${f.status}">${f.status}</span>`)], ["reward", v("reward", fmt(f.reward))],
    ["success", v("success", f.success ? html`<span class=good>yes</span>` : "no")], ["turns", v("num_turns")],
    ["invalid actions", v("invalid_actions", f.invalid_actions == null ? null : `${f.invalid_actions}${inv}`)],
    ["parse failures", v("parse_failures", orUnknown(f.parse_failures))], ["context tokens", v("context_tokens", orUnknown(f.context_tokens))],
    ["step", v("step")], ["horizon", v("horizon")], ["policy version", v("policy_version")], ["group", v("group_id")], ["sample", v("sample_index")],
    ["seconds", v("elapsed_s", fmt(f.elapsed_s, 2))], ["episode id", v("episode_id")], ["file", `${ep.file_name} row ${ep.row}`]];
  return html`<div class="fields card">${items.map(([k, val]) => html`<div><b>${k}</b>${val}</div>`)}</div>`;
}

function malformedHtml(ep) {
  const bad = Object.entries(ep.malformed || {});
  if (!bad.length) return "";
  return html`<div class="errorbox malformed-record">malformed record (shown as far as it can be):<ul>${bad.map(([k, why]) => html`<li><b>${k}</b>: ${why}</li>`)}</ul></div>`;
}

function tokenColor(mode, tk, i) {
  if (!tk.mask[i]) return "";
  if (mode === "logprob" && num(tk.logprob[i])) {
    const p = Math.exp(tk.logprob[i]);
    return `background:hsl(${Math.round(120 * p)},70%,80%);outline:none`;
  }
  if (mode === "advantage" && num(tk.advantage[i])) {
    const a = Math.max(-1, Math.min(1, tk.advantage[i] / (tk._amax || 1)));
    return a >= 0 ? `background:rgba(47,95,208,${0.15 + 0.6 * a});outline:none` : `background:rgba(198,40,40,${0.15 - 0.6 * a});outline:none`;
  }
  return "";
}

function tokensHtml(ep, mode) {
  const tk = ep.tokens;
  if (!tk) return html`<p class="muted">No token view for this episode: ${(ep.malformed || {}).tokens ? `malformed token record (${ep.malformed.tokens})` : "no token ids recorded"}.</p>`;
  const advs = tk.advantage.filter(num).map(Math.abs);
  tk._amax = advs.length ? Math.max(...advs) : 1;
  const head = html`<div class="card"><b>${tk.n_tokens}</b> tokens, <b>${tk.n_trained}</b> trained (loss mask 1), prompt ${tk.prompt_length}.
    <span class="legendbox" style="background:var(--train-bg)"></span> trained: the model's own tokens &nbsp;
    <span class="legendbox" style="background:var(--ctx-bg)"></span> not trained: prompt, response prefix, observations.
    <br>advantage: ${tk.advantage_note || "–"}${tk.tokenizer_error ? html`<br><span class=bad>${tk.tokenizer_error}</span> (token ids shown)` : ""}
    <ul class="checks">${(ep.checks || []).map(c => html`<li class="${c.ok === true ? "ok" : c.ok === false ? "fail" : "skip"}"><b>${c.name}</b>: ${c.detail}</li>`)}</ul>
    <label>colour trained tokens by <select id="tok-mode">${["mask", "logprob", "advantage"].map(m => html`<option ${m === mode ? "selected" : ""}>${m}</option>`)}</select></label></div>`;
  const span = i => {
    const text = String(tk.strings ? tk.strings[i] : `[${tk.ids[i]}]`).replace(/\n/g, "↵\n");
    const st = tokenColor(mode, tk, i);
    return st ? html`<span class="tok m${tk.mask[i]}" data-i="${i}" style="${st}">${text}</span>` : html`<span class="tok m${tk.mask[i]}" data-i="${i}">${text}</span>`;
  };
  // the prompt (system message + first observation: long, never trained) starts collapsed
  let p = 0;
  while (p < tk.ids.length && tk.turn[p] < 0 && !tk.mask[p]) p++;
  const prompt = [], rest = [];
  for (let i = 0; i < tk.ids.length; i++) (i < p ? prompt : rest).push(span(i));
  const collapsed = p ? html`<details class="prompt-tokens" ${p === tk.ids.length ? "open" : ""}><summary>prompt: ${p} tokens, loss mask 0 (click to show)</summary>${prompt}</details>` : "";
  return html`${head}<div class="tokens" id="tokens">${collapsed}${rest}</div>`;
}

function tokenTip(tk, i) {
  const s = tk.strings ? JSON.stringify(tk.strings[i]) : "";
  return `#${i}  id ${tk.ids[i]} ${s}\nloss mask ${tk.mask[i]}  turn ${tk.turn[i] < 0 ? "prompt" : tk.turn[i] + 1}` +
    (num(tk.logprob[i]) ? `\nlogprob ${tk.logprob[i].toFixed(4)}  (p ${Math.exp(tk.logprob[i]).toFixed(3)})` : "") +
    (num(tk.advantage[i]) ? `\nadvantage ${tk.advantage[i].toFixed(4)}` : "");
}

function bindTokens(root, ep) {
  const box = $("#tokens", root);
  if (!box) return;
  let tip = $("#tip");
  if (!tip) { tip = document.createElement("div"); tip.id = "tip"; document.body.appendChild(tip); }
  box.addEventListener("mousemove", e => {
    const t = e.target.closest(".tok");
    if (!t) { tip.style.display = "none"; return; }
    tip.textContent = tokenTip(ep.tokens, +t.dataset.i);
    tip.style.display = "block";
    tip.style.left = Math.min(e.clientX + 12, window.innerWidth - 320) + "px";
    tip.style.top = (e.clientY + 14) + "px";
  });
  box.addEventListener("mouseleave", () => { tip.style.display = "none"; });
}

async function viewEpisode(el, params) {
  const run = +(params.get("run") || 0), file = params.get("file"), row = params.get("row");
  const ep = EXPORT ? EXPORT.episodes[`${file}:${row}`] : await api("/api/episode", {run, file, row});
  if (!ep) throw new Error(`episode ${file}:${row} is not in this export`);
  const tab = params.get("tab") || "turns", mode = params.get("color") || "mask";
  const f = ep.fields;
  const h = [html`<p><a href="${EXPORT ? "#episodes" : lastListHash}">← episodes</a></p>
    <h2>${f.env} · ${f.task_id} <span class="muted">(${ep.kind}, step ${f.step ?? "–"})</span></h2>${malformedHtml(ep)}${fieldsHtml(ep)}`];
  if (f.error) h.push(html`<div class="errorbox">error: ${f.error}</div>`);
  for (const w of ep.warnings || []) h.push(html`<div class="errorbox">${w}</div>`);
  h.push(html`<div class="tabs"><button data-tab="turns" class="${tab === "turns" ? "active" : ""}">Turns</button><button data-tab="tokens" class="${tab === "tokens" ? "active" : ""}">Tokens</button></div>`);
  h.push(html`<div id="tab-body">${tab === "tokens" ? tokensHtml(ep, mode) : turnsHtml(ep)}</div>`);
  setHtml(el, html`${h}`);
  const p = Object.fromEntries(params);
  $$(".tabs button", el).forEach(b => b.onclick = () => go("episode", {...p, tab: b.dataset.tab}));
  const sel = $("#tok-mode", el);
  if (sel) sel.onchange = () => go("episode", {...p, tab: "tokens", color: sel.value});
  bindTokens(el, ep);
}

// ------------------------------------------------------------------ before / after
async function viewCompare(el, params) {
  const run = +(params.get("run") || 0);
  const [runs, cmp] = await Promise.all([api("/api/runs"), api("/api/compare", {run})]);
  const h = [];
  if (cmp.steps.length < 2) {
    setHtml(el, html`<h2>Before / after training</h2><div class="card">${runSelect(runs.runs, run, "cmp-run")}<p class="muted">This needs evaluation episodes at two steps (e.g. <code>train.eval_before=True</code> and a final evaluation); evaluated steps: ${cmp.steps.join(", ") || "none"}.</p></div>`);
    bindRunSelect(el, "cmp-run", "compare"); return;
  }
  const tasks = cmp.tasks;
  const mean = side => { const v = tasks.map(t => t[side].success_rate).filter(num); return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null; };
  const deltas = tasks.map(t => num(t.before.success_rate) && num(t.after.success_rate) ? t.after.success_rate - t.before.success_rate : null);
  const count = f => deltas.filter(d => d != null && f(d)).length;
  h.push(html`<h2>Before / after training</h2><div class="card">${runSelect(runs.runs, run, "cmp-run")}evaluation at step <b>${cmp.before}</b> (before) vs step <b>${cmp.after}</b> (after): ${tasks.length} tasks, success (completion flag) ${pct(mean("before"))} → ${pct(mean("after"))};
    <span class="delta-pos">${count(d => d > 0)} better</span>, <span class="delta-neg">${count(d => d < 0)} worse</span>, ${count(d => d === 0)} unchanged.
    <label>sort <select id="cmp-sort">${[["task", "by task"], ["change", "by change (largest gain first)"], ["loss", "by change (largest loss first)"]].map(([v, l]) => html`<option value="${v}" ${params.get("sort") === v ? "selected" : ""}>${l}</option>`)}</select></label></div>`);
  const ti = params.has("task") ? +params.get("task") : null;
  if (ti != null && tasks[ti]) {
    const t = tasks[ti], sample = +(params.get("sample") || 0);
    const n = Math.max(t.before.episodes.length, t.after.episodes.length);
    h.push(html`<h3>${t.env} · ${t.task_id}</h3><p>sample: ${Array.from({length: n}, (_, s) => s === sample ? html`<b>${s}</b> ` : html`<a href="${hashFor("compare", {run, task: ti, sample: s})}">${s}</a> `)}
      · <a href="${hashFor("compare", {run})}">all tasks</a></p>`);
    const eps = await Promise.all(["before", "after"].map(side => {
      const e = t[side].episodes[sample];
      return e ? api("/api/episode", {run, file: e.file, row: e.row, tokens: "false"}).then(x => [side, e, x]) : Promise.resolve([side, null, null]);
    }));
    const cols = eps.map(([side, e, ep]) => html`<div class="col" data-side="${side}"><h3>${side} (step ${side === "before" ? cmp.before : cmp.after})</h3>${ep
      ? html`<p>${malformedHtml(ep)}<span class="pill ${ep.fields.status}">${ep.fields.status}</span> reward <b>${fmt(ep.fields.reward)}</b>, ${ep.fields.num_turns ?? "–"} turns, ${ep.fields.invalid_actions ?? "–"} invalid, ${orUnknown(ep.fields.parse_failures)} parse failures, ${orUnknown(ep.fields.context_tokens)} context tokens · <a href="${hashFor("episode", {run, file: e.file, row: e.row})}">open</a></p>${turnsHtml(ep)}`
      : html`<p class="muted">no sample ${sample}</p>`}</div>`);
    h.push(html`<div class="row" id="side-by-side">${cols}</div>`);
  } else {
    const order = tasks.map((_, i) => i);
    const key = i => deltas[i] == null ? -Infinity : deltas[i];
    if (params.get("sort") === "change") order.sort((a, b) => key(b) - key(a) || a - b);
    if (params.get("sort") === "loss") order.sort((a, b) => (deltas[a] ?? Infinity) - (deltas[b] ?? Infinity) || a - b);
    const rows = order.map(i => {
      const t = tasks[i], d = deltas[i];
      return html`<tr data-task="${i}"><td>${t.env}</td><td>${t.task_id}</td><td class=num>${pct(t.before.success_rate)}</td><td class=num>${pct(t.after.success_rate)}</td>
        <td class="num ${d > 0 ? "delta-pos" : d < 0 ? "delta-neg" : ""}">${d == null ? "–" : (d > 0 ? "+" : "") + (100 * d).toFixed(1)}</td><td class=num>${fmt(t.before.mean_reward)}</td><td class=num>${fmt(t.after.mean_reward)}</td></tr>`;
    });
    h.push(html`<table class="list compare"><thead><tr><th>env</th><th>task</th><th class=num>success before</th><th class=num>success after</th><th class=num>change</th><th class=num>reward before</th><th class=num>reward after</th></tr></thead><tbody>${rows}</tbody></table>`);
  }
  setHtml(el, html`${h}`);
  $$("table.compare tbody tr", el).forEach(tr => tr.onclick = () => go("compare", {run, task: tr.dataset.task}));
  bindRunSelect(el, "cmp-run", "compare");
  const cs = $("#cmp-sort", el);
  if (cs) cs.onchange = () => go("compare", {run, sort: cs.value});
}

function bindRunSelect(el, id, view) {
  const s = $("#" + id, el);
  if (s) s.onchange = () => go(view, {run: s.value});
}

// ------------------------------------------------------------------ export file
function viewExportList(el) {
  const x = EXPORT;
  setHtml(el, html`<h2>${x.title}</h2><div class="card">${x.description}</div>${episodeTable(x.rows)}`);
  $$("tbody tr", el).forEach(tr => tr.onclick = () => go("episode", {file: tr.dataset.file, row: tr.dataset.row}));
}

// ------------------------------------------------------------------ router and live view
async function render(soft = false) {
  const seq = ++renderSeq;
  const {view, params} = parseHash();
  $$("header nav a").forEach(a => a.classList.toggle("active", a.dataset.view === view || (view === "episode" && a.dataset.view === "episodes")));
  const el = $("#view");
  try {
    if (view === "runs") await viewRuns(el);
    else if (view === "episodes") await viewEpisodes(el, params);
    else if (view === "episode") { if (!soft) await viewEpisode(el, params); }
    else if (view === "compare") await viewCompare(el, params);
    else setHtml(el, html`<div class="errorbox">unknown view ${view}</div>`);
  } catch (e) {
    if (seq !== renderSeq) return;
    if (e instanceof NeedKey) showKeyForm(el, e.message);
    else setHtml(el, html`<div class="errorbox">${e.message}</div>`);
  }
  document.body.dataset.rendered = String(seq);
}

async function poll() {
  if (EXPORT || !$("#live").checked) return;
  try {
    const st = await api("/api/status");
    const sig = JSON.stringify(st.runs.map(r => [r.files, r.episodes, r.metrics_rows]));
    $("#live-status").textContent = st.runs.map(r => `step ${r.last_step ?? "–"} · ${r.episodes} episodes` + (num(r.pending_bytes) && r.pending_bytes ? ` · indexing ${(r.pending_bytes / 1e6).toFixed(0)} MB` : "")).join(" | ") + " · " + new Date().toLocaleTimeString();
    if (lastStatusSig !== null && sig !== lastStatusSig) await render(true);
    lastStatusSig = sig;
  } catch (e) {
    $("#live-status").textContent = e instanceof NeedKey ? "API key needed" : "server unreachable";
  }
}

window.addEventListener("hashchange", () => render());
window.addEventListener("DOMContentLoaded", () => {
  if (EXPORT) {
    setHtml($("header nav"), html`<a href="#episodes" data-view="episodes">Episodes (exported)</a>`);
    $("header .live").style.display = "none";
  } else {
    setInterval(poll, POLL_MS);
    poll();
  }
  render();
});
