"""The WebUI's charts in a real headless Chromium (as tests/test_webui.py) against ``det serve``
and trials whose metrics are reported through det's own functions (det_task.report_metrics), as a
harness reports them (issue 34): a `log` hyperparameter on a log axis with tick labels that
do not repeat, hover naming the trial and a click opening it, parallel coordinates over every
hyperparameter, learning curves with smoothing, log scale and x = batches / epochs / wall
time (on the experiment's page and a trial's), metric choices without `batches` and `epochs`,
a lone point's axis, and the compare view (overlaid curves, a table of hyperparameters and
best metrics). Screenshots go where
test_webui's ``shot`` puts them."""

import math
from pathlib import Path

from conftest import wait_for
from psycopg.types.json import Jsonb
from test_api import Server, create
from test_webui import browser, click, shot, text  # noqa: F401  (browser: the fixture)
from test_webui_tasks import login

SEARCH = """
name: {name}
entrypoint: model_def:MyTrial
hyperparameters:
  lr: {{type: log, minval: -4, maxval: -2, base: 10}}
  hidden: {{type: int, minval: 32, maxval: 256}}
  optimizer: {{type: categorical, vals: [sgd, adam]}}
  model: {{dropout: {{type: double, minval: 0.0, maxval: 0.5}}}}
  global_batch_size: 32
searcher:
  name: random
  metric: accuracy
  smaller_is_better: false
  max_trials: 5
  max_length: {{batches: 100}}
"""

# Close learning rates: a linear axis with 1 to 3 digits labels them 0.001 0.001 0.002 ...
LRS = [0.00012, 0.00035, 0.0011, 0.0014, 0.0027]


def add_trials(conn, exp: int, hparams: list[dict], first_slot: int) -> list[int]:
    """Give the experiment one trial per hparams with a live run on agent a1 (as the
    reconciler and an agent would), each reporting training loss every 10 batches to 100
    and validation (accuracy, with the harness's batches and epochs: 25 batches an epoch) at
    50 and 100; the i-th trial's accuracy is 0.5 + 0.1 i. Returns the trial ids."""
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": s, "type": "cpu"} for s in range(16)]),))
    ids = []
    for i, hp in enumerate(hparams):
        trial = conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                             "VALUES (%s, gen_random_uuid(), %s, 0) RETURNING id",
                             (exp, Jsonb(hp))).fetchone()["id"]
        alloc = conn.execute(
            "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec,"
            " state, agent_id) SELECT job_id, %s, 1, 'default', 1, '{}', 'ASSIGNED', 'a1' "
            "FROM experiments WHERE id = %s RETURNING id", (trial, exp)).fetchone()["id"]
        conn.execute("INSERT INTO allocation_slots (allocation_id, agent_id, slot_id) "
                     "VALUES (%s, 'a1', %s)", (alloc, first_slot + i))
        token = conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]
        conn.execute("SELECT det_task.info(%s)", (token,))
        for step in range(10, 101, 10):
            conn.execute("SELECT det_task.report_metrics(%s, 'training', %s, %s)",
                         (token, step, Jsonb({"loss": (1 + i) / step})))
        for step in (50, 100):
            conn.execute("SELECT det_task.report_metrics(%s, 'validation', %s, %s)",
                         (token, step, Jsonb({"accuracy": 0.5 + 0.1 * i - (0.05 if step == 50
                                                                           else 0),
                                              "val_loss": 1.0 / (i + 1),
                                              "batches": step, "epochs": step / 25})))
        ids.append(trial)
    return ids


def hparams(i: int) -> dict:
    return {"lr": LRS[i], "hidden": 32 + 40 * i, "optimizer": ["sgd", "adam"][i % 2],
            "model": {"dropout": 0.1 * i}, "global_batch_size": 32}


def data(page, css: str, key: str) -> str | None:
    """``dataset[key]`` of the element matching ``css`` (None while the page has none)."""
    return page.execute_script(
        "const e = document.querySelector(arguments[0]);"
        "return e ? e.dataset[arguments[1]] : null;", css, key)


def hover(page, css: str, point: list[float]) -> None:
    """Move the mouse to ``point`` (pixels from the top left) of the chart in ``css``."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    canvas = page.find_element(By.CSS_SELECTOR, f"{css} canvas")
    page.execute_script("arguments[0].scrollIntoView({block: 'center'});", canvas)
    size = canvas.size
    ActionChains(page).move_to_element_with_offset(
        canvas, int(point[0] - size["width"] / 2), int(point[1] - size["height"] / 2)).perform()


def js(page, script: str, *args):
    return page.execute_script(script, *args)


def chart_js(page, css: str, body: str, *args):
    """Run ``body`` with ``c``, the ECharts instance drawn in ``css``, and ``args`` as
    arguments[1:]."""
    return js(page, "const c = echarts.getInstanceByDom(document.querySelector(arguments[0]));"
                    + body, css, *args)


def test_hyperparameter_charts_and_learning_curves(browser, det_env, ctx: Path, conn,  # noqa: F811
                                                   tmp_path: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    server = Server(det_env, tmp_path)
    try:
        exp = create(server.client, ctx, SEARCH.format(name="charts"))
        trials = add_trials(conn, exp, [hparams(i) for i in range(5)], 0)
        login(browser, server)
        browser.get(f"{server.url}/ui/#/experiments/{exp}")
        wait_for(lambda: data(browser, "#parcoords", "lines") == "5", 30,
                 "parallel coordinates with a line per trial")

        # Parallel coordinates: an axis per hyperparameter that varies (the constant batch
        # size left out), log for the log one, a category axis for the categorical one, and
        # the searcher metric last.
        axes = data(browser, "#parcoords", "axes")
        assert axes.split(",") == ["hidden:value", "lr:log", "model.dropout:value",
                                   "optimizer:category"]
        kinds = chart_js(browser, "#parcoords", "return [0, 1, 2, 3, 4].map("
                         "  (i) => c.getModel().getComponent('parallelAxis', i).axis.type);")
        assert kinds == ["value", "log", "value", "category", "value"]
        # Hover halfway along trial 3's line between the hidden and lr axes (both grow with
        # the trial, so no line crosses another there) names it; a click opens it.
        ends = chart_js(browser, "#parcoords",
                        "const s = c.getModel().getSeriesByIndex(0);"
                        "const d = c.getOption().series[0].data[3];"
                        "return [0, 1].map("
                        "  (i) => s.coordinateSystem.dataToPoint(d[i], `dim${i}`));")
        hover(browser, "#parcoords", [(ends[0][k] + ends[1][k]) / 2 for k in (0, 1)])
        tip = wait_for(lambda: "trial" in text(browser, "#parcoords") and
                       text(browser, "#parcoords"), 10, "the parallel coordinates' tooltip")
        assert f"trial {trials[3]}" in tip and "lr: 0.0014" in tip and "optimizer: adam" in tip
        shot(browser, "charts-parallel")
        ActionChains(browser).click().perform()
        wait_for(lambda: js(browser, "return location.hash") == f"#/trials/{trials[3]}", 10,
                 "the click on a line to open the trial's page")
        browser.back()
        wait_for(lambda: data(browser, "#scatter", "points") == "5", 30, "the scatter")

        # The scatter of lr (a log hyperparameter) against the best accuracy: a log axis whose
        # labels are distinct powers of ten.
        assert js(browser, "return document.getElementById('hp').value") == "hidden"
        js(browser, "const h = document.getElementById('hp'); h.value = 'lr';"
                    "h.dispatchEvent(new Event('change'));")
        assert data(browser, "#scatter", "xaxis") == "log"
        labels = chart_js(browser, "#scatter", "return c.getModel().getComponent('xAxis')"
                                               ".axis.getViewLabels().map(l => l.formattedLabel);")
        assert labels and len(set(labels)) == len(labels), labels
        assert all(math.log10(float(v)).is_integer() for v in labels), labels
        # Tick labels keep the digits that tell neighbours apart (what a linear axis over
        # these rates would print).
        assert js(browser, "return tickLabels([0.0012, 0.0014, 0.0016, 0.0018])") == \
            ["0.0012", "0.0014", "0.0016", "0.0018"]
        assert js(browser, "return tickLabels([0, 0.5, 1, 1.5])") == ["0", "0.5", "1", "1.5"]
        assert js(browser, "return tickLabels([97.5, 100, 102.5])") == ["97.5", "100", "102.5"]

        # Hover over trial 2's point names it; a click opens its page.
        point = chart_js(browser, "#scatter",
                         "const d = c.getOption().series[0].data.find(p => p[2] === arguments[1]);"
                         "return c.convertToPixel({seriesIndex: 0}, [d[0], d[1]]);", trials[2])
        hover(browser, "#scatter", point)
        tip = wait_for(lambda: f"trial {trials[2]}" in text(browser, "#scatter") and
                       text(browser, "#scatter"), 10, "the scatter's tooltip naming the trial")
        assert "lr: 0.0011" in tip and "best accuracy: 0.7" in tip, tip
        shot(browser, "charts-scatter-hover")
        ActionChains(browser).click().perform()
        wait_for(lambda: js(browser, "return location.hash") == f"#/trials/{trials[2]}", 10,
                 "the click to open the trial's page")

        # The trial's page: its training and validation curves, with the same x choices.
        wait_for(lambda: data(browser, "#chart", "points") == "2", 30,
                 "the trial's accuracy (2 validations)")
        assert js(browser, "return [...document.querySelectorAll('#metric option')]"
                           ".map(o => o.value)") == ["accuracy", "loss", "val_loss"]
        js(browser, "const x = document.getElementById('xaxis'); x.value = 'epochs';"
                    "x.dispatchEvent(new Event('change'));")
        wait_for(lambda: data(browser, "#chart", "xlabel") == "epochs", 10, "x in epochs")
        shot(browser, "charts-trial")

        # Learning curves: metrics only, never batches or epochs; x in epochs; smoothing
        # draws the smoothed curve over the faded raw one; a log scale.
        browser.get(f"{server.url}/ui/#/experiments/{exp}")
        wait_for(lambda: data(browser, "#curves", "points") == "10", 30,
                 "the validation curves (2 points x 5 trials)")
        options = js(browser, "return [...document.querySelectorAll('#metric option')]"
                              ".map(o => o.value)")
        assert options == ["accuracy", "val_loss"]
        js(browser, "const g = document.getElementById('group'); g.value = 'training';"
                    "g.dispatchEvent(new Event('change'));")
        wait_for(lambda: data(browser, "#curves", "points") == "50", 10, "the training curves")
        assert js(browser, "return document.getElementById('metric').value") == "loss"
        assert data(browser, "#curves", "xrange") == "10 100"
        js(browser, "const x = document.getElementById('xaxis'); x.value = 'epochs';"
                    "x.dispatchEvent(new Event('change'));")
        wait_for(lambda: data(browser, "#curves", "xlabel") == "epochs", 10, "x in epochs")
        lo, hi = map(float, data(browser, "#curves", "xrange").split())
        assert (round(lo, 9), round(hi, 9)) == (0.4, 4)  # 10 to 100 batches, 25 an epoch
        # a linear axis pads below the least loss, 0.01
        assert float(data(browser, "#curves", "yrange").split()[0]) < 0
        js(browser, "const s = document.getElementById('smoothing'); s.value = '0.6';"
                    "s.dispatchEvent(new Event('input'));"
                    "const l = document.getElementById('logy'); l.checked = true;"
                    "l.dispatchEvent(new Event('change'));")
        legend = wait_for(lambda: "(raw)" in text(browser, "#curves .u-legend") and
                          text(browser, "#curves .u-legend"), 10, "smoothed and raw curves")
        assert f"trial {trials[0]} (raw)" in legend
        lo, hi = map(float, data(browser, "#curves", "yrange").split())
        assert (lo, hi) == (0.01, 0.5)  # a log axis: from the least loss to the greatest
        assert text(browser, "#smoothing-value") == "0.60"
        assert js(browser, "return smooth([2, 2, 2], 0.9)") == [2, 2, 2]  # debiased
        js(browser, "const x = document.getElementById('xaxis'); x.value = 'time';"
                    "x.dispatchEvent(new Event('change'));")
        wait_for(lambda: data(browser, "#curves", "xlabel") == "seconds since the first report",
                 10, "x in wall time")
        shot(browser, "charts-curves")
        log = [e["message"] for e in browser.get_log("browser")]
        assert not [m for m in log if "Content Security Policy" in m], log
    finally:
        server.stop()


def test_a_lone_point_gets_an_axis_around_it(browser, det_env, ctx: Path, conn,  # noqa: F811
                                             tmp_path: Path) -> None:
    server = Server(det_env, tmp_path)
    try:
        exp = create(server.client, ctx, SEARCH.format(name="lone"))
        [trial] = add_trials(conn, exp, [hparams(0)], 0)
        conn.execute("DELETE FROM metrics WHERE trial_id = %s AND steps_completed <> 100 "
                     "AND \"group\" = 'validation'", (trial,))
        login(browser, server)
        browser.get(f"{server.url}/ui/#/experiments/{exp}")
        wait_for(lambda: data(browser, "#curves", "points") == "1", 30, "the one validation point")
        lo, hi = map(float, data(browser, "#curves", "yrange").split())
        # accuracy 0.5 alone: 0.45 to 0.55, not 0 to 1.5
        assert (round(lo, 6), round(hi, 6)) == (0.45, 0.55)
        lo, hi = map(float, data(browser, "#curves", "xrange").split())
        assert lo < 100 < hi  # uPlot's own span around a lone x (0 to 200)
        shot(browser, "charts-lone-point")
    finally:
        server.stop()


def test_compare_experiments_and_trials(browser, det_env, ctx: Path, conn,  # noqa: F811
                                        tmp_path: Path) -> None:
    server = Server(det_env, tmp_path)
    try:
        a = create(server.client, ctx, SEARCH.format(name="compare-a"))
        b = create(server.client, ctx, SEARCH.format(name="compare-b"))
        ta = add_trials(conn, a, [hparams(i) for i in range(3)], 0)
        tb = add_trials(conn, b, [hparams(i) for i in (3, 4)], 3)
        login(browser, server)
        browser.get(f"{server.url}/ui/#/experiments")
        wait_for(lambda: "compare-b" in text(browser, "#exps tbody"), 20, "the list")
        assert js(browser, "return document.getElementById('compare-selected').disabled")
        click(browser, f"input[data-select='{a}']")
        click(browser, f"input[data-select='{b}']")
        click(browser, "#compare-selected")
        wait_for(lambda: js(browser, "return location.hash") == f"#/compare?experiments={a},{b}",
                 10, "the compare page's address")
        wait_for(lambda: js(browser, "return document.querySelectorAll("
                                     "'#compare-table tbody tr').length") == 5, 30,
                 "a row per trial of both experiments")
        head = text(browser, "#compare-table thead")
        for col in ("Trial", "Experiment", "Best", "lr", "hidden", "optimizer",
                    "model.dropout", "accuracy", "val_loss"):
            assert col in head, col
        assert "batches" not in head.split() and "epochs" not in head.split()
        row = text(browser, f"#compare-table tr[data-trial='{tb[1]}']")
        # best accuracy; hparams(4) (global_batch_size, hidden, lr, model.dropout, optimizer);
        # accuracy and val_loss at the best validation (b's second trial: 0.6 and 0.5)
        assert "compare-b" in row and row.split()[-9:] == [
            "0.6", "accuracy", "32", "192", "0.0027", "0.4", "sgd", "0.6", "0.5"], row
        legend = text(browser, "#compare-curves .u-legend")
        for t in ta:
            assert f"exp {a} trial {t}" in legend
        for t in tb:
            assert f"exp {b} trial {t}" in legend
        assert data(browser, "#compare-curves", "points") == "10"
        shot(browser, "compare-experiments")
        # Unticking a trial takes its curve off the chart.
        click(browser, f"input[data-show='{ta[0]}']")
        wait_for(lambda: data(browser, "#compare-curves", "points") == "8", 10,
                 "one trial's curve hidden")

        # Chosen trials only, of two experiments.
        browser.get(f"{server.url}/ui/#/compare?trials={ta[1]},{tb[0]}")
        wait_for(lambda: [int(r) for r in js(browser, "return [...document.querySelectorAll("
                 "'#compare-table tbody tr')].map(r => r.dataset.trial)")] == [ta[1], tb[0]],
                 30, "the two chosen trials")
        assert js(browser, "return document.querySelector('#compare-form [name=trials]').value"
                  ) == f"{ta[1]},{tb[0]}"
        shot(browser, "compare-trials")
        log = [e["message"] for e in browser.get_log("browser")]
        assert not [m for m in log if "Content Security Policy" in m], log
    finally:
        server.stop()
