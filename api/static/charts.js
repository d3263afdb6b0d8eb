"use strict";

// --- charts (uPlot, vendored) -----------------------------------------------------------------

const COLORS = ["#2f6fde", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d",
                "#5c940d", "#d9480f", "#364fc7"];

// A line chart of several series over batches: `series` is [{label, points: Map(x -> y)}].
class LineChart {
  constructor(el, title) {
    this.el = el;
    this.title = title;
    this.plot = null;
    this.labels = "";
    cleanup.push(() => this.plot && this.plot.destroy());
  }

  update(series, yLabel) {
    const xs = [...new Set(series.flatMap((s) => [...s.points.keys()]))].sort((a, b) => a - b);
    const data = [xs, ...series.map((s) => xs.map((x) => s.points.has(x) ? s.points.get(x) : null))];
    const labels = series.map((s) => s.label).join("|") + "|" + yLabel;
    // How many points are drawn: read by tests/test_webui.py to see a live chart grow.
    this.el.dataset.points = String(data.slice(1).flat().filter((v) => v !== null).length);
    if (this.plot && labels === this.labels) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.labels = labels;
    this.el.innerHTML = "";
    const width = Math.max(360, this.el.clientWidth - 20);
    this.plot = new uPlot({
      title: this.title, width, height: 280,
      scales: { x: { time: false } },
      axes: [{ label: "batches" }, { label: yLabel, size: 70 }],
      series: [{ label: "batches" }, ...series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
        points: { show: xs.length < 60 } }))],
    }, data, this.el);
  }
}

// A scatter chart of hyperparameter value vs metric, one point per trial.
class ScatterChart {
  constructor(el) {
    this.el = el;
    this.plot = null;
    cleanup.push(() => this.plot && this.plot.destroy());
  }

  update(points, xLabel, yLabel) {
    points = points.filter((p) => typeof p[0] === "number" && typeof p[1] === "number")
                   .sort((a, b) => a[0] - b[0]);
    if (this.plot) this.plot.destroy();
    this.el.innerHTML = points.length ? "" : `<span class="muted">no trial has both yet</span>`;
    if (!points.length) return;
    this.plot = new uPlot({
      title: `${yLabel} by ${xLabel}`, width: Math.max(360, this.el.clientWidth - 20), height: 240,
      scales: { x: { time: false } },
      axes: [{ label: xLabel }, { label: yLabel, size: 70 }],
      series: [{ label: xLabel }, { label: yLabel, stroke: "#2f6fde", width: 0,
                                    points: { show: true, size: 8 } }],
    }, [points.map((p) => p[0]), points.map((p) => p[1])], this.el);
  }
}

// Metrics rows kept per trial and group, merged by id (history from REST, then the stream).
class MetricStore {
  constructor() { this.rows = new Map(); this.seen = new Set(); }

  add(trialId, group, rows) {
    const key = `${trialId}/${group}`;
    if (!this.rows.has(key)) this.rows.set(key, []);
    for (const r of rows) {
      if (this.seen.has(r.id)) continue;
      this.seen.add(r.id);
      this.rows.get(key).push(r);
    }
  }

  names(group) {
    const names = new Set();
    for (const [key, rows] of this.rows) {
      if (group && !key.endsWith(`/${group}`)) continue;
      for (const r of rows) {
        for (const [k, v] of Object.entries(r.values)) if (typeof v === "number") names.add(k);
      }
    }
    return [...names].sort();
  }

  series(trialIds, group, metric) {
    return trialIds.map((t) => {
      const points = new Map();
      for (const r of this.rows.get(`${t}/${group}`) || []) {
        const v = r.values[metric];
        if (typeof v === "number") points.set(r.steps_completed, v);
      }
      return { label: `trial ${t}`, points };
    });
  }
}
