// The WebUI's login page and its router (every page is in its own file, loaded first).
"use strict";

async function loginPage() {
  main.innerHTML = `
    <form class="login" id="login">
      <h1>Log in to det</h1>
      <input name="username" placeholder="user" autocomplete="username" required>
      <input name="password" type="password" placeholder="password" autocomplete="current-password">
      <button class="primary" type="submit">Log in</button>
      <p class="muted hint">First time? <code>det cluster up</code> names your user; give it a
        password with <code>det user change-password</code> in a terminal, then log in with
        both.</p>
    </form>`;
  document.getElementById("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    await api("POST", "/api/v1/auth/login",
              { username: f.get("username"), password: f.get("password") || "" });
    location.hash = "#/experiments";
  });
}


// What an unknown route or id shows (issue 34: #/experiments/999 was an empty skeleton and
// #/nosuchpage the experiments list); `what`: the server's message, or the route.
function notFoundPage(what) {
  for (const f of cleanup) f();
  cleanup = [];
  showError("");
  main.innerHTML = `<div class="notfound"><h1>Not found</h1>
    <p>${esc(what)}</p><p><a href="#/experiments">Experiments</a> ·
    <a href="#/workspaces">Workspaces</a></p></div>`;
}


// --- routing ----------------------------------------------------------------------------------

async function route() {
  for (const f of cleanup) f();
  cleanup = [];
  // A fresh element per page: the listeners of the page left go with it.
  const fresh = main.cloneNode(false);
  main.replaceWith(fresh);
  main = fresh;
  showError("");
  const path = (location.hash.replace(/^#/, "") || "/experiments").split("?")[0];
  const parts = path.split("/").filter(Boolean);
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === parts[0] ||
                      (a.dataset.nav === "experiments" && parts[0] === "trials") ||
                      (a.dataset.nav === "workspaces" && parts[0] === "projects"));
  }
  if (parts[0] === "login") return loginPage();
  try {
    const me = await api("GET", "/api/v1/me");
    document.getElementById("user").textContent = me.username;
    document.getElementById("user").hidden = false;
  } catch (e) {
    return;
  }
  // an id is digits: anything else names nothing
  if (parts[1] && ["experiments", "trials", "workspaces", "projects"].includes(parts[0]) &&
      !/^\d+$/.test(parts[1])) return notFoundPage(`No ${parts[0].replace(/s$/, "")} ${parts[1]}.`);
  if (parts[0] === "experiments" && parts[1]) return experimentPage(parts[1]);
  if (parts[0] === "trials" && parts[1]) return trialPage(parts[1]);
  if (parts[0] === "workspaces" && parts[1]) return workspacePage(parts[1]);
  if (parts[0] === "workspaces") return workspacesPage();
  if (parts[0] === "projects" && parts[1]) return projectPage(parts[1]);
  if (parts[0] === "usage") return usagePage();
  if (parts[0] === "compare") return comparePage();
  if (parts[0] === "models") return parts[1] ? modelPage(decodeURIComponent(parts[1])) : modelsPage();
  if (parts[0] === "queue") return queuePage();
  if (parts[0] === "tasks") return tasksPage();
  if (parts[0] === "cluster") return clusterPage();
  if (!parts[0] || (parts[0] === "experiments" && !parts[1])) return experimentsPage();
  return notFoundPage(`No page ${path}.`);
}

// The user menu: the header's user name opens it; a click elsewhere or Escape closes it.
const userMenu = document.getElementById("usermenu");
const userButton = document.getElementById("user");
function toggleUserMenu(open) {
  userMenu.hidden = !open;
  userButton.setAttribute("aria-expanded", String(open));
  if (!open) document.getElementById("password-hint").hidden = true;
}
userButton.addEventListener("click", (ev) => { ev.stopPropagation(); toggleUserMenu(userMenu.hidden); });
userMenu.addEventListener("click", (ev) => ev.stopPropagation());
document.addEventListener("click", () => toggleUserMenu(false));
document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") toggleUserMenu(false); });
document.getElementById("change-password").addEventListener("click", () => {
  document.getElementById("password-hint").hidden = false;
});
document.getElementById("logout").addEventListener("click", async () => {
  toggleUserMenu(false);
  await api("POST", "/api/v1/auth/logout");
  userButton.hidden = true;
  userButton.textContent = "";
  location.hash = "#/login";
});
window.addEventListener("hashchange", () => route().catch(() => {}));
route().catch(() => {});
