// The model registry (spec: introduction-and-features, Model Registry): the models
// (#/models), a model's versions (#/models/NAME) with a form that registers a checkpoint by
// its uuid, and the trial page's "register" action on a checkpoint row (registerDialog).
"use strict";

function modelHref(name) {
  return `#/models/${encodeURIComponent(name)}`;
}

async function modelsPage() {
  main.innerHTML = `
    <h1>Models</h1>
    <form class="filters" id="new-model">
      <input name="name" placeholder="new model's name" required maxlength="255" aria-label="name">
      <input name="description" placeholder="description" aria-label="description">
      <button class="primary" type="submit">Create model</button>
    </form>
    <table id="models"><thead><tr><th>Name</th><th class="num">Versions</th><th>Labels</th>
      <th>Owner</th><th>Updated</th><th>Description</th></tr></thead><tbody></tbody></table>`;
  document.getElementById("new-model").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const m = await api("POST", "/api/v1/models",
                        { name: f.get("name"), description: f.get("description") || "" });
    location.hash = modelHref(m.name);
  });
  const { models } = await api("GET", "/api/v1/models");
  document.querySelector("#models tbody").innerHTML = models.length ? models.map((m) => `
    <tr><td><a href="${modelHref(m.name)}">${esc(m.name)}</a></td>
      <td class="num">${m.num_versions}</td><td>${esc(m.labels.join(", "))}</td>
      <td>${esc(m.owner)}</td><td>${when(m.last_updated_time)}</td>
      <td>${esc(m.description)}</td></tr>`).join("")
    : `<tr><td colspan="6" class="muted">No models yet: create one here, then register a
       checkpoint from its page or from a trial's checkpoints.</td></tr>`;
}

function metricsText(values) {
  return Object.entries(values || {}).map(([k, v]) => `${esc(k)} <code>${esc(fmt(v))}</code>`)
    .join(", ");
}

async function modelPage(name) {
  let m;
  try {
    m = await api("GET", `/api/v1/models/${encodeURIComponent(name)}`);
  } catch (e) {
    return notFoundPage(e.message || `No model ${name}.`);
  }
  main.innerHTML = `
    <div class="crumbs"><a href="#/models">Models</a> /</div>
    <h1>Model ${esc(m.name)}${m.archived ? " <span class=\"state\">archived</span>" : ""}</h1>
    <div class="cards">${[
      ["Description", esc(m.description) || "–"], ["Labels", esc(m.labels.join(", ")) || "–"],
      ["Owner", esc(m.owner)], ["Versions", m.num_versions],
      ["Updated", when(m.last_updated_time)]]
      .map(([k, v]) => `<div class="card"><b>${k}</b>${v}</div>`).join("")}</div>
    <h2>Versions</h2>
    <div class="table-wrap"><table id="versions"><thead><tr><th class="num">Version</th>
      <th>Name</th><th>Checkpoint</th><th>Trial</th><th class="num">Batches</th>
      <th class="num">Size</th><th>Validation</th><th>Registered</th><th></th></tr></thead>
      <tbody>${m.versions.length ? m.versions.map((v) => `
        <tr><td class="num">${v.version}</td><td>${esc(v.name)}</td>
          <td><code>${esc(v.checkpoint_uuid)}</code></td>
          <td><a href="#/trials/${v.trial_id}">trial ${v.trial_id}</a> of
            <a href="#/experiments/${v.experiment_id}">experiment ${v.experiment_id}</a></td>
          <td class="num">${fmt(v.steps_completed)}</td><td class="num">${size(v.size_bytes)}</td>
          <td>${metricsText(v.validation_metrics)}</td><td>${when(v.creation_time)}</td>
          <td>${v.checkpoint_state === "COMPLETED" ? `<a class="download" href="/api/v1/checkpoints/${esc(v.checkpoint_uuid)}/download">download</a>` : esc(v.checkpoint_state)}</td></tr>`).join("")
        : '<tr><td colspan="9" class="muted">No versions yet.</td></tr>'}</tbody></table></div>
    <h2>Register a checkpoint</h2>
    <form class="filters" id="register">
      <input name="checkpoint" placeholder="checkpoint UUID" required size="38" aria-label="checkpoint UUID">
      <input name="name" placeholder="version name" aria-label="version name">
      <button class="primary" type="submit">Register as version ${m.num_versions + 1}</button>
    </form>`;
  document.getElementById("register").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    await api("POST", `/api/v1/models/${encodeURIComponent(m.name)}/versions`,
              { checkpoint: f.get("checkpoint").trim(), name: f.get("name") || null });
    route().catch(() => {});
  });
}

// The trial page's "register" on a COMPLETED checkpoint: pick a model, name the version.
async function registerDialog(uuid) {
  const { models } = await api("GET", "/api/v1/models");
  const dialog = document.createElement("dialog");
  dialog.innerHTML = `
    <form method="dialog" class="dialog">
      <h2>Register checkpoint</h2>
      <code>${esc(uuid)}</code>
      ${models.length ? `<label>Model <select name="model">${models.map((m) =>
        `<option>${esc(m.name)}</option>`).join("")}</select></label>
      <label>Version name <input name="name"></label>`
      : '<p class="muted">No models yet: create one on the <a href="#/models">Models</a> page.</p>'}
      <p class="dialog-error" role="alert" hidden></p>
      <div class="actions">${models.length ? '<button class="primary" value="register">Register</button>' : ""}
        <button value="cancel" formnovalidate>Cancel</button></div>
    </form>`;
  main.appendChild(dialog);
  const error = dialog.querySelector(".dialog-error");
  dialog.querySelector("form").addEventListener("submit", async (ev) => {
    if (!ev.submitter || ev.submitter.value !== "register") return;
    ev.preventDefault();
    const f = new FormData(ev.target);
    try {
      await api("POST", `/api/v1/models/${encodeURIComponent(f.get("model"))}/versions`,
                { checkpoint: uuid, name: f.get("name") || null });
      dialog.close();
      location.hash = modelHref(f.get("model"));
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    }
  });
  dialog.addEventListener("close", () => dialog.remove());
  dialog.showModal();
}
