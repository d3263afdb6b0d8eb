"""The experiment page's trials table in a real headless Chromium (as tests/test_webui.py)
against ``det serve`` (issue 34): a column per hyperparameter and per metric of each trial's
best validation, figures by the one formatting rule, sorting by any column on a header click
(numbers as numbers, a trial without a value last either way, the order kept through live
updates), and no overflow at 1024 px (the Exit column was clipped). Screenshots go where
test_webui's ``shot`` puts them."""

from pathlib import Path

from conftest import wait_for
from test_api import Server
from test_format import make_search
from test_webui import browser, click, shot, text  # noqa: F401  (browser: the fixture)
from test_webui_tasks import login


def table(page) -> dict:
    """The trials table as shown: its headers and its rows' cells, read in one script (the
    stream redraws the table)."""
    return page.execute_script(
        "const t = document.getElementById('trials');"
        "if (!t) return {heads: [], rows: []};"
        "return {heads: [...t.querySelectorAll('thead th')].map((th) => th.innerText),"
        "        rows: [...t.querySelectorAll('tbody tr')].map((tr) =>"
        "          [...tr.querySelectorAll('td')].map((td) => td.innerText))};")


def column(page, label: str) -> list[str]:
    """The cells of the column headed ``label`` (its sort mark aside), top to bottom."""
    shown = table(page)
    heads = [h.rstrip(" ▴▾") for h in shown["heads"]]
    return [r[heads.index(label)] for r in shown["rows"]]


def sort_by(page, label: str, ids: list[int], what: str) -> None:
    """Click the header ``label`` and wait for the rows to be the trials ``ids`` in order."""
    click(page, f"#trials th[data-col='{label}']")
    wait_for(lambda: column(page, "ID") == [str(i) for i in ids], 10, what)


def test_trials_table_has_sortable_hyperparameter_and_metric_columns(
        browser, det_env, conn, ended, tmp_path: Path) -> None:  # noqa: F811
    eid = make_search(conn, ended)
    t1, t2, t3 = (r["id"] for r in conn.execute(
        "SELECT id FROM trials WHERE experiment_id = %s ORDER BY id", (eid,)))
    server = Server(det_env, tmp_path)
    try:
        browser.set_window_size(1024, 900)
        login(browser, server)
        browser.get(f"{server.url}/ui/#/experiments/{eid}")
        wait_for(lambda: len(table(browser)["rows"]) == 3, 30, "the three trials")
        shown = table(browser)
        assert shown["heads"] == ["ID ▴", "State", "hidden", "lr", "opt.beta", "opt.name",
                                  "Batches", "Best loss", "accuracy", "Restarts",
                                  "Exit"]  # no Rung: a random search has none; no epochs
        # The CLI's rule: 4 significant digits (lr was 0.0031622776601683794).
        assert shown["rows"][0][2:9] == ["128", "0.003162", "0.9", "adam", "100", "0.1235",
                                         "0.9748"]
        assert shown["rows"][2][7:9] == ["", ""], "trial 3 never validated"

        # Numbers sort as numbers (64 < 128 < 256; as text "128" < "256" < "64").
        sort_by(browser, "hidden", [t2, t1, t3], "hidden ascending")
        sort_by(browser, "hidden", [t3, t1, t2], "hidden descending, on a second click")
        sort_by(browser, "lr", [t2, t1, t3], "lr ascending")
        # A trial without the metric comes last in either direction.
        sort_by(browser, "Best loss", [t1, t2, t3], "best loss ascending, trial 3 last")
        sort_by(browser, "Best loss", [t2, t1, t3], "best loss descending, trial 3 still last")
        sort_by(browser, "accuracy", [t2, t1, t3], "accuracy ascending")
        sort_by(browser, "opt.name", [t1, t3, t2], "text: adam before sgd, ties in trial order")
        sort_by(browser, "accuracy", [t2, t1, t3], "accuracy ascending again")
        sort_by(browser, "accuracy", [t1, t2, t3], "accuracy descending")
        assert text(browser, "#trials th[aria-sort=descending]").startswith("accuracy")

        # A live update redraws the table in the order chosen.
        conn.execute("UPDATE trials SET restarts = 2 WHERE id = %s", (t3,))
        wait_for(lambda: column(browser, "Restarts") == ["0", "0", "2"], 30,
                 "the live update of trial 3's restarts")
        assert column(browser, "ID") == [str(t1), str(t2), str(t3)]

        browser.execute_script("document.getElementById('trials').scrollIntoView()")
        shot(browser, "experiment-trials-sorted-1024")
        # 1024 px: neither the page nor the table overflows; the Exit column shows in full.
        fit = browser.execute_script(
            "const wrap = document.querySelector('.table-wrap');"
            "const exit = document.querySelector('#trials th[data-col=Exit]')"
            "  .getBoundingClientRect();"
            "return {page: document.documentElement.scrollWidth <= window.innerWidth,"
            "        table: wrap.scrollWidth <= wrap.clientWidth,"
            "        exit: exit.right <= wrap.getBoundingClientRect().right};")
        assert fit == {"page": True, "table": True, "exit": True}, fit
        assert "worse than the rung's best" in column(browser, "Exit")[1]

        # The trial's page: its hyperparameters by name, checkpoint sizes in MiB.
        click(browser, f"#trials a[href='#/trials/{t1}']")
        wait_for(lambda: "2.5 MiB" in text(browser, "#ckpts"), 30, "the checkpoints' sizes")
        assert "hidden 128, lr 0.003162, opt.beta 0.9, opt.name adam" in text(browser, "#cards")
        shot(browser, "trial-cards-1024")
    finally:
        server.stop()


def test_a_trial_waiting_for_a_slot_reads_as_waiting_with_the_queues_reason(
        browser, det, det_env, ctx, tmp_path: Path) -> None:  # noqa: F811
    """Issue 34: the experiment page said `rung 0 (running)` while `det job list -v` said the
    job waited for a slot. With no agent, the trial's State cell reads ACTIVE and waiting
    (the queue's reason on hover), and the trial page's run reads waiting with that reason."""
    config = tmp_path / "waits.yaml"
    config.write_text("name: waits\nentrypoint: model_def:MyTrial\n"
                      "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n")
    det("experiment", "create", str(config), str(ctx))
    det("reconcile", "--once")  # the trial and its run, which no agent can take
    server = Server(det_env, tmp_path)
    try:
        login(browser, server)
        exp = server.client.get("/api/v1/experiments/1").json()
        trial = exp["trials"][0]
        assert trial["run_state"] == "waiting" and trial["run_reason"], trial
        browser.get(f"{server.url}/ui/#/experiments/1")
        wait_for(lambda: column(browser, "State") == ["ACTIVE waiting"], 30,
                 "the trial's state and its run's")
        assert browser.execute_script(
            "return document.querySelector('#trials .run-state').title") == trial["run_reason"]
        browser.get(f"{server.url}/ui/#/trials/{trial['id']}")
        wait_for(lambda: "waiting" in text(browser, "#runs tbody"), 30, "the run's row")
        assert trial["run_reason"] in text(browser, "#runs tbody")
        shot(browser, "trial-waiting-run")
    finally:
        server.stop()
