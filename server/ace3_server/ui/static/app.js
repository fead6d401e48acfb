// The dashboard's shell: sign-in, the hash router and the navigation bar. Each page is a
// module under pages/ exporting render(root, ctx), which may return a cleanup function (called
// when the user leaves the page: it aborts the page's streams and timers).
//
// ctx = { api, params: {route params}, query: URLSearchParams, navigate(hash) }

import { Api, ApiError, forgetKey, storeKey, storedKey } from "./api.js";
import { clear, el, errorBox } from "./util.js";

const ROUTES = [
  { pattern: /^\/jobs$/, page: "jobs", nav: "jobs" },
  { pattern: /^\/jobs\/(?<id>[^/]+)$/, page: "job", nav: "jobs" },
  { pattern: /^\/compare$/, page: "compare", nav: "compare" },
  { pattern: /^\/searches$/, page: "searches", nav: "searches" },
  { pattern: /^\/searches\/(?<id>[^/]+)$/, page: "search", nav: "searches" },
  { pattern: /^\/cluster$/, page: "cluster", nav: "cluster" },
  { pattern: /^\/datasets$/, page: "datasets", nav: "datasets" },
  { pattern: /^\/datasets\/(?<id>[^/]+)$/, page: "dataset", nav: "datasets" },
];

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const signOut = document.getElementById("sign-out");
let cleanup = null;
let renderCount = 0;

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function signedOut(message) {
  forgetKey();
  showSignIn(message);
}

function api() {
  return new Api(storedKey(), () => signedOut("Your key was refused; sign in again."));
}

function leavePage() {
  if (cleanup) {
    try {
      cleanup();
    } catch (error) {
      console.error(error);
    }
  }
  cleanup = null;
}

function showSignIn(message) {
  leavePage();
  nav.hidden = true;
  signOut.hidden = true;
  clear(main);
  const input = el("input", {
    id: "api-key",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    placeholder: "ace3_...",
    required: true,
    "aria-label": "API key",
  });
  const status = el("p", { class: "error", role: "alert" }, message || "");
  const form = el(
    "form",
    { class: "sign-in", id: "sign-in" },
    el("h1", {}, "Sign in to ACE3"),
    el("p", { class: "muted" }, "Paste an API key (", el("code", {}, "ace3 keys create"), "). It stays in this tab only."),
    input,
    el("button", { type: "submit" }, "Sign in"),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    status.textContent = "";
    try {
      await new Api(key).get("/jobs", { limit: 1 });
    } catch (error) {
      status.textContent =
        error instanceof ApiError && error.status === 401 ? "That key was not accepted." : `Could not sign in: ${error.message}`;
      return;
    }
    storeKey(key);
    if (!location.hash || location.hash === "#/" || location.hash === "#") location.hash = "#/jobs";
    else route();
  });
  main.append(form);
  input.focus();
}

async function route() {
  if (!storedKey()) {
    showSignIn();
    return;
  }
  const raw = location.hash.replace(/^#/, "") || "/jobs";
  const [path, search = ""] = raw.split("?");
  const match = ROUTES.map((candidate) => ({ candidate, found: candidate.pattern.exec(path) })).find(
    ({ found }) => found,
  );
  leavePage();
  nav.hidden = false;
  signOut.hidden = false;
  clear(main);
  if (!match) {
    main.append(el("h1", {}, "Not found"), el("p", {}, el("a", { href: "#/jobs" }, "Back to the jobs")));
    return;
  }
  for (const link of nav.querySelectorAll("a")) {
    link.classList.toggle("active", link.dataset.nav === match.candidate.nav);
  }
  const thisRender = ++renderCount;
  const root = el("section", { class: `page page-${match.candidate.page}` });
  main.append(root);
  try {
    const module = await import(`./pages/${match.candidate.page}.js`);
    if (thisRender !== renderCount) return;
    const params = Object.fromEntries(
      Object.entries(match.found.groups || {}).map(([name, value]) => [name, decodeURIComponent(value)]),
    );
    const result = await module.render(root, { api: api(), params, query: new URLSearchParams(search), navigate });
    if (thisRender !== renderCount) {
      if (typeof result === "function") result();
      return;
    }
    cleanup = typeof result === "function" ? result : null;
  } catch (error) {
    if (thisRender === renderCount) root.append(errorBox(error));
  }
}

signOut.addEventListener("click", () => signedOut("Signed out."));
window.addEventListener("hashchange", route);
route();
