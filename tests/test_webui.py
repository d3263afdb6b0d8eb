"""The WebUI in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven
by selenium) against ``det serve``, a reconciler, an agent and a running digits experiment:
log in, watch the learning curve gain points without reloading, pause and activate from the
page, move a job to the top of the queue, see the agent's slots. Screenshots of each page go
to ``$DET_SCREENSHOTS`` (``DET_SCREENSHOTS=docs`` refreshes the README's), else to a temporary
directory: a test run leaves the source tree as it was.

The fixture installs the browser with apt-get where it can (root, apt available) and skips,
saying why, where it cannot.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import wait_for
from test_api import Server

REPO = Path(__file__).resolve().parent.parent

DIGITS = """
name: digits-webui
entrypoint: model_def:DigitsTrial
hyperparameters: {global_batch_size: 32, lr: 0.003, hidden: 128, dropout: 0.1}
searcher:
  name: single
  metric: accuracy
  smaller_is_better: false
  max_length: {batches: 20000}
records_per_epoch: 1437
min_validation_period: {batches: 50}
min_checkpoint_period: {batches: 200}
resources: {slots_per_trial: 1}
"""

PRIORITY = "resource_manager:\n  scheduler: {type: priority}\nresource_pools:\n  - name: default\n"


def _browser_binaries() -> tuple[str, str]:
    chrome, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chrome and driver:
        return chrome, driver
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium/chromedriver, and apt-get cannot install them here (not root "
                    "or no apt): apt-get install chromium chromium-driver")
    r = subprocess.run(["apt-get", "install", "-y", "chromium", "chromium-driver"],
                       capture_output=True, text=True, timeout=900)
    chrome, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if r.returncode != 0 or not (chrome and driver):
        pytest.skip(f"apt-get install chromium chromium-driver failed: {r.stderr[-300:]}")
    return chrome, driver


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    chrome, driver = _browser_binaries()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    b = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=driver))
    b.implicitly_wait(0)
    yield b
    # What the page said, for a failing test's report (pytest shows it only on failure).
    for entry in b.get_log("browser"):
        print("browser:", entry.get("level"), entry.get("message"))
    b.save_screenshot(str(Path(os.environ.get("TMPDIR", "/tmp")) / "det-webui-last.png"))
    b.quit()


def text(browser, css: str) -> str:
    """The visible text of the first element matching ``css`` ("" when none), read in one
    script: a live page re-renders between a find and a read (a stale element under load)."""
    return browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css)


def click(browser, css: str) -> None:
    """Click the first element matching ``css`` once there, found and clicked in one script:
    live pages redraw their tables whenever a stream sends, so a found element may be gone
    a moment later."""
    wait_for(lambda: browser.execute_script(
        "const el = document.querySelector(arguments[0]); if (el) el.click(); return !!el;",
        css), 20, f"{css} to click")


def shot(browser, name: str) -> None:
    default = Path(os.environ.get("TMPDIR", "/tmp")) / "det-webui"
    where = REPO / os.environ["DET_SCREENSHOTS"] if os.environ.get("DET_SCREENSHOTS") \
        else default
    where.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(where / f"webui-{name}.png"))


@pytest.mark.slow
def test_watch_and_steer_a_digits_experiment(browser, det, det_env, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    (tmp_path / "cluster.yaml").write_text(PRIORITY)
    det("cluster", "config", "apply", str(tmp_path / "cluster.yaml"))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--id", "agent-1", "--slots", "1")
    (tmp_path / "digits.yaml").write_text(DIGITS)
    ctx = str(REPO / "examples" / "digits")
    det("experiment", "create", str(tmp_path / "digits.yaml"), ctx)
    server = Server(det_env, tmp_path)
    try:
        # log in
        browser.get(f"{server.url}/ui/#/login")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#login"), 20, "the login form")
        browser.find_element(By.NAME, "username").send_keys(server.user)
        browser.find_element(By.NAME, "password").send_keys(server.password)
        click(browser, "#login button")
        wait_for(lambda: "digits-webui" in text(browser, "#exps tbody"), 20,
                 "the experiment list")
        assert text(browser, "#user") == server.user

        # the experiment's learning curve gains points, live
        click(browser, "#exps tbody a")
        wait_for(lambda: "ACTIVE" in text(browser, "#title"), 20, "the experiment page")
        browser.execute_script("window.notReloaded = true;")
        browser.find_element(By.CSS_SELECTOR, "#group option[value='training'], #group option")
        browser.execute_script(
            "const g = document.getElementById('group'); g.value = 'training';"
            "g.dispatchEvent(new Event('change'));")

        def points() -> int:
            return int(browser.execute_script(
                "return document.getElementById('curves').dataset.points || 0"))

        first = wait_for(points, 120, "the first training metrics on the chart")
        wait_for(lambda: points() > first, 60, "the chart to gain points")
        assert browser.execute_script("return window.notReloaded === true")
        wait_for(lambda: int(text(browser, "#trials tbody td[data-col=Batches]") or 0) > 0, 30,
                 "batches trained shown in the trials table")
        shot(browser, "experiment")

        # pause and activate from the page
        click(browser, "#acts button[data-act='pause']")
        wait_for(lambda: "PAUSED" in text(browser, "#title"), 20, "the experiment to pause")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR,
                                               "#acts button[data-act='activate']"), 10,
                 "the activate button")
        click(browser, "#acts button[data-act='activate']")
        wait_for(lambda: "ACTIVE" in text(browser, "#title"), 20, "the experiment to resume")

        # the trial page: its log tail
        click(browser, "#trials tbody a")
        wait_for(lambda: "det" in text(browser, "#logs") or text(browser, "#logs"), 60,
                 "the trial's logs")
        shot(browser, "trial")

        # two more jobs wait for the one slot: move the last to the top
        for _ in range(2):
            det("experiment", "create", str(tmp_path / "digits.yaml"), ctx)
        browser.get(f"{server.url}/ui/#/queue")
        def queue() -> list[str]:
            # Read in one go: the table is redrawn whenever the queue's stream sends.
            return browser.execute_script(
                "return [...document.querySelectorAll('table.queue tbody tr')]"
                ".map((r) => r.dataset.job)")

        wait_for(lambda: len(queue()) == 3, 30, "three jobs in the queue")
        last = queue()[-1]
        browser.execute_script(
            "document.querySelector(`button[data-op='top'][data-job='${arguments[0]}']`)"
            ".click()", last)
        wait_for(lambda: queue()[0] == last, 20, "the job to move to the top")
        wait_for(lambda: "Why waiting" in text(browser, "table.queue thead"), 5, "the reasons")
        shot(browser, "queue")

        # the cluster: the agent's slot and what holds it
        browser.get(f"{server.url}/ui/#/cluster")
        wait_for(lambda: "agent-1" in text(browser, "#agents"), 20, "the agent")
        wait_for(lambda: "agent-1" in text(browser, "#slots"), 20, "the agent's slots")
        shot(browser, "cluster")

        browser.get(f"{server.url}/ui/#/experiments")
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#exps tbody tr")) == 3,
                 20, "three experiments listed")
        shot(browser, "experiments")
    finally:
        for exp in (1, 2, 3):
            det("experiment", "kill", str(exp), check=False)
        server.stop()
