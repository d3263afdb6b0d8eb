// A trial's page: its metrics, runs, logs and checkpoints.
"use strict";

async function trialPage(id) {
  main.innerHTML = `
    <h1 id="title">Trial ${esc(id)}</h1>
    <div class="cards" id="cards"></div>
    <div class="actions"><button id="continue">Continue trial</button></div>
    <h2>Metrics</h2>
    <div class="filters">${curveControls(false)}</div>
    <div class="chart" id="chart"></div>
    <h2>Runs</h2>
    <table id="runs"><thead><tr><th>Run</th><th>State</th><th>Agent</th><th>Started</th>
      <th>Ended</th><th>Exit code</th><th title="why it waits or is stopping, or why it ended">Why</th></tr></thead><tbody></tbody></table>
    <h2>Logs</h2><div id="logview"></div>
    <h2>Checkpoints</h2>
    <table id="ckpts"><thead><tr><th>UUID</th><th class="num">Batches</th><th>State</th>
      <th class="num">Size</th><th>Reported</th><th></th></tr></thead><tbody></tbody></table>`;
  const store = new MetricStore();
  const chart = new LineChart(document.getElementById("chart"), "");
  const metricSel = document.getElementById("metric");
  const logView = new LogViewer(document.getElementById("logview"), id);
  document.getElementById("continue").addEventListener(
    "click", () => continueDialog(id).catch(() => {}));
  document.getElementById("ckpts").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-register]");
    if (b) registerDialog(b.dataset.register).catch(() => {});
  });
  const redraw = () => {
    const cur = metricSel.value;
    const names = store.names();
    metricSel.innerHTML = names.map((n) => `<option ${n === cur ? "selected" : ""}>${esc(n)}</option>`).join("");
    if (!metricSel.value) return;
    const o = curveOptions();
    const tr = store.series([id], "training", metricSel.value, o.x)[0];
    const va = store.series([id], "validation", metricSel.value, o.x)[0];
    chart.update([{ label: "training", points: tr.points }, { label: "validation", points: va.points }],
                 metricSel.value, o);
  };
  bindCurveControls(redraw);
  const addLogs = (lines) => logView.add(lines);
  const renderTrial = (t) => {
    document.getElementById("title").innerHTML =
      `Trial ${t.id} of <a href="#/experiments/${t.experiment_id}">experiment ${t.experiment_id}</a> ${state(t.state)} ${liveMark(t.state)}`;
    document.getElementById("cards").innerHTML = [
      ["Batches trained", fmt(t.batches)], ["Batches at checkpoint", fmt(t.steps_completed)],
      ["Best validation", fmt(t.best_validation)], ["Restarts", t.restarts],
      ["Runs", t.runs], ["Last exit", esc(t.exit_reason) || "–"],
      ["Hyperparameters", flatHparams(t.hparams, () => false)
        .sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, v]) => `${esc(k)} <code>${esc(fmt(v))}</code>`).join(", ") || "–"]]
      .map(([k, v]) => `<div class="card"><b>${k}</b>${v}</div>`).join("");
    if (t.run_history) {
      document.querySelector("#runs tbody").innerHTML = t.run_history.map((r) => `
        <tr><td>${r.run}</td><td>${state(r.state)} <span class="muted run-state">${esc(r.run_state)}</span></td>
          <td>${esc(r.agent_id)}</td>
          <td>${when(r.started_at)}</td><td>${when(r.ended_at)}</td><td>${fmt(r.exit_code)}</td>
          <td>${esc(r.exit_reason || r.run_reason)}</td></tr>`).join("");
    }
    api("GET", `/api/v1/trials/${id}/checkpoints`).then((c) => {
      document.querySelector("#ckpts tbody").innerHTML = c.checkpoints.map((k) => `
        <tr><td><code>${esc(k.uuid)}</code></td><td class="num">${k.steps_completed}</td>
          <td>${esc(k.state)}</td><td class="num">${size(k.size_bytes)}</td>
          <td>${when(k.reported_at)}</td>
          <td>${k.state === "COMPLETED" ? `<a href="/api/v1/checkpoints/${esc(k.uuid)}/download">download</a>
            <button data-register="${esc(k.uuid)}">register</button>` : ""}</td></tr>`).join("");
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
      addLogs((await api("GET", `/api/v1/trials/${id}/logs?tail=5000`)).logs);
    },
    trial: (t) => { if (loaded) renderTrial(t); },
    metrics: (rows) => { for (const r of rows) store.add(r.trial_id, r.group, [r]); redraw(); },
    logs: addLogs,
  });
}
