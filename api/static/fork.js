// Create an experiment from an existing one (spec run-training-code.rst: "from an existing
// experiment or trial on the WebUI"): Fork on an experiment's page (its model definition, the
// config edited here) and Continue on a trial's (one trial resumed from its latest checkpoint,
// weights and batch count). The dialog holds the YAML the server would submit, editable; the
// new experiment's page opens once the server has created it.
"use strict";

// A modal with `text` in a textarea; `submit(config)` creates the experiment (a Promise of
// {id}). A refusal is shown in the dialog, which stays open to fix the config.
function configDialog(title, hint, text, submit) {
  const dialog = document.createElement("dialog");
  dialog.className = "config-dialog";
  dialog.innerHTML = `
    <form method="dialog" class="dialog">
      <h2>${esc(title)}</h2>
      <p class="muted">${esc(hint)}</p>
      <textarea name="config" class="config-edit" spellcheck="false" rows="20"
        aria-label="config"></textarea>
      <p class="dialog-error" role="alert" hidden></p>
      <div class="actions"><button class="primary" value="create">Create experiment</button>
        <button value="cancel" formnovalidate>Cancel</button></div>
    </form>`;
  main.appendChild(dialog);
  const area = dialog.querySelector("textarea");
  const error = dialog.querySelector(".dialog-error");
  area.value = text;
  dialog.querySelector("form").addEventListener("submit", async (ev) => {
    if (!ev.submitter || ev.submitter.value !== "create") return;  // Cancel closes it
    ev.preventDefault();
    try {
      const r = await submit(area.value);
      dialog.close();
      location.hash = `#/experiments/${r.id}`;
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    }
  });
  dialog.addEventListener("close", () => dialog.remove());
  dialog.showModal();
  return dialog;
}

async function forkDialog(expId) {
  const e = await api("GET", `/api/v1/experiments/${expId}/fork`);
  return configDialog(
    `Fork experiment ${expId}`,
    "A new experiment with this experiment's model definition and the config below.",
    e.config || "",
    (config) => api("POST", `/api/v1/experiments/${expId}/fork`, { config }));
}

async function continueDialog(trialId) {
  const c = await api("GET", `/api/v1/trials/${trialId}/continue`);
  return configDialog(
    `Continue trial ${trialId}`,
    "A new experiment of one trial with this trial's hyperparameters, resumed from its " +
    "latest checkpoint (weights and batches trained): raise searcher.max_length to train further.",
    c.config,
    (config) => api("POST", `/api/v1/trials/${trialId}/continue`, { config }));
}
