"use strict";

// --- charts: learning curves in uPlot; hyperparameter scatter and parallel coordinates in
// ECharts (both vendored). --------------------------------------------------------------------

const COLORS = ["#2f6fde", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d",
                "#5c940d", "#d9480f", "#364fc7"];

// What the harness adds to every validation row to say where it was taken: progress, not a
// metric (harness/trainer.py's validate), so never offered as one.
const PROGRESS_KEYS = new Set(["batches", "epochs"]);

const X_AXES = { batches: "batches", epochs: "epochs", time: "seconds since the first report" };

// One label per tick, with the fewest significant digits that say each tick's value (to a
// millionth of the step between ticks): 0.0012 and 0.0014 read "0.0012 0.0014", not
// "0.001 0.001"; 102.5 reads "102.5", not "103".
function tickLabels(ticks) {
  const show = (v, p) => {
    if (typeof v !== "number") return "";
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1e5 || a < 1e-3 ? v.toExponential(p - 1) : String(Number(v.toPrecision(p)));
  };
  const nums = ticks.filter((v) => typeof v === "number");
  const gaps = nums.slice(1).map((v, i) => Math.abs(v - nums[i])).filter((g) => g > 0);
  const tol = (gaps.length ? Math.min(...gaps) : Math.max(...nums.map(Math.abs), 1e-300)) * 1e-6;
  for (let p = 1; p <= 15; p++) {
    const labels = ticks.map((v) => show(v, p));
    if (ticks.every((v, i) => typeof v !== "number" || Math.abs(Number(labels[i]) - v) <= tol)) {
      return labels;
    }
  }
  return ticks.map((v) => show(v, 15));
}

// The [min, max] an axis shows for values from lo to hi, `pad` (a fraction of the span)
// beyond them: a lone value (lo === hi) gets a span around it (10 % of it, or ±1 around 0;
// a decade on a log axis), not 0 to 1.5.
function axisRange(lo, hi, log, pad = 0) {
  if (log) return lo === hi ? [lo / Math.sqrt(10), hi * Math.sqrt(10)] : [lo, hi];
  if (lo !== hi) return [lo - (hi - lo) * pad, hi + (hi - lo) * pad];
  const around = Math.abs(lo) * 0.1 || 1;
  return [lo - around, hi + around];
}

// TensorBoard's smoothing: an exponential moving average with weight w (0: none, 0.99:
// heavy), debiased so that the first points are not pulled towards 0
// (tensorboard/webapp/widgets/line_chart_v2/lib/data_transformer.ts).
function smooth(ys, w) {
  if (!w) return ys;
  let last = 0;
  let n = 0;
  return ys.map((y) => {
    if (typeof y !== "number" || !Number.isFinite(y)) return y;
    last = last * w + (1 - w) * y;
    n += 1;
    return last / (1 - Math.pow(w, n));
  });
}

// Leaves of a nested map as [dotted name, value] ({model: {dropout: 0.1}} gives
// ["model.dropout", 0.1]): a trial's hparams, or, with isLeaf = (v) => "type" in v, the
// config's hyperparameters section (a map with a "type" key defines one hyperparameter).
function flatHparams(obj, isLeaf = () => false, prefix = "") {
  const out = [];
  for (const [k, v] of Object.entries(obj || {})) {
    const name = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v) && !isLeaf(v)) {
      out.push(...flatHparams(v, isLeaf, name));
    } else {
      out.push([name, v]);
    }
  }
  return out;
}

// The experiment's hyperparameters as [{name, type, values}] (type from the config's
// hyperparameters section: const, int, double, log, categorical), with each trial's value
// in `values` (trial order): what the scatter and parallel coordinates draw.
function hparamColumns(exp, trials) {
  const defs = new Map(flatHparams((exp && exp.config && exp.config.hyperparameters) || {},
                                   (v) => "type" in v));
  const names = [...new Set(trials.flatMap((t) => flatHparams(t.hparams).map(([k]) => k)))].sort();
  return names.map((name) => {
    const def = defs.get(name);
    const values = trials.map((t) => new Map(flatHparams(t.hparams)).get(name));
    const numeric = values.every((v) => v === undefined || typeof v === "number");
    const type = def && typeof def === "object" && def.type ? def.type : (numeric ? "double" : "categorical");
    return { name, type: numeric ? type : "categorical", values };
  });
}

// A line chart of several series: `series` is [{label, points: Map(x -> y), color?}]; options
// xLabel (default batches), logY, smoothing (0 to 0.99).
class LineChart {
  constructor(el, title) {
    this.el = el;
    this.title = title;
    this.plot = null;
    this.labels = "";
    cleanup.push(() => this.plot && this.plot.destroy());
  }

  update(series, yLabel, opts = {}) {
    const xLabel = opts.xLabel || "batches";
    const w = opts.smoothing || 0;
    // A log axis cannot place 0 or a negative value: those points are left out.
    const keep = (y) => (opts.logY && !(y > 0) ? null : y);
    const xs = [...new Set(series.flatMap((s) => [...s.points.keys()]))].sort((a, b) => a - b);
    const raw = series.map((s) => xs.map((x) => (s.points.has(x) ? keep(s.points.get(x)) : null)));
    const lines = [];
    raw.forEach((ys, i) => {
      const color = series[i].color || COLORS[i % COLORS.length];
      if (w) lines.push({ label: `${series[i].label} (raw)`, stroke: `${color}40`, ys });
      lines.push({ label: series[i].label, stroke: color, ys: smooth(ys, w) });
    });
    const data = [xs, ...lines.map((l) => l.ys)];
    const labels = [lines.map((l) => l.label).join("|"), yLabel, xLabel, !!opts.logY].join("|");
    // How many points are drawn: read by tests/test_webui.py to see a live chart grow.
    this.el.dataset.points = String(raw.flat().filter((v) => v !== null).length);
    if (this.plot && labels === this.labels) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.labels = labels;
    this.el.innerHTML = "";
    const width = Math.max(360, this.el.clientWidth - 20);
    const values = (u, ticks) => tickLabels(ticks);
    this.plot = new uPlot({
      title: this.title, width, height: 280,
      scales: {
        x: { time: false, range: (u, lo, hi) => axisRange(lo, hi, false) },
        y: opts.logY ? { distr: 3, log: 10, range: (u, lo, hi) => axisRange(lo, hi, true) }
          : { range: (u, lo, hi) => axisRange(lo, hi, false, 0.05) },
      },
      axes: [{ label: xLabel, values }, { label: yLabel + (opts.logY ? " (log)" : ""), size: 70, values }],
      series: [{ label: xLabel }, ...lines.map((l) => ({
        label: l.label, stroke: l.stroke, width: 1.5, spanGaps: true,
        points: { show: xs.length < 60 } }))],
      // The axes as drawn (on a canvas, which tests cannot read).
      hooks: { setScale: [(u, key) => {
        this.el.dataset[`${key}range`] = `${u.scales[key].min} ${u.scales[key].max}`;
      }] },
    }, data, this.el);
    this.el.dataset.xlabel = xLabel;
  }
}

// ECharts' tooltip as plain text lines (its default markers carry style attributes, which
// det's CSP refuses).
function tipText(lines) {
  return lines.map(esc).join("<br>");
}

// An ECharts chart in `el`, disposed of with the page; a click on a trial's point or line
// opens the trial's page.
function echart(el, trialIds) {
  el.innerHTML = "";
  const chart = echarts.init(el, null, { renderer: "canvas" });
  chart.on("click", (p) => {
    const id = trialIds()[p.dataIndex];
    if (id !== undefined) location.hash = `#/trials/${id}`;
  });
  const resize = () => chart.resize();
  window.addEventListener("resize", resize);
  cleanup.push(() => { window.removeEventListener("resize", resize); if (!chart.isDisposed()) chart.dispose(); });
  return chart;
}

// Says `msg` in `el` in place of its chart (disposed of); returns null, the chart's new value.
function noChart(el, chart, msg) {
  if (chart) chart.dispose();
  el.innerHTML = `<span class="muted">${esc(msg)}</span>`;
  return null;
}

// An ECharts axis over `values`: a `log` hyperparameter's on a log axis (ECharts rounds it
// out to whole decades and ticks each power of ten, so no two labels are alike); any other
// from ECharts' own round bounds; a lone value's around it (axisRange).
function valueAxis(name, type, values) {
  const nums = values.filter((v) => typeof v === "number" && (type !== "log" || v > 0));
  const lo = Math.min(...nums);
  const hi = Math.max(...nums);
  const axis = { name, nameGap: 28 };
  if (type === "log") {
    const [min, max] = nums.length && lo === hi ? axisRange(lo, hi, true) : [undefined, undefined];
    return { ...axis, type: "log", logBase: 10, min, max,
             axisLabel: { formatter: (v) => tickLabels([v])[0] } };
  }
  if (nums.length && lo === hi) {
    const [min, max] = axisRange(lo, hi, false);
    return { ...axis, type: "value", min, max };
  }
  return { ...axis, type: "value", scale: true };
}

// A scatter of one hyperparameter against the best metric, one point per trial: a `log`
// hyperparameter on a log axis; hover names the trial, a click opens it.
class ScatterChart {
  constructor(el) {
    this.el = el;
    this.ids = [];
    this.chart = null;
  }

  update(trials, hp, yLabel) {
    const pts = trials.map((t, i) => [hp.values[i], t.best_validation, t.id])
      .filter((p) => typeof p[0] === "number" && typeof p[1] === "number" && (hp.type !== "log" || p[0] > 0));
    this.el.dataset.points = String(pts.length);
    this.el.dataset.xaxis = hp.type === "log" ? "log" : "value";
    if (!pts.length) {
      this.chart = noChart(this.el, this.chart, "no trial has both yet");
      return;
    }
    this.ids = pts.map((p) => p[2]);
    if (!this.chart) this.chart = echart(this.el, () => this.ids);
    this.chart.setOption({
      animation: false,
      grid: { left: 70, right: 30, top: 30, bottom: 50 },
      tooltip: { trigger: "item", formatter: (p) => tipText([
        `trial ${p.data[2]} (click to open)`, `${hp.name}: ${fmt(p.data[0])}`, `${yLabel}: ${fmt(p.data[1])}`]) },
      xAxis: { ...valueAxis(hp.name + (hp.type === "log" ? " (log)" : ""), hp.type, pts.map((p) => p[0])),
               nameLocation: "middle" },
      yAxis: { ...valueAxis(yLabel, "double", pts.map((p) => p[1])), nameLocation: "middle", nameGap: 55 },
      series: [{ type: "scatter", symbolSize: 10, itemStyle: { color: COLORS[0] }, data: pts, cursor: "pointer" }],
    }, true);
  }
}

// Parallel coordinates: one axis per hyperparameter (log for `log` ones, a category axis
// for categorical ones) and one for the metric, one line per trial coloured by the metric;
// drag along an axis to keep a range, hover names the trial, a click opens it.
class ParallelChart {
  constructor(el) {
    this.el = el;
    this.ids = [];
    this.chart = null;
  }

  update(trials, hps, metric, smallerIsBetter) {
    const rows = trials.map((t, i) => [...hps.map((h) => h.values[i]), t.best_validation, t.id])
      .filter((r) => typeof r[hps.length] === "number");
    this.el.dataset.lines = String(rows.length);
    this.el.dataset.axes = hps.map((h) => `${h.name}:${h.type === "log" ? "log" : h.type === "categorical" ? "category" : "value"}`).join(",");
    if (!rows.length) {
      this.chart = noChart(this.el, this.chart, "no trial has a validation metric yet");
      return;
    }
    this.ids = rows.map((r) => r[r.length - 1]);
    if (!this.chart) this.chart = echart(this.el, () => this.ids);
    const axes = hps.map((h, i) => {
      if (h.type === "categorical") {
        const cats = [...new Set(rows.map((r) => String(r[i])))];
        rows.forEach((r) => { r[i] = String(r[i]); });
        return { dim: i, name: h.name, type: "category", data: cats };
      }
      return { dim: i, ...valueAxis(h.name, h.type, rows.map((r) => r[i])) };
    });
    const metrics = rows.map((r) => r[hps.length]);
    axes.push({ dim: hps.length, ...valueAxis(metric, "double", metrics), nameTextStyle: { fontWeight: "bold" } });
    const lo = Math.min(...metrics);
    const hi = Math.max(...metrics);
    this.chart.setOption({
      animation: false,
      parallel: { left: 60, right: 90, top: 40, bottom: 30 },
      parallelAxis: axes,
      tooltip: { trigger: "item", formatter: (p) => tipText([
        `trial ${p.data[p.data.length - 1]} (click to open)`,
        ...hps.map((h, i) => `${h.name}: ${fmt(p.data[i])}`), `${metric}: ${fmt(p.data[hps.length])}`]) },
      // Best trials in the darkest blue.
      visualMap: { show: false, dimension: hps.length, min: lo, max: hi === lo ? lo + 1 : hi,
                   inRange: { color: smallerIsBetter ? ["#1c3f94", "#a5c0f3"] : ["#a5c0f3", "#1c3f94"] } },
      series: [{ type: "parallel", lineStyle: { width: 2, opacity: 0.8 }, data: rows,
                 emphasis: { lineStyle: { width: 4 } }, cursor: "pointer" }],
    }, true);
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

  // The metrics reported in `group` (all groups if none), without the progress keys.
  names(group) {
    const names = new Set();
    for (const [key, rows] of this.rows) {
      if (group && !key.endsWith(`/${group}`)) continue;
      for (const r of rows) {
        for (const [k, v] of Object.entries(r.values)) {
          if (typeof v === "number" && !PROGRESS_KEYS.has(k)) names.add(k);
        }
      }
    }
    return [...names].sort();
  }

  // Where a row of trial t lies on the x axis: batches; epochs (the harness reports the
  // epochs completed with each report, as 0.38.1 does, so a trial's rows are placed by its
  // batches per epoch, read from its latest row past an epoch; none before one); or seconds
  // since its first report.
  xOf(t, x) {
    const all = [...this.rows.entries()].filter(([k]) => k.startsWith(`${t}/`)).flatMap(([, r]) => r);
    if (x === "epochs") {
      const r = all.filter((row) => typeof row.values.epochs === "number" && row.values.epochs > 0)
        .reduce((a, b) => (a && a.steps_completed >= b.steps_completed ? a : b), null);
      if (!r) return () => null;
      const perBatch = r.values.epochs / r.steps_completed;
      return (row) => row.steps_completed * perBatch;
    }
    if (x === "time") {
      const t0 = Math.min(...all.filter((row) => row.reported_at).map((row) => Date.parse(row.reported_at)));
      return (row) => (row.reported_at ? (Date.parse(row.reported_at) - t0) / 1000 : null);
    }
    return (row) => row.steps_completed;
  }

  series(trialIds, group, metric, x = "batches", label = (t) => `trial ${t}`) {
    return trialIds.map((t) => {
      const at = this.xOf(t, x);
      const points = new Map();
      for (const r of this.rows.get(`${t}/${group}`) || []) {
        const v = r.values[metric];
        const px = at(r);
        if (typeof v === "number" && px !== null) points.set(px, v);
      }
      return { label: label(t), points };
    });
  }
}

// The learning-curve controls (group unless withGroup is false, metric, x axis, log scale,
// smoothing) as HTML; their values are read by curveOptions.
function curveControls(withGroup = true) {
  return `
    ${withGroup ? `<select id="group" aria-label="group"><option>validation</option><option>training</option></select>` : ""}
    <select id="metric" aria-label="metric"></select>
    <label>x <select id="xaxis">${Object.keys(X_AXES).map((k) => `<option value="${k}">${k === "time" ? "wall time" : k}</option>`).join("")}</select></label>
    <label><input type="checkbox" id="logy"> log scale</label>
    <label>smoothing <input type="range" id="smoothing" min="0" max="0.99" step="0.01" value="0"></label>
    <span id="smoothing-value" class="muted">0</span>`;
}

function curveOptions() {
  const s = Number(document.getElementById("smoothing").value);
  document.getElementById("smoothing-value").textContent = s.toFixed(2);
  const x = document.getElementById("xaxis").value;
  return { x, xLabel: X_AXES[x], logY: document.getElementById("logy").checked, smoothing: s };
}

// Calls `redraw` whenever one of the curve controls changes.
function bindCurveControls(redraw) {
  for (const id of ["group", "metric", "xaxis", "logy"]) {
    const el = document.getElementById(id);
    if (el) el.addEventListener("change", redraw);
  }
  document.getElementById("smoothing").addEventListener("input", redraw);
}
