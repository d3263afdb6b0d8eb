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

// fmt, size and span: the one formatting rule of det's figures, the CLI's too (det.cli.output,
// whose docstring gives it; tests/test_format.py runs both over the same values). A number:
// an integral value below 1e15 as its digits, any other to 4 significant digits, in exponent
// form ("1.235e+4") where its exponent is below -4 or above 3; a boolean: yes or no.
function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v !== "number") return String(v);
  if (Number.isNaN(v)) return "nan";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
  // "1.500" -> "1.5": toExponential and toFixed keep trailing zeros, which say nothing.
  const trim = (s) => (s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s);
  const [mantissa, exp] = v.toExponential(3).split("e");
  const e = Number(exp);
  if (e < -4 || e > 3) return `${trim(mantissa)}e${e < 0 ? "-" : "+"}${Math.abs(e)}`;
  return trim(v.toFixed(3 - e));
}

// A size in bytes in the largest unit it reaches (powers of 1024): "117.7 MiB".
function size(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = bytes;
  let u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
  return `${fmt(v)} ${units[u]}`;
}

// Seconds as their two largest units, the second padded: "45s", "1m 05s", "2h 03m", "2d 04h"
// (whole seconds, rounded down; below 0, from clocks that differ a little, "0s").
function span(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const pad = (n) => String(n).padStart(2, "0");
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${pad(h)}h`;
  if (h) return `${h}h ${pad(m)}m`;
  return m ? `${m}m ${pad(s % 60)}s` : `${s % 60}s`;
}

function when(ts) {
  return ts ? new Date(ts).toLocaleString() : "";
}

function duration(start, end) {
  return start ? span(((end ? new Date(end) : new Date()) - new Date(start)) / 1000) : "";
}

function state(s) {
  return `<span class="state ${esc(s)}">${esc(s)}</span>`;
}

// The "● live" mark of an experiment's or trial's page, only while its state can still change
// (issue 34: an ended experiment's page said live).
const ENDED = new Set(["COMPLETED", "CANCELED", "ERROR"]);
function liveMark(s) {
  return ENDED.has(s) ? "" : '<span class="live">● live</span>';
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
    // status: a page tells an id that does not exist (404: its not-found page) from a failure
    throw Object.assign(new Error(data && data.error), { status: r.status });
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
  // Refused (EventSource gives up only on an HTTP error, retrying a dropped connection): a
  // 404 is an id that does not exist, or that the user may not see, and shows the not-found
  // page with the server's message (issue 34: #/experiments/999 was an empty skeleton).
  es.addEventListener("error", () => {
    if (es.readyState !== EventSource.CLOSED) return;
    fetch(path, { credentials: "same-origin" }).then(async (r) => {
      if (r.status === 404) notFoundPage((await r.json()).error);
    }).catch(() => {});
  });
  cleanup.push(() => es.close());
  return es;
}
