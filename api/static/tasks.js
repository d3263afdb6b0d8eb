"use strict";

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
