// The job queue and the cluster's agents and slots.
"use strict";

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
