// The page: finds the NATS WebSocket listener (config.json, which `mgpu web` serves, or
// ?ws=URL), signs in with the user's seed, starts the feeds and shows one view at a time
// (#cluster, #queue, #job/<id>, #usage); ?wall cycles cluster and queue for a wall screen
// (every 20 s; ?wall=SECONDS to choose). Every
// frame that something changed redraws the view; a clock shows the age of the last update so
// stale data never looks live.

import { requestAction } from "./actions.js";
import { ago, h, shortId } from "./dom.js";
import { startFeeds } from "./feeds.js";
import { connect, forgetSeed, readSeedFile, storedSeed } from "./session.js";
import { emptyStore } from "./store.js";
import { ClusterView } from "./views/cluster.js";
import { JobView } from "./views/job.js";
import { QueueView } from "./views/queue.js";
import { UsageView } from "./views/usage.js";

/** Data older than this is marked stale (a heartbeat comes every 2 s). */
const STALE_AFTER_MS = 10_000;
/** How long a wall screen shows each view, unless `?wall=SECONDS` says. */
const WALL_CYCLE_MS = 20_000;

const params = new URLSearchParams(location.search);
const wall = params.has("wall");
const wallCycleMs = Number(params.get("wall")) >= 1 ? Number(params.get("wall")) * 1000 : WALL_CYCLE_MS;
const app = {
  store: emptyStore(),
  conn: null,
  view: null,
  viewName: "",
  myName: null,
  drawnVersion: -1,
  frames: [], // how long the last redraws took (ms), for the benchmark
  drawnAt: 0, // when the view was last redrawn (the frame clock)
};

const status = h("span.status", { role: "status" }, "not connected");
const age = h("span.age", { "data-testid": "last-update" }, "");
const notices = h("div.notices", { role: "alert" });
const main = h("main", { id: "view" });

document.documentElement.dataset.theme = localStorage.getItem("mgpu.theme") ||
  (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
if (wall) document.body.classList.add("wall");

function toggleTheme() {
  const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
  document.documentElement.dataset.theme = next;
  localStorage.setItem("mgpu.theme", next);
}

function notice(text, kind = "bad") {
  const item = h(`p.notice.${kind}`, {}, text, h("button", { type: "button", "aria-label": "dismiss", onclick: () => item.remove() }, "×"));
  notices.append(item);
  if (kind !== "bad") setTimeout(() => item.remove(), 6000);
}

function setStatus(text, kind) {
  status.textContent = text;
  status.className = `status ${kind}`;
}

async function websocketUrl() {
  if (params.get("ws")) return params.get("ws");
  try {
    const response = await fetch("config.json", { cache: "no-store" });
    if (response.ok) {
      const config = await response.json();
      if (config.websocket) return config.websocket;
    }
  } catch {
    // Served by a plain file server: no config.json.
  }
  return `ws://${location.hostname || "127.0.0.1"}:4280`;
}

function header() {
  const nav = h("nav", {}, [["cluster", "Cluster"], ["queue", "Queue"], ["usage", "Usage"]].map(([name, label]) =>
    h("a", { href: `#${name}`, "data-view": name }, label)));
  const me = h("span.me", {}, "");
  const signOut = h("button", { type: "button", onclick: () => { forgetSeed(); location.reload(); } }, "Sign out");
  const theme = h("button.theme", { type: "button", onclick: toggleTheme, title: "light or dark" }, "Theme");
  return h("header.top", {}, h("h1", {}, "mgpu"), nav, h("span.spacer"), status, age, me, theme, signOut);
}

function signInForm(url, problem) {
  const file = h("input", { type: "file", name: "seed", id: "seed-file" });
  const server = h("input", { type: "url", name: "server", value: url, size: 32 });
  const error = h("p.error", { role: "alert" }, problem || "");
  const form = h("form.sign-in", {
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = "";
      const seed = await readSeedFile(file.files[0]);
      if (seed instanceof Error) {
        error.textContent = seed.message;
        return;
      }
      await start(server.value, seed, (message) => { error.textContent = message; });
    },
  },
  h("h1", {}, "mgpu"),
  h("p", {}, "Sign in with your nkey seed file (", h("code", {}, ".mgpu/auth/keys/user-<name>.nk"),
    "). It stays in this tab and is never sent: the server checks a signature made with it."),
  h("label", {}, "seed file ", file),
  h("label", {}, "server ", server),
  h("button", { type: "submit" }, "Sign in"),
  error);
  document.body.replaceChildren(form);
}

/** Connects and shows the dashboard, or hands the error to `failed`. */
async function start(url, seed, failed) {
  setStatus(`connecting to ${url}…`, "");
  try {
    app.conn = await connect(url, seed, setStatus);
  } catch (error) {
    failed(error.message);
    return;
  }
  setStatus("connected", "good");
  // For the browser console (and the browser tests): the connection as signed in, and the
  // page's own request path. Everything it can do, the server allows this key anyway.
  window.mgpu = {
    conn: app.conn,
    store: app.store,
    frames: app.frames,
    request: (id, action) => requestAction(app.conn, id, action, app.myName || "unknown"),
  };
  document.body.replaceChildren(header(), notices, main);
  startFeeds(app.conn, app.store, () => {}, (text) => notice(text));
  addEventListener("hashchange", route);
  route();
  requestAnimationFrame(frame);
  tick();
  setInterval(tick, 1000);
  if (wall) setInterval(() => { location.hash = app.viewName === "cluster" ? "#queue" : "#cluster"; }, wallCycleMs);
}

function isMine(record) {
  const mine = record.user_key === app.conn.publicKey;
  if (mine && !app.myName) {
    app.myName = record.user;
    tick();
  }
  return mine;
}

async function act(record, action) {
  try {
    await requestAction(app.conn, record.id, action, app.myName || record.user);
    notice(`${action} of job ${shortId(record.id)} sent`, "good");
  } catch (error) {
    notice(error.message);
  }
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "cluster";
  if (app.view && app.view.close) app.view.close();
  const context = { openJob: (id) => { location.hash = `#job/${id}`; }, act, isMine, conn: app.conn, problem: (t) => notice(t) };
  if (hash.startsWith("job/")) {
    app.viewName = "job";
    app.view = new JobView(main, app.store, hash.slice(4), context);
  } else if (hash === "usage") {
    app.viewName = "usage";
    app.view = new UsageView(main, app.store, context);
  } else if (hash === "queue") {
    app.viewName = "queue";
    app.view = new QueueView(main, app.store, context);
  } else {
    app.viewName = "cluster";
    app.view = new ClusterView(main, app.store, context);
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.toggleAttribute("aria-current", link.dataset.view === app.viewName);
  }
  app.drawnVersion = -1;
}

/** How long the last redraws took (ms), newest last: the benchmark reads them. */
const FRAMES_KEPT = 2000;

/** At most one redraw in this many ms: twenty a second is live to the eye, and leaves the
 * page's one thread to read the bus (10 000 records at sign-in, 200 heartbeats a second). */
const FRAME_MS = 50;

function frame(now) {
  requestAnimationFrame(frame);
  if (now - app.drawnAt < FRAME_MS) return;
  if (app.view && (app.store.version !== app.drawnVersion || app.viewName === "job")) {
    app.drawnAt = now;
    app.drawnVersion = app.store.version;
    const started = performance.now();
    app.view.render(Date.now());
    app.frames.push(performance.now() - started);
    if (app.frames.length > FRAMES_KEPT) app.frames.splice(0, app.frames.length - FRAMES_KEPT);
  }
}

/** Once a second: the age of the last update, and stale data marked as such. */
function tick() {
  const last = app.store.lastUpdateMs;
  const stale = last === null || Date.now() - last > STALE_AFTER_MS;
  age.textContent = last === null ? "no data yet" : `last update ${ago(Date.now() - last)} ago`;
  age.classList.toggle("stale", stale);
  main.classList.toggle("stale", stale);
  if (app.view && app.viewName !== "job") app.view.render(Date.now());
  const me = document.querySelector("header.top .me");
  if (me && app.conn) {
    const key = app.conn.publicKey;
    me.textContent = `signed in as ${app.myName || shortId(key)}`;
    me.title = key;
  }
}

(async () => {
  const url = await websocketUrl();
  const seed = storedSeed();
  if (seed) await start(url, seed, (message) => signInForm(url, message));
  else signInForm(url);
})();
