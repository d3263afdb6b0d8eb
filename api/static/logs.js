// The log viewer of a trial's page: its lines as they come (the page's event stream), a search
// box, level and rank filters, follow (stay at the newest line) and a download of the whole
// log (GET /api/v1/trials/ID/logs/download). Filters hide lines in the browser; the viewer
// keeps the newest MAX_LINES, the download has them all.
"use strict";

const LOG_LEVELS = { debug: 0, info: 1, warning: 2, error: 3 };

class LogViewer {
  static MAX_LINES = 10000;

  constructor(el, trialId) {
    el.innerHTML = `
      <div class="filters logbar">
        <input type="search" id="log-search" placeholder="search the lines" aria-label="search the log">
        <select id="log-level" aria-label="level">
          <option value="debug">all levels</option><option value="info">info and above</option>
          <option value="warning">warnings and errors</option><option value="error">errors</option>
        </select>
        <select id="log-rank" aria-label="rank"><option value="">all ranks</option></select>
        <label><input type="checkbox" id="log-follow" checked> follow</label>
        <a id="log-download" href="/api/v1/trials/${esc(trialId)}/logs/download" download>download</a>
        <span class="muted" id="log-count"></span>
      </div>
      <pre class="logs" id="logs"></pre>`;
    this.pre = el.querySelector("#logs");
    this.search = el.querySelector("#log-search");
    this.level = el.querySelector("#log-level");
    this.rank = el.querySelector("#log-rank");
    this.follow = el.querySelector("#log-follow");
    this.count = el.querySelector("#log-count");
    this.lines = [];  // {id, row, el}
    this.seen = new Set();
    this.ranks = new Set();
    for (const input of [this.search, this.level, this.rank]) {
      input.addEventListener("input", () => this.refilter());
    }
    this.follow.addEventListener("change", () => { if (this.follow.checked) this.toEnd(); });
    // Scrolling up to read stops following; scrolling back to the end follows again.
    this.pre.addEventListener("scroll", () => {
      const atEnd = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 5;
      if (this.follow.checked !== atEnd) this.follow.checked = atEnd;
    });
  }

  // The text det shows before a line (det.queries.trials.line_prefix's, the CLI's).
  static prefix(row) {
    const has = (v) => v !== null && v !== undefined;
    return (has(row.run) ? `[run ${row.run}] ` : "") + (has(row.rank) ? `[rank=${row.rank}] ` : "") +
      (row.stream === "det" ? "[det] " : "");
  }

  // New rows (the API's or the event stream's), each shown once, in id order.
  add(rows) {
    const fresh = rows.filter((r) => !this.seen.has(r.id)).sort((a, b) => a.id - b.id);
    if (!fresh.length) return;
    const frag = document.createDocumentFragment();
    for (const row of fresh) {
      this.seen.add(row.id);
      const line = document.createElement("div");
      line.className = `logline level-${row.level || "info"}`;
      line.title = row.ts ? new Date(row.ts).toISOString() : "";
      const pre = document.createElement("span");
      pre.className = "logprefix";
      pre.textContent = LogViewer.prefix(row);
      line.append(pre, document.createTextNode(row.line));
      const entry = { id: row.id, row, el: line, text: (LogViewer.prefix(row) + row.line).toLowerCase() };
      line.hidden = !this.shows(entry);
      this.lines.push(entry);
      frag.append(line);
      if (row.rank !== null && row.rank !== undefined && !this.ranks.has(row.rank)) {
        this.ranks.add(row.rank);
        this.rankOptions();
      }
    }
    this.pre.append(frag);
    while (this.lines.length > LogViewer.MAX_LINES) this.lines.shift().el.remove();
    this.counted();
    if (this.follow.checked) this.toEnd();
  }

  rankOptions() {
    const cur = this.rank.value;
    const ranks = [...this.ranks].sort((a, b) => a - b);
    this.rank.innerHTML = `<option value="">all ranks</option>` +
      ranks.map((r) => `<option value="${r}">rank ${r}</option>`).join("") +
      `<option value="none">no rank (det, launcher)</option>`;
    this.rank.value = cur;
  }

  shows(entry) {
    const q = this.search.value.trim().toLowerCase();
    if (q && !entry.text.includes(q)) return false;
    if ((LOG_LEVELS[entry.row.level] ?? 1) < LOG_LEVELS[this.level.value]) return false;
    const rank = this.rank.value;
    if (rank === "none") return entry.row.rank === null || entry.row.rank === undefined;
    return rank === "" || String(entry.row.rank) === rank;
  }

  refilter() {
    for (const entry of this.lines) entry.el.hidden = !this.shows(entry);
    this.counted();
    if (this.follow.checked) this.toEnd();
  }

  counted() {
    const shown = this.lines.filter((e) => !e.el.hidden).length;
    this.count.textContent = shown === this.lines.length ? `${shown} lines`
      : `${shown} of ${this.lines.length} lines`;
  }

  toEnd() { this.pre.scrollTop = this.pre.scrollHeight; }
}
