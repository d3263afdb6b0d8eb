// The compare page (#/compare?trials=1,2,3 or ?experiments=4,5, or both): the chosen trials'
// learning curves overlaid, and a table of their hyperparameters and best metrics.
"use strict";

// Ids from a comma list in the hash ("1, 2,x" -> [1, 2]; what is not an id is dropped).
function idList(s) {
  return [...new Set(String(s || "").split(",").map((v) => v.trim())
    .filter((v) => /^[1-9][0-9]{0,17}$/.test(v)).map(Number))];
}

async function comparePage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const expIds = idList(params.get("experiments"));
  const trialIds = idList(params.get("trials"));
  main.innerHTML = `
    <h1>Compare</h1>
    <form class="filters" id="compare-form">
      <label>experiments <input name="experiments" value="${esc(expIds.join(","))}" placeholder="4,5"></label>
      <label>trials <input name="trials" value="${esc(trialIds.join(","))}" placeholder="1,2,3"></label>
      <button class="primary" type="submit">Compare</button>
    </form>
    <div id="compare-body"></div>`;
  document.getElementById("compare-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const p = new URLSearchParams();
    for (const k of ["experiments", "trials"]) if (idList(f.get(k)).length) p.set(k, idList(f.get(k)).join(","));
    location.hash = `#/compare?${p}`;
  });
  const body = document.getElementById("compare-body");
  if (!expIds.length && !trialIds.length) {
    body.innerHTML = `<p class="muted">Choose experiments or trials: tick them in the experiments
      list and press "Compare selected", or type their ids above.</p>`;
    return;
  }

  // The experiments involved (a chosen trial's too): their trials and searcher metrics.
  const chosen = await Promise.all(trialIds.map((t) => api("GET", `/api/v1/trials/${t}`)));
  const exps = new Map();
  for (const e of new Set([...expIds, ...chosen.map((t) => t.experiment_id)])) {
    exps.set(e, await api("GET", `/api/v1/experiments/${e}`));
  }
  const rows = [];
  for (const e of exps.values()) {
    const whole = expIds.includes(e.id);
    for (const t of e.trials) if (whole || trialIds.includes(t.id)) rows.push({ ...t, exp: e });
  }
  const store = new MetricStore();
  await Promise.all(rows.flatMap((t) => ["training", "validation"].map(async (g) => {
    const m = await api("GET", `/api/v1/trials/${t.id}/metrics?group=${g}&max_points=1000`);
    store.add(t.id, g, m.rows);
  })));

  body.innerHTML = `
    <h2>Learning curves</h2>
    <div class="filters">${curveControls()}</div>
    <div class="chart" id="compare-curves"></div>
    <h2>Hyperparameters and best metrics</h2>
    <table id="compare-table"><thead></thead><tbody></tbody></table>`;
  const shown = new Set(rows.map((t) => t.id));
  const label = (id) => {
    const t = rows.find((r) => r.id === id);
    return exps.size > 1 ? `exp ${t.exp.id} trial ${id}` : `trial ${id}`;
  };
  // A trial keeps its colour (the table's swatch) when others are hidden.
  const colorOf = (id) => COLORS[rows.findIndex((t) => t.id === id) % COLORS.length];
  const chart = new LineChart(document.getElementById("compare-curves"), "");
  const metricSel = document.getElementById("metric");
  // The first experiment's searcher metric first, as on an experiment page.
  const searcherMetric = searcherOf(rows.length ? rows[0].exp : null).metric;
  const redraw = () => {
    const group = document.getElementById("group").value;
    const names = store.names(group);
    const cur = metricSel.value || searcherMetric;
    metricSel.innerHTML = names.map((n) => `<option ${n === cur ? "selected" : ""}>${esc(n)}</option>`).join("");
    if (!metricSel.value) { chart.el.innerHTML = '<span class="muted">no metrics reported yet</span>'; return; }
    const o = curveOptions();
    const ids = rows.map((t) => t.id).filter((id) => shown.has(id));
    const series = store.series(ids, group, metricSel.value, o.x, label)
      .map((s, i) => ({ ...s, color: colorOf(ids[i]) }));
    chart.update(series, metricSel.value, o);
  };
  bindCurveControls(redraw);

  // One column per hyperparameter (dotted names for nested ones) and per validation metric
  // at each trial's best validation (what the searcher metric picked).
  const hps = [...new Set(rows.flatMap((t) => flatHparams(t.hparams).map(([k]) => k)))].sort();
  const metricNames = [...new Set(rows.flatMap((t) => Object.keys(t.validation || {})))]
    .filter((k) => !PROGRESS_KEYS.has(k)).sort();
  const table = document.getElementById("compare-table");
  table.querySelector("thead").innerHTML = `<tr><th>Curve</th><th>Trial</th><th>Experiment</th>
    <th>State</th><th class="num">Batches</th><th class="num">Best</th>
    ${hps.map((h) => `<th class="num">${esc(h)}</th>`).join("")}
    ${metricNames.map((m) => `<th class="num">${esc(m)}</th>`).join("")}</tr>`;
  table.querySelector("tbody").innerHTML = rows.map((t) => {
    const hp = new Map(flatHparams(t.hparams));
    const metric = searcherOf(t.exp).metric;
    return `<tr data-trial="${t.id}">
      <td><input type="checkbox" data-show="${t.id}" checked aria-label="show trial ${t.id}">
        <span class="swatch" data-color="${colorOf(t.id)}"></span></td>
      <td><a href="#/trials/${t.id}">${t.id}</a></td>
      <td><a href="#/experiments/${t.exp.id}">${t.exp.id}</a> <span class="muted">${esc(t.exp.name)}</span></td>
      <td>${state(t.state)}</td><td class="num">${fmt(t.batches)}</td>
      <td class="num">${fmt(t.best_validation)} <span class="muted">${esc(metric)}</span></td>
      ${hps.map((h) => `<td class="num">${hp.has(h) ? esc(fmt(hp.get(h))) : ""}</td>`).join("")}
      ${metricNames.map((m) => `<td class="num">${fmt((t.validation || {})[m])}</td>`).join("")}</tr>`;
  }).join("");
  // Colours from JS: det's CSP refuses style attributes.
  for (const s of table.querySelectorAll(".swatch")) s.style.background = s.dataset.color;
  table.addEventListener("change", (ev) => {
    const box = ev.target.closest("input[data-show]");
    if (!box) return;
    if (box.checked) shown.add(Number(box.dataset.show));
    else shown.delete(Number(box.dataset.show));
    redraw();
  });
  redraw();
}
