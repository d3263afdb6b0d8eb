"""The trial page's log viewer in a real headless Chromium (as tests/test_webui.py), against
``det serve`` (issue 34: the page showed a bare tail with no search, filter or download): a
search box, level and rank filters over the lines, new lines arriving live, and a download of
the whole log as text with its run, rank and time.
"""

from pathlib import Path

import psycopg
from conftest import wait_for
from test_api import Server
from test_harness_db_faults import claim_allocation
from test_webui import browser, shot  # noqa: F401  (browser: the fixture)
from test_webui_tasks import login

LINES = [  # (stream, rank, line) as a two-worker run writes them
    ("stderr", 0, "INFO: [11] det.harness: trial 1 of experiment 1: starting at batch 0 with "
                  "hyperparameters {lr: 0.003, hidden: 128}"),
    ("stdout", 0, "epoch 0: loss 2.301"),
    ("stdout", 1, "epoch 0: loss 2.298"),
    ("stderr", 1, "WARNING: [12] root: the dataloader has 0 workers"),
    ("stderr", 0, "INFO: [11] det.harness: validated at batch 100 (epoch 2.227) in 0.41 s: "
                  "accuracy=0.9167 validation_loss=0.2829"),
    ("stderr", 0, "INFO: [11] det.harness: checkpoint 0b6f1d7e-4a55-4c3a-9d8e-2f0a7c1b9e11 at "
                  "batch 100: 117.7 KiB in 4 files"),
    ("stderr", 1, "ERROR: [12] root: a batch had NaN in it"),
    ("det", None, "run ended with exit code 0"),
]


def visible(page) -> list[str]:
    """The log lines the viewer shows (not filtered out), as it shows them."""
    return page.execute_script(
        "return [...document.querySelectorAll('#logs .logline')].filter((e) => !e.hidden)"
        ".map((e) => e.textContent)")


def set_value(page, css: str, value: str) -> None:
    page.execute_script(
        "const e = document.querySelector(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input'));", css, value)


def test_search_filter_follow_and_download_a_trials_log(browser, det_env,  # noqa: F811
                                                       db_url: str, tmp_path: Path) -> None:
    alloc = claim_allocation(db_url, tmp_path)
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE allocations SET slots_needed = 2 WHERE id = %s", (alloc.id,))
        c.execute("SELECT det_agent.append_logs(%s, %s, %s, %s)",
                  (alloc.id, [s for s, _, _ in LINES], [ln for _, _, ln in LINES],
                   [r for _, r, _ in LINES]))
    server = Server(det_env, tmp_path)
    try:
        login(browser, server)
        browser.get(f"{server.url}/ui/#/trials/{alloc.trial_id}")
        wait_for(lambda: len(visible(browser)) == len(LINES), 30, "the trial's log lines")
        shown = visible(browser)
        assert shown[0].startswith("[run 1] [rank=0] INFO: [11] det.harness: trial 1")
        assert shown[-1] == "[run 1] [det] run ended with exit code 0"

        set_value(browser, "#log-search", "Validated")  # any case
        assert visible(browser) == [f"[run 1] [rank=0] {LINES[4][2]}"]
        assert browser.execute_script(
            "return document.getElementById('log-count').textContent") == "1 of 8 lines"
        set_value(browser, "#log-search", "")

        set_value(browser, "#log-level", "warning")
        assert visible(browser) == [f"[run 1] [rank=1] {LINES[3][2]}",
                                    f"[run 1] [rank=1] {LINES[6][2]}"]
        set_value(browser, "#log-level", "error")
        assert visible(browser) == [f"[run 1] [rank=1] {LINES[6][2]}"]
        set_value(browser, "#log-level", "debug")

        set_value(browser, "#log-rank", "1")
        assert visible(browser) == [f"[run 1] [rank=1] {ln}" for _, r, ln in LINES if r == 1]
        set_value(browser, "#log-rank", "none")
        assert visible(browser) == ["[run 1] [det] run ended with exit code 0"]
        set_value(browser, "#log-rank", "0")
        set_value(browser, "#log-search", "loss")
        shot(browser, "trial-logs-filtered")
        assert visible(browser) == [f"[run 1] [rank=0] {LINES[1][2]}",
                                    f"[run 1] [rank=0] {LINES[4][2]}"]
        set_value(browser, "#log-search", "")
        set_value(browser, "#log-rank", "")

        # live: a line written now shows without a reload, and the view follows it
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("SELECT det_agent.append_logs(%s, %s, %s, %s)",
                      (alloc.id, ["stdout"], ["epoch 1: loss 1.234"], [1]))
        wait_for(lambda: visible(browser)[-1:] == ["[run 1] [rank=1] epoch 1: loss 1.234"], 30,
                 "the new line, live")
        assert browser.execute_script(
            "const p = document.getElementById('logs');"
            "return document.getElementById('log-follow').checked"
            " && p.scrollTop + p.clientHeight >= p.scrollHeight - 5")
        shot(browser, "trial-logs")

        # download: the whole log as text, an attachment, a line each with time, run and rank
        link = browser.execute_script(
            "return document.getElementById('log-download').getAttribute('href')")
        got = browser.execute_script(
            "const x = new XMLHttpRequest(); x.open('GET', arguments[0], false); x.send();"
            "return {status: x.status, type: x.getResponseHeader('Content-Type'),"
            " disposition: x.getResponseHeader('Content-Disposition'), body: x.responseText};",
            link)
        assert got["status"] == 200 and got["type"].startswith("text/plain")
        assert got["disposition"] == \
            f'attachment; filename="trial-{alloc.trial_id}-logs.txt"'
        body = got["body"].splitlines()
        assert len(body) == len(LINES) + 1
        assert body[3].endswith(f" [run 1] [rank=1] {LINES[3][2]}")
        assert body[-1].endswith(" [run 1] [rank=1] epoch 1: loss 1.234")
        assert all(line[:4].isdigit() and "+00:00 [run 1] " in line for line in body)
        assert server.client.get("/api/v1/trials/999/logs/download").status_code == 404
    finally:
        server.stop()
