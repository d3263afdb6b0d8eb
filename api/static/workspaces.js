// Workspaces and projects (issue 34): the workspaces the user may view, a workspace's
// projects, and a project's experiments (the experiments list, filtered to it).
"use strict";

function crumbs(items) {
  return `<nav class="crumbs">${items.map(([href, label]) =>
    href ? `<a href="${href}">${esc(label)}</a>` : `<span>${esc(label)}</span>`).join(" / ")}</nav>`;
}

async function workspacesPage() {
  main.innerHTML = `<h1>Workspaces</h1>
    <table id="workspaces"><thead><tr><th class="num">ID</th><th>Name</th>
      <th class="num">Projects</th><th class="num">Experiments and tasks</th><th>Pools</th>
      <th>Created by</th><th>Created</th></tr></thead><tbody></tbody></table>`;
  const { workspaces } = await api("GET", "/api/v1/workspaces");
  document.querySelector("#workspaces tbody").innerHTML = workspaces.map((w) => `
    <tr data-workspace="${w.id}"><td class="num">${w.id}</td>
      <td><a href="#/workspaces/${w.id}">${esc(w.name)}</a>${w.archived ? ' <span class="muted">archived</span>' : ""}</td>
      <td class="num">${w.projects}</td><td class="num">${w.experiments}</td>
      <td>${esc(w.bound_pools.join(", ")) || '<span class="muted">any</span>'}</td>
      <td>${esc(w.created_by)}</td><td>${when(w.created_at)}</td></tr>`).join("");
}

async function workspacePage(id) {
  let w;
  try {
    w = await api("GET", `/api/v1/workspaces/${id}`);
  } catch (e) {
    if (e.status === 404) return notFoundPage(e.message);
    throw e;
  }
  main.innerHTML = `${crumbs([["#/workspaces", "Workspaces"], [null, w.name]])}
    <h1>Workspace ${esc(w.name)}${w.archived ? ' <span class="muted">archived</span>' : ""}</h1>
    <div class="cards">${[["Projects", w.projects], ["Experiments and tasks", w.experiments],
                          ["Pools", esc(w.bound_pools.join(", ")) || "any"],
                          ["Created by", esc(w.created_by)]]
      .map(([k, v]) => `<div class="card"><b>${k}</b>${v}</div>`).join("")}</div>
    <h2>Projects</h2>
    <table id="projects"><thead><tr><th class="num">ID</th><th>Name</th><th>Description</th>
      <th class="num">Experiments</th><th>Created by</th><th>Created</th></tr></thead><tbody>
    ${w.project_list.map((p) => `<tr data-project="${p.id}"><td class="num">${p.id}</td>
      <td><a href="#/projects/${p.id}">${esc(p.name)}</a>${p.archived ? ' <span class="muted">archived</span>' : ""}</td>
      <td>${esc(p.description)}</td><td class="num">${p.experiments}</td>
      <td>${esc(p.created_by)}</td><td>${when(p.created_at)}</td></tr>`).join("")}
    </tbody></table>`;
}

async function projectPage(id) {
  let p;
  try {
    p = await api("GET", `/api/v1/projects/${id}`);
  } catch (e) {
    if (e.status === 404) return notFoundPage(e.message);
    throw e;
  }
  await experimentsPage(new URLSearchParams({ workspace: p.workspace, project: p.name }));
  main.insertAdjacentHTML("afterbegin", crumbs([
    ["#/workspaces", "Workspaces"], [`#/workspaces/${p.workspace_id}`, p.workspace],
    [null, p.name]]));
}
