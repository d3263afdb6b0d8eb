// Cluster historical usage (issue 34; Determined's "Cluster historical usage"): slot-hours per
// UTC day by workspace, user, label or pool over a chosen period, as a stacked bar chart and
// a table, with the same figures as CSV (GET /api/v1/cluster/usage; det cluster usage).
"use strict";

const USAGE_GROUPS = ["workspace", "user", "label", "pool"];

async function usagePage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const groupBy = USAGE_GROUPS.includes(params.get("group_by")) ? params.get("group_by") : "workspace";
  const q = new URLSearchParams({ group_by: groupBy });
  for (const k of ["start", "end"]) if (params.get(k)) q.set(k, params.get(k));
  main.innerHTML = `<h1>Cluster historical usage</h1>
    <div class="filters">
      <label>from <input type="date" id="u-start"></label>
      <label>to <input type="date" id="u-end"></label>
      <label>by <select id="u-group">${USAGE_GROUPS.map((g) =>
        `<option ${g === groupBy ? "selected" : ""}>${g}</option>`).join("")}</select></label>
      <a id="u-csv" class="button" download>Download CSV</a>
      <span class="muted">slot-hours per UTC day: each run's slots from its assignment to its end;
        a run with several labels counts in each</span>
    </div>
    <div class="chart echart" id="u-chart"></div>
    <div class="table-wrap"><table id="usage"><thead></thead><tbody></tbody></table></div>`;
  const u = await api("GET", `/api/v1/cluster/usage?${q}`);
  const start = document.getElementById("u-start");
  const end = document.getElementById("u-end");
  start.value = u.start;
  end.value = u.end;
  const go = () => {
    const p = new URLSearchParams({ start: start.value, end: end.value,
                                    group_by: document.getElementById("u-group").value });
    location.hash = `#/usage?${p}`;
  };
  for (const el of [start, end, document.getElementById("u-group")]) el.addEventListener("change", go);
  document.getElementById("u-csv").href =
    `/api/v1/cluster/usage?${new URLSearchParams({ start: u.start, end: u.end, group_by: groupBy, format: "csv" })}`;

  // every day of the period, those without usage included, and the groups largest first
  const days = [];
  for (let d = new Date(`${u.start}T00:00:00Z`); d <= new Date(`${u.end}T00:00:00Z`);
       d = new Date(d.getTime() + 86400000)) days.push(d.toISOString().slice(0, 10));
  const label = (g) => g ?? "(none)";
  const groups = u.totals.map((t) => label(t.group));
  const cell = new Map(u.usage.map((r) => [`${r.day} ${label(r.group)}`, r.slot_hours]));
  const at = (day, g) => cell.get(`${day} ${g}`) || 0;

  const el = document.getElementById("u-chart");
  if (!u.usage.length) {
    el.innerHTML = '<span class="muted">No usage in this period.</span>';
  } else {
    const chart = echart(el, () => []);
    chart.setOption({
      animation: false, grid: { left: 60, right: 20, top: 40, bottom: 40 },
      legend: { type: "scroll", top: 0 },
      tooltip: { trigger: "axis", axisPointer: { type: "shadow" },
                 valueFormatter: (v) => `${fmt(v)} slot-hours` },
      xAxis: { type: "category", data: days },
      yAxis: { type: "value", name: "slot-hours" },
      series: groups.map((g) => ({ name: g, type: "bar", stack: "usage",
                                   data: days.map((d) => at(d, g)) })),
    });
  }
  const table = document.getElementById("usage");
  // by label a run counts in each of its labels: a sum over labels is no cluster total
  const sums = groupBy !== "label";
  const total = (xs) => xs.reduce((a, b) => a + b, 0);
  const num = (v) => `<td class="num">${v ? fmt(v) : ""}</td>`;
  table.querySelector("thead").innerHTML = `<tr><th>Day</th>${groups.map((g) =>
    `<th class="num">${esc(g)}</th>`).join("")}${sums ? '<th class="num">Total</th>' : ""}</tr>`;
  table.querySelector("tbody").innerHTML = days.map((d) => `<tr><td>${d}</td>${
    groups.map((g) => num(at(d, g))).join("")}${sums ? num(total(groups.map((g) => at(d, g)))) : ""}</tr>`).join("") +
    `<tr class="total"><th>Total</th>${u.totals.map((t) => `<th class="num">${fmt(t.slot_hours)}</th>`).join("")}${
      sums ? `<th class="num">${fmt(total(u.totals.map((t) => t.slot_hours)))}</th>` : ""}</tr>`;
}
