"""The WebUI's navigation in a real headless Chromium at 1024 px wide (issue 34): workspaces,
a workspace's projects, a project's experiments; not-found pages for unknown routes and ids;
the user menu (API docs, how to change the password, log out); the login page saying how to
get a first password; the cluster historical usage page (chart, table, CSV); "● live" only on
a page whose state can still change. Each page is screenshotted at 1024 px (test_webui.shot)
and must fit the window's width."""

from conftest import wait_for
from test_api import Server
from test_reconciler import config
from test_usage import runs  # noqa: F401  (the fixture: alice's and bob's runs of Jan 1-2)
from test_webui import browser, click, shot, text  # noqa: F401  (browser: the fixture)
from test_webui_tasks import fetch, login

WIDTH = 1024


def _fits(page) -> bool:
    """The page needs no horizontal scrolling at its window's width."""
    return page.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth")


def _menu_open(page) -> bool:
    return page.execute_script("return !document.getElementById('usermenu').hidden")


def _show(page, server: Server, route: str, ready: str, name: str) -> None:
    """Open ``route``, wait until the element ``ready`` has text, screenshot it as ``name``
    and check it fits the window's width."""
    page.get(f"{server.url}/ui/#{route}")
    wait_for(lambda: text(page, ready).strip(), 20, f"{ready} on {route}")
    shot(page, f"nav-{name}")
    assert _fits(page), f"{route} is wider than {WIDTH} px"


def test_navigation_not_found_user_menu_and_usage(browser, det, det_env, tmp_path, conn,  # noqa: F811
                                                  ended, runs) -> None:  # noqa: F811
    server = Server(det_env, tmp_path)
    try:
        det("workspace", "create", "research")
        det("project", "create", "research", "vision", "--description", "image models")
        det("experiment", "create", str(config(tmp_path, "echo hi")), str(tmp_path / "ctx"),
            "--workspace", "research", "--project", "vision")
        active = conn.execute("SELECT id FROM experiments e WHERE config ->> 'name' = 'shell'"
                              ).fetchone()["id"]
        done, _ = ended.make([[(10, 0.5)]])
        trial = conn.execute("SELECT id FROM trials WHERE experiment_id = %s",
                             (done,)).fetchone()["id"]
        ws, project = (conn.execute("SELECT w.id AS w, p.id AS p FROM projects p JOIN workspaces "
                                    "w ON w.id = p.workspace_id WHERE p.name = 'vision'")
                       .fetchone().values())
        browser.set_window_size(WIDTH, 800)
        browser.get(f"{server.url}/ui/#/login")
        wait_for(lambda: "det user change-password" in text(browser, "#login"), 20,
                 "the login page's first-password hint")
        shot(browser, "nav-login")
        login(browser, server)

        # workspaces -> a workspace's projects -> a project's experiments
        _show(browser, server, "/workspaces", "#workspaces tbody", "workspaces")
        assert "research" in text(browser, "#workspaces tbody")
        click(browser, f"#workspaces tr[data-workspace='{ws}'] a")
        wait_for(lambda: "vision" in text(browser, "#projects tbody"), 20, "the projects")
        assert "image models" in text(browser, "#projects tbody")
        shot(browser, "nav-workspace")
        click(browser, f"#projects tr[data-project='{project}'] a")
        wait_for(lambda: text(browser, "#exps tbody").strip(), 20, "the project's experiments")
        assert browser.current_url.endswith(f"#/projects/{project}")
        # the project's experiment alone (not the ended one, in Uncategorized)
        assert browser.execute_script(
            "return [...document.querySelectorAll('#exps tbody tr')].map((r) => r.dataset.exp)"
        ) == [str(active)]
        assert text(browser, ".crumbs") == "Workspaces / research / vision"
        shot(browser, "nav-project")

        # not found: unknown routes and ids (an experiment, a trial, a workspace, a project)
        for route, says in [("/nosuchpage", "No page /nosuchpage."),
                            ("/experiments/999", "experiment 999 not found"),
                            ("/trials/999", "trial 999 not found"),
                            ("/experiments/abc", "No experiment abc."),
                            ("/workspaces/999", "workspace 999 not found"),
                            ("/projects/999", "project 999 not found")]:
            browser.get(f"{server.url}/ui/#{route}")
            wait_for(lambda: "Not found" in text(browser, ".notfound"), 20, f"{route}'s page")
            assert says in text(browser, ".notfound"), (route, text(browser, ".notfound"))
            assert text(browser, "#error") == ""
        shot(browser, "nav-notfound")

        # cluster historical usage: by user over Jan 1-2, chart, table and its CSV
        _show(browser, server, "/usage?start=2026-01-01&end=2026-01-02&group_by=user",
              "#usage tbody", "usage")
        rows = text(browser, "#usage").splitlines()
        assert rows[0].split("\t") == ["Day", "alice", "bob", "Total"], rows
        assert rows[1].split("\t") == ["2026-01-01", "4", "", "4"], rows
        assert rows[3].split("\t") == ["Total", "6", "2.5", "8.5"], rows
        assert browser.execute_script("return !!document.querySelector('#u-chart canvas')")
        href = browser.execute_script("return document.getElementById('u-csv').href")
        got = fetch(browser, href)
        assert got["status"] == 200 and got["body"].splitlines()[0] == "day,user,slot_hours"
        # a new grouping from the picker
        browser.execute_script("const g = document.getElementById('u-group'); g.value = 'label';"
                               "g.dispatchEvent(new Event('change'));")
        wait_for(lambda: "(none)" in text(browser, "#usage thead"), 20, "the label grouping")
        assert "Total" not in text(browser, "#usage thead")  # labels overlap: no sum

        # the other pages at 1024 px
        for route, ready, name in [("/experiments", "#exps tbody", "experiments"),
                                   ("/queue", "#pools", "queue"),
                                   ("/cluster", "#pools", "cluster"),
                                   ("/tasks", "main h1", "tasks")]:
            _show(browser, server, route, ready, name)

        # the user menu: API docs, how to change the password, log out
        assert not _menu_open(browser)  # closed until the name is clicked
        click(browser, "#user")
        wait_for(lambda: "Log out" in text(browser, "#usermenu"), 10, "the user menu")
        assert "API docs" in text(browser, "#usermenu")
        click(browser, "#change-password")
        wait_for(lambda: "det user change-password" in text(browser, "#password-hint"), 10,
                 "the password hint")
        shot(browser, "nav-usermenu")
        browser.execute_script("document.body.click()")
        wait_for(lambda: not _menu_open(browser), 10, "the menu to close")

        # "● live" only while the state can change: an ended experiment and trial have none
        _show(browser, server, f"/experiments/{done}", "#title .state", "ended-experiment")
        assert "COMPLETED" in text(browser, "#title") and "live" not in text(browser, "#title")
        _show(browser, server, f"/trials/{trial}", "#title .state", "ended-trial")
        assert "live" not in text(browser, "#title")
        _show(browser, server, f"/experiments/{active}", "#title .state", "active-experiment")
        assert "● live" in text(browser, "#title")

        # log out from the menu
        click(browser, "#user")
        click(browser, "#logout")
        wait_for(lambda: browser.current_url.endswith("#/login"), 20, "the login page")
        assert fetch(browser, "/api/v1/me")["status"] == 401
    finally:
        server.stop()
