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
    <table id="trials"><thead><tr><th>ID</th><th>State</th><th>Hyperparameters</th>
      <th class="num">Batches</th><th class="num">Best metric</th><th>Rung</th>
      <th class="num">Restarts</th><th>Exit</th></tr></thead><tbody></tbody></table>
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
    document.querySelector("#trials tbody").innerHTML = trials.map((t) => `
      <tr><td><a href="#/trials/${t.id}">${t.id}</a></td><td>${state(t.state)}</td>
        <td><code>${esc(JSON.stringify(t.hparams))}</code></td>
        <td class="num">${fmt(t.batches)}</td><td class="num">${fmt(t.best_validation)}</td>
        <td>${t.rung ? `bracket ${t.rung.bracket}, rung ${t.rung.rung} (${esc(t.rung.status === "running" && t.run_state ? t.run_state : t.rung.status)})` : ""}</td>
        <td class="num">${t.restarts}</td><td>${esc(t.exit_reason)}</td></tr>`).join("");
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
