// The experiments list and an experiment's page.
"use strict";

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


// `preset`: the filters of a page that shows a part of the list (a project's), else the URL's.
async function experimentsPage(preset) {
  const params = preset || new URLSearchParams(location.hash.split("?")[1] || "");
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
      <input id="f-project" placeholder="project" value="${esc(params.get("project") || "")}">
      <label><input type="checkbox" id="f-archived" ${params.get("archived") ? "checked" : ""}> archived</label>
    </div>
    <div class="actions"><button id="tb-selected" disabled>Open TensorBoard for selected</button>
      <button id="compare-selected" disabled>Compare selected</button></div>
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
    const pr = document.getElementById("f-project").value;
    if (pr) p.set("project", pr);
    if (document.getElementById("f-archived").checked) p.set("archived", "true");
    p.set("sort", sort);
    location.hash = `#/experiments?${p}`;
  };
  for (const id of ["f-state", "f-archived"]) document.getElementById(id).addEventListener("change", setFilter);
  for (const id of ["f-name", "f-owner", "f-workspace", "f-project"]) document.getElementById(id).addEventListener("change", setFilter);
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
  const compareButton = document.getElementById("compare-selected");
  main.querySelector("#exps").addEventListener("change", (ev) => {
    const box = ev.target.closest("input[data-select]");
    if (!box) return;
    if (box.checked) selected.add(Number(box.dataset.select));
    else selected.delete(Number(box.dataset.select));
    tbButton.disabled = selected.size === 0;
    compareButton.disabled = selected.size === 0;
  });
  compareButton.addEventListener("click", () => {
    location.hash = `#/compare?experiments=${[...selected].sort((a, b) => a - b).join(",")}`;
  });
  tbButton.addEventListener("click", () => openTensorBoard([...selected]).catch(() => {}));
  const q = new URLSearchParams();
  for (const k of ["state", "name", "owner", "workspace", "project", "archived"]) if (params.get(k)) q.set(k, params.get(k));
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

// --- an experiment's trials table ------------------------------------------------------------

// The columns of the trials table: one per hyperparameter and per metric of each trial's best
// validation (nested names dotted, in name order as det experiment describe has them), the
// searcher's metric as "Best <metric>" (issue 34: the hyperparameters were one JSON blob that
// overflowed the table). Each column has `value` (what it sorts by) and `html` (its cell).
function trialColumns(trials, metric) {
  const flat = (t, key) => new Map(flatHparams(t[key], () => false));
  const names = (key) => [...new Set(trials.flatMap((t) => [...flat(t, key).keys()]))].sort();
  const hps = names("hparams");
  const metrics = names("validation").filter((m) => m !== metric && !PROGRESS_KEYS.has(m));
  // Aligned right where every value is a number (a categorical's are text).
  const num = (label, value, title) => ({
    label, value, title, html: (t) => fmt(value(t)),
    num: trials.every((t) => value(t) == null || typeof value(t) === "number") });
  return [
    { label: "ID", value: (t) => t.id, num: true, html: (t) => `<a href="#/trials/${t.id}">${t.id}</a>` },
    // A live trial's latest run as the job queue sees it (waiting, preempted...: issue 34),
    // its reason on hover.
    { label: "State", value: (t) => t.state, html: (t) => state(t.state) + (t.state === "ACTIVE" && t.run_state
      ? ` <span class="muted run-state" title="${esc(t.run_reason)}">${esc(t.run_state)}</span>` : "") },
    ...hps.map((h) => num(h, (t) => flat(t, "hparams").get(h), "hyperparameter")),
    num("Batches", (t) => t.batches),
    num(`Best ${metric || "metric"}`, (t) => t.best_validation, "the searcher's metric, at the trial's best validation"),
    ...metrics.map((m) => num(m, (t) => flat(t, "validation").get(m), "at the trial's best validation")),
    // Rungs: only adaptive_asha's and tpe's trials have them.
    ...(trials.some((t) => t.rung) ? [{ label: "Rung", value: (t) => (t.rung ? t.rung.rung : null), num: true,
      html: (t) => (t.rung ? `bracket ${t.rung.bracket}, rung ${t.rung.rung} (${esc(t.rung.status === "running" && t.run_state ? t.run_state : t.rung.status)})` : "") }] : []),
    num("Restarts", (t) => t.restarts),
    { label: "Exit", value: (t) => t.exit_reason, cls: "exit", html: (t) => esc(t.exit_reason) },
  ];
}

// `trials` ordered by `col`'s value (numbers as numbers, text as text), descending with
// `desc`; a trial without a value comes last either way. Stable: ties keep trial order.
function sortTrials(trials, col, desc) {
  const missing = (v) => v === null || v === undefined || v === "";
  return trials.map((t, i) => [t, col.value(t), i]).sort(([, a, i], [, b, j]) => {
    if (missing(a) || missing(b)) return missing(a) - missing(b) || i - j;
    const c = typeof a === "number" && typeof b === "number" ? a - b
      : String(a).localeCompare(String(b), undefined, { numeric: true });
    return (desc ? -c : c) || i - j;
  }).map(([t]) => t);
}

// Draws the trials into `table`, sorted by the column last clicked (a second click reverses
// it); the order survives the live updates that redraw it.
class TrialsTable {
  constructor(table) {
    this.table = table;
    this.sort = { label: "ID", desc: false };
    this.trials = [];
    this.metric = "";
    table.querySelector("thead").addEventListener("click", (ev) => {
      const th = ev.target.closest("th[data-col]");
      if (!th) return;
      const label = th.dataset.col;
      this.sort = { label, desc: this.sort.label === label ? !this.sort.desc : false };
      this.render(this.trials, this.metric);
    });
  }

  render(trials, metric) {
    this.trials = trials;
    this.metric = metric;
    const cols = trialColumns(trials, metric);
    const col = cols.find((c) => c.label === this.sort.label) || cols[0];
    const cls = (c) => [c.num ? "num" : "", c.cls || ""].join(" ").trim();
    this.table.querySelector("thead").innerHTML = `<tr>${cols.map((c) => {
      const on = c === col;
      return `<th class="sortable ${cls(c)}" data-col="${esc(c.label)}" title="${esc(c.title || "")}"
        aria-sort="${on ? (this.sort.desc ? "descending" : "ascending") : "none"}">${esc(c.label)}${
        on ? (this.sort.desc ? " ▾" : " ▴") : ""}</th>`;
    }).join("")}</tr>`;
    this.table.querySelector("tbody").innerHTML = sortTrials(trials, col, this.sort.desc)
      .map((t) => `<tr data-trial="${t.id}">${cols.map((c) =>
        `<td class="${cls(c)}" data-col="${esc(c.label)}">${c.html(t)}</td>`).join("")}</tr>`)
      .join("");
  }
}

async function experimentPage(id) {
  main.innerHTML = `
    <h1 id="title">Experiment ${esc(id)} <span class="live" id="live"></span></h1>
    <div class="cards" id="cards"></div>
    <div class="actions"><span class="actions" id="acts"></span>
      <button id="open-tb">Open TensorBoard</button>
      <button id="fork">Fork</button></div>
    <h2>Learning curves</h2>
    <div class="filters">${curveControls()}
      <a id="compare-link" href="#/compare?experiments=${esc(id)}">compare trials</a></div>
    <div class="chart" id="curves"></div>
    <div id="hp-view" hidden>
      <h2>Hyperparameters</h2>
      <div class="chart echart tall" id="parcoords"></div>
      <div class="filters"><select id="hp" aria-label="hyperparameter"></select></div>
      <div class="chart echart" id="scatter"></div>
    </div>
    <h2>Trials</h2>
    <div class="table-wrap"><table id="trials"><thead></thead><tbody></tbody></table></div>
    <h2>Scheduling</h2>
    <div class="filters" id="sched"></div>
    <h2>Config</h2><pre id="config"></pre>`;
  bindActions(main);
  document.getElementById("open-tb").addEventListener(
    "click", () => openTensorBoard([Number(id)]).catch(() => {}));
  document.getElementById("fork").addEventListener("click", () => forkDialog(id).catch(() => {}));
  const store = new MetricStore();
  const chart = new LineChart(document.getElementById("curves"), "");
  const scatter = new ScatterChart(document.getElementById("scatter"));
  const parallel = new ParallelChart(document.getElementById("parcoords"));
  const trialsTable = new TrialsTable(document.getElementById("trials"));
  let exp = null;
  let trials = [];
  const groupSel = document.getElementById("group");
  const metricSel = document.getElementById("metric");
  const hpSel = document.getElementById("hp");

  // The hyperparameter views: parallel coordinates over all of them and the best searcher
  // metric, and one of them against that metric.
  const redrawHps = () => {
    if (trials.length < 2) return;
    document.getElementById("hp-view").hidden = false;
    const searcher = searcherOf(exp);
    const hps = hparamColumns(exp, trials).filter((h) => h.type !== "const");
    const best = `best ${searcher.metric || "metric"}`;
    parallel.update(trials, hps, best, searcher.smaller_is_better !== false);
    const numeric = hps.filter((h) => h.type !== "categorical");
    const curHp = hpSel.value || (numeric[0] && numeric[0].name);
    hpSel.innerHTML = numeric.map((h) => `<option ${h.name === curHp ? "selected" : ""}>${esc(h.name)}</option>`).join("");
    const hp = numeric.find((h) => h.name === hpSel.value);
    if (hp) scatter.update(trials, hp, best);
  };
  const redraw = () => {
    const names = store.names(groupSel.value);
    const cur = metricSel.value || searcherOf(exp).metric;
    metricSel.innerHTML = names.map((n) => `<option ${n === cur ? "selected" : ""}>${esc(n)}</option>`).join("");
    const metric = metricSel.value;
    if (!metric) { chart.el.innerHTML = '<span class="muted">no metrics reported yet</span>'; return; }
    const o = curveOptions();
    chart.update(store.series(trials.map((t) => t.id), groupSel.value, metric, o.x), metric, o);
  };
  bindCurveControls(redraw);
  hpSel.addEventListener("change", redrawHps);

  const renderExp = (e) => {
    exp = { ...exp, ...e };
    trials = e.trials;
    const best = trials.map((t) => t.best_validation).filter((v) => v !== null);
    const smaller = searcherOf(exp).smaller_is_better !== false;
    const batches = trials.reduce((a, t) => a + (t.batches || 0), 0);
    document.getElementById("title").innerHTML =
      `Experiment ${esc(e.id)}: ${esc(e.name)} ${state(e.state)} ${liveMark(e.state)}`;
    document.getElementById("cards").innerHTML = [
      ["Progress", bar(Math.round((e.progress || 0) * 100))],
      ["Batches trained", batches],
      [`Best ${esc(searcherOf(exp).metric || "")}`,
       best.length ? fmt(smaller ? Math.min(...best) : Math.max(...best)) : "–"],
      ["Trials", trials.length], ["Owner", esc(e.owner)],
      ["Duration", duration(e.start_time, e.end_time)],
      ["Pool", esc(e.resource_pool)]].map(([k, v]) => `<div class="card"><b>${k}</b>${v}</div>`).join("");
    document.getElementById("acts").innerHTML = actionButtons(e);
    trialsTable.render(trials, searcherOf(exp).metric);
    document.getElementById("sched").innerHTML = `
      priority <input id="prio" size="3" value="${esc(e.priority)}"> <button id="set-prio">set</button>
      weight <input id="weight" size="5" value="${esc(e.weight)}"> <button id="set-weight">set</button>`;
    document.getElementById("set-prio").onclick = () =>
      api("PATCH", `/api/v1/experiments/${id}`, { priority: document.getElementById("prio").value });
    document.getElementById("set-weight").onclick = () =>
      api("PATCH", `/api/v1/experiments/${id}`, { weight: document.getElementById("weight").value });
    redraw();
    redrawHps();
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
