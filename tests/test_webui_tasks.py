"""Interactive tasks in the WebUI, in a real headless Chromium (as tests/test_webui.py), against
``det serve``, a reconciler and a process-runtime agent running the real servers
(det.harness.interactive): launch a notebook from the Tasks page's dialog, open JupyterLab
through det serve's proxy, run ``print(6*7)`` in a real kernel and read 42, open a terminal
and type into it, kill the notebook from the Tasks page; open a TensorBoard for an
experiment from its page and read its scalar tags through the proxy (issue 33).
"""

import json
from pathlib import Path

import fsspec
from conftest import EndedExperiments, wait_for
from test_api import Server
from test_webui import browser, click, shot, text  # noqa: F401  (browser: the fixture)

from det.harness.storage import FsspecStorage
from det.harness.tensorboard import TensorboardFiles


def task_output(conn, job: int) -> str:
    """The task's log lines, for a failing wait's message."""
    return "\n".join(r["line"] for r in conn.execute(
        "SELECT line FROM task_logs WHERE allocation_id IN "
        "(SELECT id FROM allocations WHERE job_id = %s) ORDER BY id", (job,)))


def open_link(page, conn, job: int) -> str:
    """The task's Open link, once its server answers (else the test fails with its log)."""
    try:
        return wait_for(lambda: task_row(page, job).get("open"), 120,
                        f"task {job}'s Open link (its server answering)")
    except AssertionError as e:
        raise AssertionError(f"{e}; the task's log:\n{task_output(conn, job)}") from None


def login(page, server: Server) -> None:
    from selenium.webdriver.common.by import By

    page.get(f"{server.url}/ui/#/login")
    wait_for(lambda: page.find_elements(By.CSS_SELECTOR, "#login"), 20, "the login form")
    page.find_element(By.NAME, "username").send_keys(server.user)
    page.find_element(By.NAME, "password").send_keys(server.password)
    click(page, "#login button")
    wait_for(lambda: text(page, "#user") == server.user, 20, "the login")


def task_row(page, job: int) -> dict:
    """The Tasks page's row of task ``job``: its state and Open link (read in one go: the
    stream redraws the table)."""
    return page.execute_script(
        "const r = document.querySelector(`#tasks tr[data-task='${arguments[0]}']`);"
        "if (!r) return {};"
        "const a = r.querySelector('a.open');"
        "return {state: r.dataset.state, open: a ? a.getAttribute('href') : null,"
        "        text: r.innerText};", job)


def fetch(page, path: str, method: str = "GET") -> dict:
    """``fetch(path)`` from the page (its cookie, its Origin): status and body text."""
    return page.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0], {method: arguments[1], credentials: 'same-origin'})"
        ".then(async (r) => done({status: r.status, body: await r.text()}))"
        ".catch((e) => done({status: 0, body: String(e)}));", path, method)


def diagnose(wait, page, conn, job: int):
    """``wait()``; where it fails, the failure also says what the notebook showed: its
    kernels (Jupyter's REST), the first cell's prompt and text, and the task's log."""
    try:
        return wait()
    except AssertionError as e:
        shown = page.execute_script(
            "const c = document.querySelector('.jp-Notebook .jp-Cell');"
            "return c ? {prompt: c.querySelector('.jp-InputPrompt')?.innerText,"
            "            input: c.querySelector('.cm-content')?.innerText,"
            "            status: document.querySelector('.jp-Notebook-ExecutionIndicator')"
            "                    ?.getAttribute('data-status')} : null;")
        kernels = fetch(page, f"/proxy/{job}/api/kernels")
        raise AssertionError(f"{e}; the cell: {shown}; kernels: {kernels}; the task's log:\n"
                             f"{task_output(conn, job)}") from None


def test_a_notebook_from_the_webui_runs_a_kernel_through_the_proxy(
        browser, det, det_env, conn, tmp_path: Path) -> None:  # noqa: F811
    from selenium.common.exceptions import (
        ElementNotInteractableException,
        StaleElementReferenceException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--id", "agent-1", "--slots", "1")
    server = Server(det_env, tmp_path)
    browser.set_script_timeout(30)
    try:
        login(browser, server)
        browser.get(f"{server.url}/ui/#/tasks")
        wait_for(lambda: "No tasks" in text(browser, "#tasks tbody"), 20, "the Tasks page")

        # Launch JupyterLab: one slot, the pool the dialog lists
        click(browser, "#launch")
        wait_for(lambda: browser.execute_script(
            "return document.getElementById('nb-dialog').open && "
            "document.querySelectorAll('#nb-pool option').length > 1"), 20, "the dialog")
        browser.execute_script("document.getElementById('nb-pool').value = 'default';")
        shot(browser, "launch-jupyterlab")
        click(browser, "#nb-go")
        job = wait_for(lambda: browser.execute_script(
            "const r = document.querySelector('#tasks tr[data-task]');"
            "return r ? Number(r.dataset.task) : null;"), 30, "the notebook's row")
        assert task_row(browser, job)["text"].split("\t")[1] == "NOTEBOOK"
        link = open_link(browser, conn, job)
        assert link == f"/proxy/{job}/"
        shot(browser, "tasks")

        # JupyterLab through det serve: a notebook with a real kernel
        # ?reset: the default layout (the Launcher), not one a JupyterLab of an earlier task
        # of this Unix user saved in its workspaces directory
        browser.get(f"{server.url}{link}lab?reset")
        click(browser, ".jp-LauncherCard[data-category='Notebook']")
        editor = ".jp-Notebook .jp-Cell .cm-content"

        def typed() -> bool:
            # The new notebook's cell may be there before it takes input (its panel still
            # opening, a kernel dialog over it): try until it does.
            cells = [c for c in browser.find_elements(By.CSS_SELECTOR, editor)
                     if c.is_displayed()]
            if not cells:
                return False
            try:
                cells[0].click()
                cells[0].send_keys("print(6*7)")
            except (ElementNotInteractableException, StaleElementReferenceException):
                return False
            cells[0].send_keys(Keys.SHIFT, Keys.ENTER)
            return True

        # The notebook's kernel, started by JupyterLab through the proxy's REST: a new Python
        # loading ipykernel (slow on a loaded 2-core host). Typed into once it is idle, so a
        # missing 42 below is the kernel's WebSocket through the proxy, not its start.
        kernels = lambda: json.loads(fetch(browser, f"/proxy/{job}/api/kernels")["body"])  # noqa: E731
        diagnose(lambda: wait_for(lambda: [k for k in kernels() if k["execution_state"] == "idle"],
                                  180, "the notebook's kernel to be idle"), browser, conn, job)
        wait_for(typed, 60, "a notebook cell that takes input")
        diagnose(lambda: wait_for(lambda: "42" in text(browser, ".jp-OutputArea-output"), 120,
                                  "42 from the kernel"), browser, conn, job)
        shot(browser, "jupyterlab")
        # the kernel's WebSocket and Jupyter's token never reached the page
        token = conn.execute("SELECT jupyter_token FROM task_secrets WHERE job_id = %s",
                             (job,)).fetchone()["jupyter_token"]
        assert token not in browser.page_source

        # a terminal: opened from a new launcher, typed into over its WebSocket
        click(browser, "[data-command='launcher:create']")
        click(browser, ".jp-LauncherCard[data-category='Other'][title*='erminal'], "
                       ".jp-LauncherCard[data-category='Other']")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".jp-Terminal .xterm"), 60,
                 "the terminal")
        terminals = json.loads(fetch(browser, f"/proxy/{job}/api/terminals")["body"])
        assert len(terminals) == 1
        browser.find_element(By.CSS_SELECTOR, ".jp-Terminal .xterm-helper-textarea").send_keys(
            "echo $((6*7)) > from_terminal.txt\n")
        wait_for(lambda: fetch(browser, f"/proxy/{job}/files/from_terminal.txt")["body"]
                 .strip() == "42", 30, "the terminal's command to write its file")
        shot(browser, "terminal")

        # kill it from the Tasks page
        browser.get(f"{server.url}/ui/#/tasks")
        wait_for(lambda: task_row(browser, job).get("state") == "RUNNING", 20, "the row")
        browser.execute_script("window.confirm = () => true;")
        click(browser, f"button[data-op='kill'][data-task='{job}']")
        wait_for(lambda: task_row(browser, job).get("state") == "TERMINATED", 60,
                 "the notebook to end")
        assert f"killed by {server.user}" in task_row(browser, job)["text"]
        r = fetch(browser, f"/proxy/{job}/lab")
        assert r["status"] == 410 and f"Notebook {job} is TERMINATED" in r["body"]
    finally:
        server.stop()


def test_a_tensorboard_from_an_experiment_page_lists_its_scalar_tags(
        browser, det, det_env, conn, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    # an ended experiment whose trial wrote TensorBoard event files to its shared_fs storage
    exps = EndedExperiments(conn, tmp_path / "ckpts")
    eid, _ = exps.make([[(10, 0.5)]])
    tid = conn.execute("SELECT id FROM trials WHERE experiment_id = %s", (eid,)).fetchone()["id"]
    storage = FsspecStorage(fsspec.filesystem("file"), str(tmp_path / "ckpts"))
    files = TensorboardFiles(storage, eid, tid, tmp_path / "tb-local")
    for step in range(1, 11):
        files.report("training", step, {"loss": 1.0 / step})
    files.report("validation", 10, {"accuracy": 0.9})
    files.close()

    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--id", "agent-1", "--slots", "1")
    server = Server(det_env, tmp_path)
    browser.set_script_timeout(30)
    try:
        login(browser, server)
        browser.get(f"{server.url}/ui/#/experiments/{eid}")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#open-tb"), 20, "the page")
        click(browser, "#open-tb")
        wait_for(lambda: browser.execute_script("return location.hash") == "#/tasks", 20,
                 "the Tasks page")
        job = wait_for(lambda: browser.execute_script(
            "const r = document.querySelector(\"#tasks tr[data-kind='TENSORBOARD']\");"
            "return r ? Number(r.dataset.task) : null;"), 30, "the TensorBoard's row")
        link = open_link(browser, conn, job)
        tags = json.loads(fetch(browser, f"{link}data/plugin/scalars/tags")["body"])
        # runs are named by the TensorBoard's logdir spec: exp<id>, then the trial's folders
        scalars = {tag for run, by_tag in tags.items() if run.startswith(f"exp{eid}")
                   for tag in by_tag}
        assert scalars >= {"loss", "val_accuracy"}, tags
        browser.get(f"{server.url}{link}")
        wait_for(lambda: "TensorBoard" in browser.title, 30, "TensorBoard's page")
        # its scalars dashboard, drawn by TensorBoard's own page through the proxy
        wait_for(lambda: "val_accuracy" in browser.execute_script(
            "return document.body.innerText"), 60, "the scalar cards on TensorBoard's page")
        shot(browser, "tensorboard")
    finally:
        server.stop()
