// The WebUI's login page and its router (every page is in its own file, loaded first).
"use strict";

async function loginPage() {
  main.innerHTML = `
    <form class="login" id="login">
      <h1>Log in to det</h1>
      <input name="username" placeholder="user" autocomplete="username" required>
      <input name="password" type="password" placeholder="password" autocomplete="current-password">
      <button class="primary" type="submit">Log in</button>
    </form>`;
  document.getElementById("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    await api("POST", "/api/v1/auth/login",
              { username: f.get("username"), password: f.get("password") || "" });
    location.hash = "#/experiments";
  });
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
                      (a.dataset.nav === "experiments" && parts[0] === "trials"));
  }
  if (parts[0] === "login") return loginPage();
  try {
    const me = await api("GET", "/api/v1/me");
    document.getElementById("user").textContent = me.username;
    document.getElementById("logout").hidden = false;
  } catch (e) {
    return;
  }
  if (parts[0] === "experiments" && parts[1]) return experimentPage(parts[1]);
  if (parts[0] === "trials" && parts[1]) return trialPage(parts[1]);
  if (parts[0] === "queue") return queuePage();
  if (parts[0] === "tasks") return tasksPage();
  if (parts[0] === "cluster") return clusterPage();
  return experimentsPage();
}

document.getElementById("logout").addEventListener("click", async () => {
  await api("POST", "/api/v1/auth/logout");
  document.getElementById("logout").hidden = true;
  document.getElementById("user").textContent = "";
  location.hash = "#/login";
});
window.addEventListener("hashchange", () => route().catch(() => {}));
route().catch(() => {});
