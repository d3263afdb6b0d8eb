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
