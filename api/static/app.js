// det's WebUI: one page, routed by the URL's hash; every figure comes from /api/v1 and live
// pages follow the server's event streams (/api/v1/events/...), which det serve feeds from
// one LISTEN connection: the browser never polls.
"use strict";

let main = document.getElementById("main");
let cleanup = [];  // what the current page opened (event streams, charts), closed on leaving

// --- helpers -------------------------------------------------------------------------------

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(4);
  return String(v);
}

function when(ts) {
  return ts ? new Date(ts).toLocaleString() : "";
}

function duration(start, end) {
  if (!start) return "";
  const s = Math.max(0, ((end ? new Date(end) : new Date()) - new Date(start)) / 1000);
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function state(s) {
  return `<span class="state ${esc(s)}">${esc(s)}</span>`;
}

// A <progress>, not a span with a style attribute: det's CSP allows no inline style.
function bar(pct) {
  return `<progress class="bar" max="100" value="${Math.min(100, pct || 0)}"></progress>${fmt(pct || 0)}%`;
}

// The searcher section of an experiment's stored config; {} for an old or partial config
// that has none (issue 32: readers show defaults, never fail on a missing key).
function searcherOf(exp) {
  const s = exp && exp.config && exp.config.searcher;
  return s && typeof s === "object" ? s : {};
}

function showError(msg) {
  const el = document.getElementById("error");
  el.textContent = msg || "";
  el.hidden = !msg;
}

async function api(method, path, body) {
  const r = await fetch(path, {
    method, credentials: "same-origin",
    // X-Det-Request: det serve refuses a cookie-authenticated change without it (CSRF).
    headers: body === undefined ? { "X-Det-Request": "1" }
      : { "X-Det-Request": "1", "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (r.status === 401 && !path.endsWith("/auth/login")) {
    location.hash = "#/login";
    throw new Error("not logged in");
  }
  const data = r.status === 204 ? null : await r.json();
  if (!r.ok) {
    showError(data && data.error ? data.error : `${r.status} ${r.statusText}`);
    throw new Error(data && data.error);
  }
  showError("");
  return data;
}

// An event stream of the page; `handlers` maps event names to functions of the data.
function follow(path, handlers) {
  const es = new EventSource(path, { withCredentials: true });
  for (const [name, fn] of Object.entries(handlers)) {
    es.addEventListener(name, (e) => fn(JSON.parse(e.data)));
  }
  cleanup.push(() => es.close());
  return es;
}

// --- charts (uPlot, vendored) -----------------------------------------------------------------

const COLORS = ["#2f6fde", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d",
                "#5c940d", "#d9480f", "#364fc7"];

// A line chart of several series over batches: `series` is [{label, points: Map(x -> y)}].
class LineChart {
  constructor(el, title) {
    this.el = el;
    this.title = title;
    this.plot = null;
    this.labels = "";
    cleanup.push(() => this.plot && this.plot.destroy());
  }

  update(series, yLabel) {
    const xs = [...new Set(series.flatMap((s) => [...s.points.keys()]))].sort((a, b) => a - b);
    const data = [xs, ...series.map((s) => xs.map((x) => s.points.has(x) ? s.points.get(x) : null))];
    const labels = series.map((s) => s.label).join("|") + "|" + yLabel;
    // How many points are drawn: read by tests/test_webui.py to see a live chart grow.
    this.el.dataset.points = String(data.slice(1).flat().filter((v) => v !== null).length);
    if (this.plot && labels === this.labels) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.labels = labels;
    this.el.innerHTML = "";
    const width = Math.max(360, this.el.clientWidth - 20);
    this.plot = new uPlot({
      title: this.title, width, height: 280,
      scales: { x: { time: false } },
      axes: [{ label: "batches" }, { label: yLabel, size: 70 }],
      series: [{ label: "batches" }, ...series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
        points: { show: xs.length < 60 } }))],
    }, data, this.el);
  }
}

// A scatter chart of hyperparameter value vs metric, one point per trial.
class ScatterChart {
  constructor(el) {
    this.el = el;
    this.plot = null;
    cleanup.push(() => this.plot && this.plot.destroy());
  }

  update(points, xLabel, yLabel) {
    points = points.filter((p) => typeof p[0] === "number" && typeof p[1] === "number")
                   .sort((a, b) => a[0] - b[0]);
    if (this.plot) this.plot.destroy();
    this.el.innerHTML = points.length ? "" : `<span class="muted">no trial has both yet</span>`;
    if (!points.length) return;
    this.plot = new uPlot({
      title: `${yLabel} by ${xLabel}`, width: Math.max(360, this.el.clientWidth - 20), height: 240,
      scales: { x: { time: false } },
      axes: [{ label: xLabel }, { label: yLabel, size: 70 }],
      series: [{ label: xLabel }, { label: yLabel, stroke: "#2f6fde", width: 0,
                                    points: { show: true, size: 8 } }],
    }, [points.map((p) => p[0]), points.map((p) => p[1])], this.el);
  }
}

// Metrics rows kept per trial and group, merged by id (history from REST, then the stream).
class MetricStore {
  constructor() { this.rows = new Map(); this.seen = new Set(); }

  add(trialId, group, rows) {
    const key = `${trialId}/${group}`;
    if (!this.rows.has(key)) this.rows.set(key, []);
    for (const r of rows) {
      if (this.seen.has(r.id)) continue;
      this.seen.add(r.id);
      this.rows.get(key).push(r);
    }
  }

  names(group) {
    const names = new Set();
    for (const [key, rows] of this.rows) {
      if (group && !key.endsWith(`/${group}`)) continue;
      for (const r of rows) {
        for (const [k, v] of Object.entries(r.values)) if (typeof v === "number") names.add(k);
      }
    }
    return [...names].sort();
  }

  series(trialIds, group, metric) {
    return trialIds.map((t) => {
      const points = new Map();
      for (const r of this.rows.get(`${t}/${group}`) || []) {
        const v = r.values[metric];
        if (typeof v === "number") points.set(r.steps_completed, v);
      }
      return { label: `trial ${t}`, points };
    });
  }
}

// --- pages ------------------------------------------------------------------------------------

const ACTIONS = {
  ACTIVE: ["pause", "cancel", "kill"],
  PAUSED: ["activate", "cancel", "kill"],
  STOPPING_CANCELED: ["kill"], STOPPING_COMPLETED: ["kill"], STOPPING_ERROR: ["kill"],
  STOPPING_KILLED: [],
  COMPLETED: ["archive"], CANCELED: ["archive"], ERROR: ["archive"],
};

function actionButtons(e) {
  const acts = e.archived ? ["unarchive"] : (ACTIONS[e.state] || []);
  return acts.map((a) => `<button data-act="${a}" data-id="${e.id}">${a}</button>`).join("");
}

async function runAction(act, id) {
  if (act === "archive" || act === "unarchive") {
    await api("PUT", `/api/v1/experiments/${id}/archived`, { archived: act === "archive" });
  } else {
    if ((act === "kill" || act === "cancel") && !confirm(`${act} experiment ${id}?`)) return;
    await api("POST", `/api/v1/experiments/${id}/${act}`);
  }
}

function bindActions(root) {
  root.addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-act]");
    if (b) runAction(b.dataset.act, b.dataset.id).catch(() => {});
  });
}

async function loginPage() {
  main.innerHTML = `
    <form class="login" id="login">
      <h1>Log in to det</h1>
      <input name="username" placeholder="user" autocomplete="username" required>
      <input name="password" type="password" placeholder="password" autocomplete="current-password">
      <button class="primary" type="submit">Log in</button>
    </form>`;
  document.getElementById("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    await api("POST", "/api/v1/auth/login",
              { username: f.get("username"), password: f.get("password") || "" });
    location.hash = "#/experiments";
  });
}

async function experimentsPage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const sort = params.get("sort") || "-id";
  main.innerHTML = `
    <h1>Experiments <span class="live" id="live"></span></h1>
    <div class="filters">
      <select id="f-state"><option value="">any state</option>
        ${Object.keys(ACTIONS).map((s) => `<option ${params.get("state") === s ? "selected" : ""}>${s}</option>`).join("")}
      </select>
      <input id="f-name" placeholder="name contains" value="${esc(params.get("name") || "")}">
      <input id="f-owner" placeholder="owner" value="${esc(params.get("owner") || "")}">
      <input id="f-workspace" placeholder="workspace" value="${esc(params.get("workspace") || "")}">
      <label><input type="checkbox" id="f-archived" ${params.get("archived") ? "checked" : ""}> archived</label>
    </div>
    <div class="actions"><button id="tb-selected" disabled>Open TensorBoard for selected</button></div>
    <table id="exps"><thead><tr><th></th>
      ${[["id", "ID"], ["name", "Name"], ["state", "State"], ["progress", "Progress"],
         ["best_validation", "Best metric"], [null, "Searcher"], ["trials", "Trials"],
         ["owner", "Owner"], [null, "Workspace / project"], ["started", "Started"],
         [null, "Duration"], [null, "Actions"]]
        .map(([k, h]) => `<th ${k ? `class="sortable" data-sort="${k}"` : ""}>${h}${
          k && sort.replace("-", "") === k ? (sort.startsWith("-") ? " ▾" : " ▴") : ""}</th>`).join("")}
    </tr></thead><tbody></tbody></table>
    <p class="muted" id="total"></p>`;
  const setFilter = () => {
    const p = new URLSearchParams();
    const st = document.getElementById("f-state").value;
    const nm = document.getElementById("f-name").value;
    const ow = document.getElementById("f-owner").value;
    const ws = document.getElementById("f-workspace").value;
    if (st) p.set("state", st);
    if (nm) p.set("name", nm);
    if (ow) p.set("owner", ow);
    if (ws) p.set("workspace", ws);
    if (document.getElementById("f-archived").checked) p.set("archived", "true");
    p.set("sort", sort);
    location.hash = `#/experiments?${p}`;
  };
  for (const id of ["f-state", "f-archived"]) document.getElementById(id).addEventListener("change", setFilter);
  for (const id of ["f-name", "f-owner", "f-workspace"]) document.getElementById(id).addEventListener("change", setFilter);
  main.querySelector("thead").addEventListener("click", (ev) => {
    const th = ev.target.closest("th[data-sort]");
    if (!th) return;
    params.set("sort", sort === `-${th.dataset.sort}` ? th.dataset.sort : `-${th.dataset.sort}`);
    location.hash = `#/experiments?${params}`;
  });
  bindActions(main);
  // Kept apart from the table, which every stream event redraws.
  const selected = new Set();
  const tbButton = document.getElementById("tb-selected");
  main.querySelector("#exps").addEventListener("change", (ev) => {
    const box = ev.target.closest("input[data-select]");
    if (!box) return;
    if (box.checked) selected.add(Number(box.dataset.select));
    else selected.delete(Number(box.dataset.select));
    tbButton.disabled = selected.size === 0;
  });
  tbButton.addEventListener("click", () => openTensorBoard([...selected]).catch(() => {}));
  const q = new URLSearchParams();
  for (const k of ["state", "name", "owner", "workspace", "archived"]) if (params.get(k)) q.set(k, params.get(k));
  q.set("sort", sort);
  const render = (page) => {
    document.querySelector("#exps tbody").innerHTML = page.experiments.map((e) => `
      <tr data-exp="${e.id}">
        <td><input type="checkbox" data-select="${e.id}" ${selected.has(e.id) ? "checked" : ""}
             aria-label="select experiment ${e.id}"></td>
        <td class="num"><a href="#/experiments/${e.id}">${e.id}</a></td>
        <td><a href="#/experiments/${e.id}">${esc(e.name)}</a></td>
        <td>${state(e.state)}${e.archived ? ' <span class="muted">archived</span>' : ""}</td>
        <td>${bar(e.progress)}</td>
        <td class="num">${fmt(e.best_validation)} <span class="muted">${esc(e.metric)}</span></td>
        <td>${esc(e.searcher)}</td>
        <td class="num">${e.trials}</td>
        <td>${esc(e.owner)}</td>
        <td>${esc(e.workspace)} <span class="muted">/ ${esc(e.project)}</span></td>
        <td>${when(e.started)}</td>
        <td>${duration(e.started, e.ended)}</td>
        <td class="actions">${actionButtons(e)}</td>
      </tr>`).join("");
    document.getElementById("total").textContent = `${page.pagination.total} experiment(s)`;
    document.getElementById("live").textContent = "● live";
  };
  render(await api("GET", `/api/v1/experiments?${q}`));
  follow(`/api/v1/events/experiments?${q}`, { experiments: render });
}

async function experimentPage(id) {
  main.innerHTML = `
    <h1 id="title">Experiment ${esc(id)} <span class="live" id="live"></span></h1>
    <div class="cards" id="cards"></div>
    <div class="actions"><span class="actions" id="acts"></span>
      <button id="open-tb">Open TensorBoard</button></div>
    <h2>Learning curves</h2>
    <div class="filters">
      <select id="group"><option>validation</option><option>training</option></select>
      <select id="metric"></select>
    </div>
    <div class="chart" id="curves"></div>
    <div id="hp-view" hidden>
      <h2>Hyperparameters vs metric</h2>
      <div class="filters"><select id="hp"></select></div>
      <div class="chart" id="scatter"></div>
    </div>
    <h2>Trials</h2>
    <table id="trials"><thead><tr><th>ID</th><th>State</th><th>Hyperparameters</th>
      <th class="num">Batches</th><th class="num">Best metric</th><th>Rung</th>
      <th class="num">Restarts</th><th>Exit</th></tr></thead><tbody></tbody></table>
    <h2>Scheduling</h2>
    <div class="filters" id="sched"></div>
    <h2>Config</h2><pre id="config"></pre>`;
  bindActions(main);
  document.getElementById("open-tb").addEventListener(
    "click", () => openTensorBoard([Number(id)]).catch(() => {}));
  const store = new MetricStore();
  const chart = new LineChart(document.getElementById("curves"), "");
  const scatter = new ScatterChart(document.getElementById("scatter"));
  let exp = null;
  let trials = [];
  const groupSel = document.getElementById("group");
  const metricSel = document.getElementById("metric");
  const hpSel = document.getElementById("hp");

  const redraw = () => {
    const names = store.names(groupSel.value);
    const cur = metricSel.value || searcherOf(exp).metric;
    metricSel.innerHTML = names.map((n) => `<option ${n === cur ? "selected" : ""}>${esc(n)}</option>`).join("");
    const metric = metricSel.value;
    if (!metric) { chart.el.innerHTML = '<span class="muted">no metrics reported yet</span>'; return; }
    chart.update(store.series(trials.map((t) => t.id), groupSel.value, metric), metric);
    if (trials.length > 1) {
      document.getElementById("hp-view").hidden = false;
      const hps = Object.keys(trials[0].hparams || {}).filter((k) => typeof trials[0].hparams[k] === "number");
      const curHp = hpSel.value || hps[0];
      hpSel.innerHTML = hps.map((h) => `<option ${h === curHp ? "selected" : ""}>${esc(h)}</option>`).join("");
      if (hpSel.value) {
        scatter.update(trials.map((t) => [t.hparams[hpSel.value], t.best_validation]),
                       hpSel.value, `best ${searcherOf(exp).metric || ""}`);
      }
    }
  };
  groupSel.addEventListener("change", redraw);
  metricSel.addEventListener("change", redraw);
  hpSel.addEventListener("change", redraw);

  const renderExp = (e) => {
    exp = { ...exp, ...e };
    trials = e.trials;
    const best = trials.map((t) => t.best_validation).filter((v) => v !== null);
    const smaller = searcherOf(exp).smaller_is_better !== false;
    const batches = trials.reduce((a, t) => a + (t.batches || 0), 0);
    document.getElementById("title").innerHTML =
      `Experiment ${esc(e.id)}: ${esc(e.name)} ${state(e.state)} <span class="live">● live</span>`;
    document.getElementById("cards").innerHTML = [
      ["Progress", bar(Math.round((e.progress || 0) * 100))],
      ["Batches trained", batches],
      [`Best ${esc(searcherOf(exp).metric || "")}`,
       best.length ? fmt(smaller ? Math.min(...best) : Math.max(...best)) : "–"],
      ["Trials", trials.length], ["Owner", esc(e.owner)],
      ["Duration", duration(e.start_time, e.end_time)],
      ["Pool", esc(e.resource_pool)]].map(([k, v]) => `<div class="card"><b>${k}</b>${v}</div>`).join("");
    document.getElementById("acts").innerHTML = actionButtons(e);
    document.querySelector("#trials tbody").innerHTML = trials.map((t) => `
      <tr><td><a href="#/trials/${t.id}">${t.id}</a></td><td>${state(t.state)}</td>
        <td><code>${esc(JSON.stringify(t.hparams))}</code></td>
        <td class="num">${fmt(t.batches)}</td><td class="num">${fmt(t.best_validation)}</td>
        <td>${t.rung ? `bracket ${t.rung.bracket}, rung ${t.rung.rung} (${esc(t.rung.status)})` : ""}</td>
        <td class="num">${t.restarts}</td><td>${esc(t.exit_reason)}</td></tr>`).join("");
    document.getElementById("sched").innerHTML = `
      priority <input id="prio" size="3" value="${esc(e.priority)}"> <button id="set-prio">set</button>
      weight <input id="weight" size="5" value="${esc(e.weight)}"> <button id="set-weight">set</button>`;
    document.getElementById("set-prio").onclick = () =>
      api("PATCH", `/api/v1/experiments/${id}`, { priority: document.getElementById("prio").value });
    document.getElementById("set-weight").onclick = () =>
      api("PATCH", `/api/v1/experiments/${id}`, { weight: document.getElementById("weight").value });
    redraw();
  };

  // The stream first: its "ready" says from which metrics id it sends rows, then the
  // history is loaded through REST (rows are merged by id, so overlap is harmless).
  let loaded = false;
  follow(`/api/v1/events/experiments/${id}`, {
    ready: async () => {
      if (loaded) return;
      loaded = true;
      exp = await api("GET", `/api/v1/experiments/${id}`);
      document.getElementById("config").textContent =
        exp.original_config || JSON.stringify(exp.config, null, 2);
      for (const group of ["training", "validation"]) {
        const m = await api("GET", `/api/v1/experiments/${id}/metrics?group=${group}&max_points=2000`);
        for (const t of m.trials) store.add(t.trial_id, group, t.rows);
      }
      renderExp(exp);
    },
    experiment: (e) => { if (exp) renderExp(e); },
    metrics: (rows) => {
      for (const r of rows) store.add(r.trial_id, r.group, [r]);
      if (exp) redraw();
    },
  });
}

async function trialPage(id) {
  main.innerHTML = `
    <h1 id="title">Trial ${esc(id)}</h1>
    <div class="cards" id="cards"></div>
    <h2>Metrics</h2>
    <div class="filters"><select id="metric"></select></div>
    <div class="chart" id="chart"></div>
    <h2>Runs</h2>
    <table id="runs"><thead><tr><th>Run</th><th>State</th><th>Agent</th><th>Started</th>
      <th>Ended</th><th>Exit code</th><th>Why it ended</th></tr></thead><tbody></tbody></table>
    <h2>Logs</h2><pre class="logs" id="logs"></pre>
    <h2>Checkpoints</h2>
    <table id="ckpts"><thead><tr><th>UUID</th><th class="num">Batches</th><th>State</th>
      <th class="num">Bytes</th><th>Reported</th><th></th></tr></thead><tbody></tbody></table>`;
  const store = new MetricStore();
  const chart = new LineChart(document.getElementById("chart"), "");
  const metricSel = document.getElementById("metric");
  const logs = document.getElementById("logs");
  const seenLogs = new Set();
  const redraw = () => {
    const cur = metricSel.value;
    const names = store.names();
    metricSel.innerHTML = names.map((n) => `<option ${n === cur ? "selected" : ""}>${esc(n)}</option>`).join("");
    if (!metricSel.value) return;
    const tr = store.series([id], "training", metricSel.value)[0];
    const va = store.series([id], "validation", metricSel.value)[0];
    chart.update([{ label: "training", points: tr.points }, { label: "validation", points: va.points }],
                 metricSel.value);
  };
  metricSel.addEventListener("change", redraw);
  const addLogs = (lines) => {
    const atBottom = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 5;
    for (const l of lines) {
      if (seenLogs.has(l.id)) continue;
      seenLogs.add(l.id);
      logs.append(document.createTextNode((l.stream === "det" ? "[det] " : "") + l.line + "\n"));
    }
    if (atBottom) logs.scrollTop = logs.scrollHeight;
  };
  const renderTrial = (t) => {
    document.getElementById("title").innerHTML =
      `Trial ${t.id} of <a href="#/experiments/${t.experiment_id}">experiment ${t.experiment_id}</a> ${state(t.state)} <span class="live">● live</span>`;
    document.getElementById("cards").innerHTML = [
      ["Batches trained", fmt(t.batches)], ["Batches at checkpoint", fmt(t.steps_completed)],
      ["Best validation", fmt(t.best_validation)], ["Restarts", t.restarts],
      ["Runs", t.runs], ["Last exit", esc(t.exit_reason) || "–"],
      ["Hyperparameters", `<code>${esc(JSON.stringify(t.hparams))}</code>`]]
      .map(([k, v]) => `<div class="card"><b>${k}</b>${v}</div>`).join("");
    if (t.run_history) {
      document.querySelector("#runs tbody").innerHTML = t.run_history.map((r) => `
        <tr><td>${r.run}</td><td>${state(r.state)}</td><td>${esc(r.agent_id)}</td>
          <td>${when(r.started_at)}</td><td>${when(r.ended_at)}</td><td>${fmt(r.exit_code)}</td>
          <td>${esc(r.exit_reason || r.pending_reason)}</td></tr>`).join("");
    }
    api("GET", `/api/v1/trials/${id}/checkpoints`).then((c) => {
      document.querySelector("#ckpts tbody").innerHTML = c.checkpoints.map((k) => `
        <tr><td><code>${esc(k.uuid)}</code></td><td class="num">${k.steps_completed}</td>
          <td>${esc(k.state)}</td><td class="num">${fmt(k.size_bytes)}</td>
          <td>${when(k.reported_at)}</td>
          <td>${k.state === "COMPLETED" ? `<a href="/api/v1/checkpoints/${esc(k.uuid)}/download">download</a>` : ""}</td></tr>`).join("");
    }).catch(() => {});
  };
  let loaded = false;
  follow(`/api/v1/events/trials/${id}`, {
    ready: async () => {
      if (loaded) return;
      loaded = true;
      renderTrial(await api("GET", `/api/v1/trials/${id}`));
      for (const group of ["training", "validation"]) {
        const m = await api("GET", `/api/v1/trials/${id}/metrics?group=${group}&max_points=2000`);
        store.add(Number(id), group, m.rows);
      }
      redraw();
      addLogs((await api("GET", `/api/v1/trials/${id}/logs?tail=500`)).logs);
    },
    trial: (t) => { if (loaded) renderTrial(t); },
    metrics: (rows) => { for (const r of rows) store.add(r.trial_id, r.group, [r]); redraw(); },
    logs: addLogs,
  });
}

// --- interactive tasks (notebooks, TensorBoards, shells, commands) -------------------------------

// Start a TensorBoard over experiments and show it on the Tasks page, where it opens once its
// server answers (det serve proxies it at /proxy/<id>/).
async function openTensorBoard(experimentIds) {
  await api("POST", "/api/v1/tensorboards", { experiment_ids: experimentIds });
  location.hash = "#/tasks";
}

function secondsText(s) {
  if (s === null || s === undefined) return "";
  return duration(new Date(Date.now() - s * 1000).toISOString());
}

// A task opens once its run is RUNNING and its server has answered (its address is known).
function openLink(t) {
  if (!t.url || t.state !== "RUNNING" || !t.address) return "";
  return `<a class="open" href="${esc(t.url)}" target="_blank" rel="noopener" data-task="${t.id}">Open</a>`;
}

async function tasksPage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  main.innerHTML = `
    <h1>Tasks <span class="live" id="live"></span></h1>
    <div class="filters">
      <button class="primary" id="launch">Launch JupyterLab</button>
      <label><input type="checkbox" id="f-all" ${params.get("all") === "false" ? "" : "checked"}>
        ended and other users' tasks</label>
    </div>
    <table id="tasks"><thead><tr><th>ID</th><th>Kind</th><th>Description</th><th>State</th>
      <th>Owner</th><th>Workspace</th><th>Started</th><th>Idle for</th><th>Ended because</th>
      <th></th></tr></thead><tbody></tbody></table>
    <div id="task-logs" hidden><h2 id="logs-title"></h2><pre class="logs" id="logs"></pre></div>
    <dialog id="nb-dialog">
      <form method="dialog" id="nb-form" class="dialog">
        <h2>Launch JupyterLab</h2>
        <label>Slots <select name="slots" id="nb-slots">
          <option value="0">0 (CPU only)</option><option value="1" selected>1</option>
          <option value="n">N…</option></select>
          <input name="n" id="nb-n" type="number" min="2" value="2" hidden></label>
        <label>Resource pool <select name="pool" id="nb-pool">
          <option value="">the workspace's default</option></select></label>
        <label>Template <input name="template" id="nb-template" placeholder="none"></label>
        <label>Workspace <input name="workspace" id="nb-workspace" placeholder="Uncategorized"></label>
        <label>Project <input name="project" id="nb-project"></label>
        <div class="actions"><button class="primary" value="launch" id="nb-go">Launch</button>
          <button value="cancel" formnovalidate>Cancel</button></div>
      </form>
    </dialog>`;
  const all = () => document.getElementById("f-all").checked;
  document.getElementById("f-all").addEventListener("change", () => {
    location.hash = `#/tasks?all=${all()}`;
  });
  const dialog = document.getElementById("nb-dialog");
  const slots = document.getElementById("nb-slots");
  slots.addEventListener("change", () => {
    document.getElementById("nb-n").hidden = slots.value !== "n";
  });
  document.getElementById("launch").addEventListener("click", async () => {
    const pools = await api("GET", "/api/v1/resource-pools");
    document.getElementById("nb-pool").innerHTML = '<option value="">the workspace\'s default</option>' +
      pools.resource_pools.map((p) => `<option>${esc(p.name)}</option>`).join("");
    dialog.showModal();
  });
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "launch") return;
    const f = new FormData(document.getElementById("nb-form"));
    const n = f.get("slots") === "n" ? f.get("n") : f.get("slots");
    const overrides = [`resources.slots=${n}`];
    if (f.get("pool")) overrides.push(`resources.resource_pool=${f.get("pool")}`);
    const body = { overrides };
    for (const k of ["template", "workspace", "project"]) if (f.get(k)) body[k] = f.get(k);
    // The new notebook's row comes with the stream; its Open link once its server answers.
    await api("POST", "/api/v1/notebooks", body).catch(() => {});
  });
  const logsBox = document.getElementById("task-logs");
  main.querySelector("#tasks").addEventListener("click", async (ev) => {
    const b = ev.target.closest("button[data-op]");
    if (!b) return;
    const id = b.dataset.task;
    if (b.dataset.op === "kill") {
      if (!confirm(`kill task ${id}?`)) return;
      await api("POST", `/api/v1/tasks/${id}/kill`).catch(() => {});
    } else if (b.dataset.op === "logs") {
      const r = await api("GET", `/api/v1/tasks/${id}/logs?tail=500`).catch(() => null);
      if (!r) return;
      logsBox.hidden = false;
      document.getElementById("logs-title").textContent = `Logs of task ${id}`;
      document.getElementById("logs").textContent = r.logs.map(
        (l) => (l.stream === "det" ? "[det] " : "") + l.line).join("\n");
    }
  });
  const render = (page) => {
    document.querySelector("#tasks tbody").innerHTML = page.tasks.map((t) => `
      <tr data-task="${t.id}" data-kind="${esc(t.kind)}" data-state="${esc(t.state)}">
        <td class="num">${t.id}</td><td>${esc(t.kind)}</td><td>${esc(t.description)}</td>
        <td>${state(t.state)}</td><td>${esc(t.owner)}</td><td>${esc(t.workspace)}</td>
        <td>${when(t.started)}</td>
        <td>${t.state === "TERMINATED" ? "" : secondsText(t.idle_seconds)}</td>
        <td>${esc(t.end_reason)}</td>
        <td class="actions">${openLink(t)}
          ${t.state === "TERMINATED" ? "" : `<button data-op="kill" data-task="${t.id}">Kill</button>`}
          <button data-op="logs" data-task="${t.id}">Logs</button></td>
      </tr>`).join("") || '<tr><td colspan="10" class="muted">No tasks.</td></tr>';
    document.getElementById("live").textContent = "● live";
  };
  const q = `all=${all()}`;
  render(await api("GET", `/api/v1/tasks?${q}`));
  follow(`/api/v1/events/tasks?${q}`, { tasks: render });
}

async function queuePage() {
  main.innerHTML = `<h1>Job Queue <span class="live" id="live"></span></h1><div id="pools"></div>`;
  const el = document.getElementById("pools");
  el.addEventListener("click", async (ev) => {
    const b = ev.target.closest("button");
    if (!b) return;
    const job = b.dataset.job;
    if (b.dataset.op === "top") await api("POST", `/api/v1/jobs/${job}/move-to-top`);
    if (b.dataset.op === "set") {
      const input = el.querySelector(`input[data-job="${job}"]`);
      await api("PATCH", `/api/v1/jobs/${job}`, { [input.dataset.field]: input.value });
    }
  });
  const render = (q) => {
    const pools = new Map();
    for (const j of q.jobs) {
      if (!pools.has(j.resource_pool)) pools.set(j.resource_pool, []);
      pools.get(j.resource_pool).push(j);
    }
    el.innerHTML = pools.size ? "" : '<p class="muted">No active jobs.</p>';
    for (const [pool, jobs] of pools) {
      const fair = jobs[0].scheduler === "fair_share";
      el.insertAdjacentHTML("beforeend", `
        <h2>Pool ${esc(pool)} <span class="muted">(${esc(jobs[0].scheduler)})</span></h2>
        <table class="queue" data-pool="${esc(pool)}"><thead><tr><th>#</th><th>Job</th><th>Type</th><th>Name</th>
          <th>${fair ? "Weight" : "Priority"}</th><th>Submitted</th><th>Slots (acquired/needed)</th>
          <th>Status</th><th>User</th><th>Why waiting</th><th></th></tr></thead><tbody>
        ${jobs.map((j) => `<tr data-job="${j.job_id}">
          <td class="num">${j.queue_order}</td><td class="num">${j.job_id}</td><td>${esc(j.type)}</td>
          <td><a href="#/experiments/${j.experiment_id}">${esc(j.name)}</a></td>
          <td><input size="4" data-job="${j.job_id}" data-field="${fair ? "weight" : "priority"}"
               value="${esc(fair ? j.weight : j.priority)}"> <button data-op="set" data-job="${j.job_id}">set</button></td>
          <td>${when(j.submitted_at)}</td><td class="num">${j.slots_acquired}/${j.slots_needed}</td>
          <td>${state(j.status)}</td><td>${esc(j.owner)}</td>
          <td class="why">${j.reasons.map(esc).join("<br>")}</td>
          <td>${fair || j.queue_order === 0 ? "" : `<button data-op="top" data-job="${j.job_id}">Move to Top</button>`}</td>
        </tr>`).join("")}</tbody></table>`);
    }
    document.getElementById("live").textContent = "● live";
  };
  follow("/api/v1/events/job-queue", { queue: render });
}

async function clusterPage() {
  main.innerHTML = `<h1>Cluster <span class="live" id="live"></span></h1>
    <h2>Resource pools</h2><table id="pools"></table>
    <h2>Agents</h2><table id="agents"></table>
    <h2>Slots</h2><table id="slots"></table>`;
  main.addEventListener("click", async (ev) => {
    const b = ev.target.closest("button[data-agent]");
    if (!b) return;
    const path = b.dataset.slot !== undefined
      ? `/api/v1/agents/${encodeURIComponent(b.dataset.agent)}/slots/${b.dataset.slot}/${b.dataset.op}`
      : `/api/v1/agents/${encodeURIComponent(b.dataset.agent)}/${b.dataset.op}`;
    await api("POST", path);
  });
  const render = (c) => {
    document.getElementById("pools").innerHTML = `<tr><th>Pool</th><th>Scheduler</th>
      <th class="num">Agents</th><th class="num">Slots used / total</th><th class="num">Queued jobs</th></tr>` +
      c.resource_pools.map((p) => `<tr><td>${esc(p.name)}</td><td>${esc(p.scheduler.type)}</td>
        <td class="num">${p.agents}</td><td class="num">${p.slots_used} / ${p.slots_total}</td>
        <td class="num">${p.queued_jobs}</td></tr>`).join("");
    document.getElementById("agents").innerHTML = `<tr><th>Agent</th><th>Host</th><th>Pool</th>
      <th>State</th><th>Runtime</th><th class="num">Slots used / total</th><th>Heartbeat</th><th></th></tr>` +
      c.agents.map((a) => `<tr data-agent="${esc(a.id)}"><td>${esc(a.id)}</td><td>${esc(a.hostname)}</td>
        <td>${esc(a.resource_pool)}</td><td>${state(a.state)}</td><td>${esc(a.runtime)}</td>
        <td class="num">${a.used} / ${a.slots}</td><td>${when(a.last_heartbeat)}</td>
        <td>${a.state === "LOST" ? "" : `<button data-agent="${esc(a.id)}" data-op="${a.state === "DISABLED" ? "enable" : "disable"}">${a.state === "DISABLED" ? "enable" : "disable (drain)"}</button>`}</td></tr>`).join("");
    document.getElementById("slots").innerHTML = `<tr><th>Agent</th><th>Slot</th><th>Type</th>
      <th>Device</th><th>Enabled</th><th>Allocation</th><th>Trial</th><th></th></tr>` +
      c.slots.map((s) => `<tr><td>${esc(s.agent_id)}</td><td>${s.slot_id}</td><td>${esc(s.type)}</td>
        <td>${esc(s.device_name)}</td><td>${s.enabled ? "yes" : "no"}</td>
        <td>${fmt(s.allocation_id)}</td>
        <td>${s.trial_id ? `<a href="#/trials/${s.trial_id}">${s.trial_id}</a>` : ""}</td>
        <td><button data-agent="${esc(s.agent_id)}" data-slot="${s.slot_id}" data-op="${s.enabled ? "disable" : "enable"}">${s.enabled ? "disable" : "enable"}</button></td></tr>`).join("");
    document.getElementById("live").textContent = "● live";
  };
  follow("/api/v1/events/cluster", { cluster: render });
}

// --- routing ----------------------------------------------------------------------------------

async function route() {
  for (const f of cleanup) f();
  cleanup = [];
  // A fresh element per page: the listeners of the page left go with it.
  const fresh = main.cloneNode(false);
  main.replaceWith(fresh);
  main = fresh;
  showError("");
  const path = (location.hash.replace(/^#/, "") || "/experiments").split("?")[0];
  const parts = path.split("/").filter(Boolean);
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === parts[0] ||
                      (a.dataset.nav === "experiments" && parts[0] === "trials"));
  }
  if (parts[0] === "login") return loginPage();
  try {
    const me = await api("GET", "/api/v1/me");
    document.getElementById("user").textContent = me.username;
    document.getElementById("logout").hidden = false;
  } catch (e) {
    return;
  }
  if (parts[0] === "experiments" && parts[1]) return experimentPage(parts[1]);
  if (parts[0] === "trials" && parts[1]) return trialPage(parts[1]);
  if (parts[0] === "queue") return queuePage();
  if (parts[0] === "tasks") return tasksPage();
  if (parts[0] === "cluster") return clusterPage();
  return experimentsPage();
}

document.getElementById("logout").addEventListener("click", async () => {
  await api("POST", "/api/v1/auth/logout");
  document.getElementById("logout").hidden = true;
  document.getElementById("user").textContent = "";
  location.hash = "#/login";
});
window.addEventListener("hashchange", () => route().catch(() => {}));
route().catch(() => {});
