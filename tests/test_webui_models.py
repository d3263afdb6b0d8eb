"""The model registry's API and WebUI page, and the WebUI's Fork and Continue (issue 34), in a
real headless Chromium (as tests/test_webui.py) against ``det serve``: create a model, register
a trial's checkpoint from the trial page and another by uuid from the model's page, download a
version's files; fork an experiment from its page with an edited config, continue a trial from
its page. The experiment is stored row by row as a finished run leaves it (with its context and
checkpoint files on disk), so no reconciler or agent runs.
"""

import io
import tarfile
from pathlib import Path

import httpx
import yaml
from conftest import wait_for
from psycopg.types.json import Jsonb
from test_api import Server
from test_webui import browser, click, shot, text  # noqa: F401  (browser: the fixture)
from test_webui_tasks import login

from det import context
from det.configs import load_experiment_config


def finished_experiment(conn, ctx: Path, storage: Path) -> tuple[int, int, list[str]]:
    """A COMPLETED experiment (context ``ctx``) of one trial with checkpoints at batches 50
    and 100 (files under ``storage``), the latest its restart point. Returns (experiment id,
    trial id, checkpoint uuids)."""
    text_ = ("name: mnist-small\nentrypoint: model_def:MyTrial\n"
             "hyperparameters: {lr: 0.01, hidden: 64}\n"
             f"checkpoint_storage: {{type: shared_fs, host_path: {storage}}}\n"
             "searcher: {name: single, metric: loss, max_length: {batches: 100}}\n")
    cfg = load_experiment_config(text_).expanded()
    eid = conn.execute("SELECT det_user.create_experiment(%s, %s, %s) AS id",
                       (Jsonb(cfg), text_, context.pack(ctx))).fetchone()["id"]
    trial = conn.execute(
        "INSERT INTO trials (experiment_id, request_id, hparams, seed, state, end_time) "
        "VALUES (%s, gen_random_uuid(), '{\"lr\": 0.01, \"hidden\": 64}', 1, 'COMPLETED', now()) "
        "RETURNING id", (eid,)).fetchone()["id"]
    alloc = conn.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, ended_at, exit_code, settled) SELECT job_id, %s, 1, 'default', 1, '{}', "
        "'TERMINATED', now(), 0, true FROM experiments WHERE id = %s RETURNING id",
        (trial, eid)).fetchone()["id"]
    uuids = []
    for steps, loss in ((50, 0.31), (100, 0.22)):
        uuid = conn.execute("SELECT gen_random_uuid()::text AS u").fetchone()["u"]
        (storage / uuid).mkdir(parents=True)
        (storage / uuid / "state.bin").write_bytes(b"w" * 2048)
        conn.execute("INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, "
                     "storage, resources) VALUES (%s, %s, %s, %s, %s, %s)",
                     (uuid, trial, alloc, steps, Jsonb(cfg["checkpoint_storage"]),
                      Jsonb({"state.bin": 2048})))
        conn.execute("INSERT INTO metrics (trial_id, allocation_id, \"group\", steps_completed, "
                     "\"values\") VALUES (%s, %s, 'validation', %s, %s)",
                     (trial, alloc, steps, Jsonb({"loss": loss})))
        uuids.append(uuid)
    conn.execute("UPDATE trials SET latest_checkpoint = %s, steps_completed = 100 WHERE id = %s",
                 (uuids[-1], trial))
    conn.execute("UPDATE experiments SET state = 'COMPLETED', end_time = now() WHERE id = %s",
                 (eid,))
    return eid, trial, uuids


def test_models_api(det_env, tmp_path: Path, conn, ctx: Path) -> None:
    _, trial, uuids = finished_experiment(conn, ctx, tmp_path / "ckpts")
    server = Server(det_env, tmp_path)
    try:
        api = server.client
        assert api.get("/api/v1/models").json() == {"models": []}
        r = api.post("/api/v1/models", json={"name": "Classifier", "description": "digits"})
        assert r.status_code == 201 and r.json()["num_versions"] == 0, r.text
        r = api.post("/api/v1/models", json={"name": "classifier"})
        assert r.status_code == 400 and "already exists" in r.json()["error"]
        r = api.post("/api/v1/models", json={"name": "12"})
        assert r.status_code == 400 and "model name" in r.json()["error"]

        r = api.post("/api/v1/models/classifier/versions",
                     json={"checkpoint": uuids[1], "name": "best"})
        assert r.status_code == 201, r.text
        assert r.json()["version"] == 1 and r.json()["trial_id"] == trial
        r = api.post("/api/v1/models/classifier/versions", json={"checkpoint": "nope"})
        assert r.status_code == 400 and "checkpoint" in r.json()["error"]
        assert api.get("/api/v1/models/nosuch").status_code == 404

        model = api.get("/api/v1/models/CLASSIFIER").json()  # any case
        assert [(v["version"], v["checkpoint_uuid"], v["steps_completed"])
                for v in model["versions"]] == [(1, uuids[1], 100)]
        assert model["versions"][0]["validation_metrics"] == {"loss": 0.22}
        files = api.get(f"/api/v1/checkpoints/{model['versions'][0]['checkpoint_uuid']}"
                        "/download")
        assert files.status_code == 200
        with tarfile.open(fileobj=io.BytesIO(files.content)) as tar:
            assert f"{uuids[1]}/state.bin" in tar.getnames()
    finally:
        server.stop()


def test_models_page_and_fork_continue_dialogs(browser, det_env, tmp_path: Path, conn,  # noqa: F811
                                               ctx: Path) -> None:
    from selenium.webdriver.common.by import By

    eid, trial, uuids = finished_experiment(conn, ctx, tmp_path / "ckpts")
    server = Server(det_env, tmp_path)
    try:
        login(browser, server)
        browser.get(f"{server.url}/ui/#/models")
        wait_for(lambda: "No models yet" in text(browser, "#models tbody"), 20, "the models page")
        assert "active" in browser.find_element(
            By.CSS_SELECTOR, "header nav a[data-nav=models]").get_attribute("class")
        browser.find_element(By.NAME, "name").send_keys("mnist-classifier")
        browser.find_element(By.NAME, "description").send_keys("small MNIST MLP")
        click(browser, "#new-model button")
        wait_for(lambda: "Model mnist-classifier" in text(browser, "h1"), 20, "the model page")
        assert "No versions yet" in text(browser, "#versions")

        # register the trial's latest checkpoint by its uuid, on the model's page
        browser.find_element(By.NAME, "checkpoint").send_keys(uuids[1])
        browser.find_element(By.NAME, "name").send_keys("best")
        click(browser, "#register button")
        wait_for(lambda: uuids[1] in text(browser, "#versions"), 20, "version 1 on the page")
        shot(browser, "model-version-1")
        browser.get(f"{server.url}/ui/#/models/nosuch")
        wait_for(lambda: "Not found" in text(browser, "main"), 20, "the not-found page")

        # fork: the dialog holds the experiment's config; edited, it makes a new experiment
        browser.get(f"{server.url}/ui/#/experiments/{eid}")
        click(browser, "#fork")
        wait_for(lambda: browser.execute_script(
            "const t = document.querySelector('dialog[open] textarea');"
            "return t && t.value.includes('mnist-small')"), 20, "the fork dialog's config")
        browser.execute_script(
            "const t = document.querySelector('dialog[open] textarea');"
            "t.value = t.value.replace('max_lenght', 'x').replace('max_length', 'max_lenght');")
        click(browser, "dialog[open] button[value=create]")  # a typo: refused in the dialog
        wait_for(lambda: "max_lenght" in text(browser, "dialog[open] .dialog-error"), 20,
                 "the refusal in the dialog")
        shot(browser, "fork-dialog")
        browser.execute_script(
            "const t = document.querySelector('dialog[open] textarea');"
            "t.value = t.value.replace('max_lenght', 'max_length')"
            ".replace('name: mnist-small', 'name: mnist-wider')"
            ".replace('hidden: 64', 'hidden: 128');")
        click(browser, "dialog[open] button[value=create]")
        forked = eid + 1
        wait_for(lambda: browser.current_url.endswith(f"#/experiments/{forked}"), 20,
                 "the forked experiment's page")
        row = conn.execute("SELECT name, config -> 'hyperparameters' AS h, context_id, "
                           "(SELECT context_id FROM experiments WHERE id = %s) AS source_ctx "
                           "FROM experiments WHERE id = %s", (eid, forked)).fetchone()
        assert row["name"] == "mnist-wider" and row["context_id"] == row["source_ctx"]
        assert row["h"]["hidden"] == {"type": "const", "val": 128}

        # continue: one trial from the latest checkpoint, trained further
        browser.get(f"{server.url}/ui/#/trials/{trial}")
        click(browser, "#continue")
        wait_for(lambda: browser.execute_script(
            "const t = document.querySelector('dialog[open] textarea');"
            "return t && t.value.includes(arguments[0])", uuids[1]), 20,
            "the continue dialog's config")
        shot(browser, "continue-dialog")
        browser.execute_script(
            "const t = document.querySelector('dialog[open] textarea');"
            "t.value = t.value.replace('batches: 100', 'batches: 300');")
        click(browser, "dialog[open] button[value=create]")
        wait_for(lambda: browser.current_url.endswith(f"#/experiments/{forked + 1}"), 20,
                 "the continuation's page")
        cont = conn.execute("SELECT e.config, k.checkpoint_uuid::text AS u FROM experiments e "
                            "JOIN continuations k ON k.experiment_id = e.id WHERE e.id = %s",
                            (forked + 1,)).fetchone()
        assert cont["u"] == uuids[1]
        assert cont["config"]["searcher"]["max_length"] == {"batches": 300}
        assert yaml.safe_dump(cont["config"]["hyperparameters"]) == yaml.safe_dump(
            {"hidden": {"type": "const", "val": 64}, "lr": {"type": "const", "val": 0.01}})

        # the earlier checkpoint from the trial page's checkpoints
        browser.get(f"{server.url}/ui/#/trials/{trial}")
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button[data-register]"), 20,
                 "the checkpoints' register buttons")
        click(browser, f"button[data-register='{uuids[0]}']")
        wait_for(lambda: text(browser, "dialog[open]"), 20, "the register dialog")
        browser.find_element(By.CSS_SELECTOR, "dialog[open] input[name=name]").send_keys("early")
        shot(browser, "register-dialog")
        click(browser, "dialog[open] button[value=register]")
        wait_for(lambda: uuids[0] in text(browser, "#versions"), 20, "version 2 on the page")
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#versions tbody tr')].map(r => r.innerText)")
        assert len(rows) == 2 and "best" in rows[0] and "early" in rows[1]
        href = browser.find_element(By.CSS_SELECTOR, "#versions a.download").get_attribute("href")
        assert httpx.get(href, headers={"Authorization": f"Bearer {server.token}"}
                         ).status_code == 200
        shot(browser, "model")
        browser.get(f"{server.url}/ui/#/models")
        wait_for(lambda: "mnist-classifier" in text(browser, "#models tbody"), 20, "the list")
        assert "2" in text(browser, "#models tbody td.num")
        shot(browser, "models")
    finally:
        server.stop()
