// The dashboard in a real browser (Debian's Chromium, driven by Playwright) against a real
// cluster that the story tests/tests/web.rs started: it passes where everything is, in env:
//   WEB_URL          the page `mgpu web` serves
//   MGPU_BIN, MGPU_SERVER, WORKDIR   to run the CLI as the harness does
//   ALICE_CREDS, BOB_CREDS, WALL_CREDS   seed files (the viewer `wall` is read-only)
//   ALICE_KEY        Alice's public key (her private subjects are named by it)
//   WEBSOCKET_PORT   the server's WebSocket listener (a proxy in front of it is cut and healed)
//   SCREENSHOTS      where each view's screenshot goes
//   CHROMIUM         the browser (default /usr/bin/chromium)
// Prints one JSON line of what it measured, and the job ids the story checks the audit for.

import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { readFile } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import { nkeys } from "@nats-io/nats-core";
import { chromium } from "playwright-core";

const env = process.env;
const shots = env.SCREENSHOTS || "screenshots";
mkdirSync(shots, { recursive: true });
const results = {};
/** The page being driven, for what it showed when a step failed. */
let current = null;

function cli(creds, args) {
  return execFileSync(env.MGPU_BIN, args, {
    cwd: env.WORKDIR,
    env: { ...env, MGPU_CREDS: creds, USER: "alice" },
    encoding: "utf8",
  }).trim();
}

function submit(args) {
  const out = cli(env.ALICE_CREDS, ["submit", "--json", ...args]);
  return JSON.parse(out).id;
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function signIn(browser, creds, query = "") {
  const page = await openSignIn(browser, query);
  await page.setInputFiles("#seed-file", creds);
  await page.click("button[type=submit]");
  await page.waitForSelector("header.top", { timeout: 10_000 });
  return page;
}

async function openSignIn(browser, query = "", base = env.WEB_URL) {
  const context = await browser.newContext({ viewport: { width: 1600, height: 1000 } });
  const page = await context.newPage();
  page.on("pageerror", (error) => console.error(`page error: ${error.message}`));
  page.on("console", (message) => console.error(`page console: ${message.text()}`));
  current = page;
  await page.goto(`${base}${query}`);
  return page;
}

async function main() {
  const browser = await chromium.launch({
    executablePath: env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  try {
    await aliceSeesTheClusterAndHerJob(browser);
    await bobCannotActOnAlicesJob(browser);
    await theWallReadsNoSecrets(browser);
    await aBadSeedIsExplained(browser);
    await anUnknownKeyAndAMissingListenerAreExplained(browser);
    await aDroppedConnectionIsSaidAndHealsByItself(browser);
    await thePageWorksFromAPlainFileServer(browser);
  } catch (error) {
    await describePage();
    throw error;
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(results));
}

async function aliceSeesTheClusterAndHerJob(browser) {
  const page = await signIn(browser, env.ALICE_CREDS);
  await page.waitForSelector("[data-node=node001] .tile", { timeout: 10_000 });
  await page.waitForFunction(() => document.querySelector("[data-testid=last-update]").textContent.includes("ago"));

  await page.click("nav a[data-view=queue]");
  await page.waitForSelector("table.jobs");
  const started = Date.now();
  const id = submit(["--name", "web-story", "--", "sh", "-c",
    "i=1; while [ $i -le 300 ]; do echo \"line $i\"; i=$((i+1)); sleep 0.01; done; sleep 600"]);
  const submitted = Date.now();
  await page.waitForSelector(`tr[data-job="${id}"]`, { timeout: 10_000 });
  results.queue_row_after_submit_ms = Date.now() - submitted;
  results.submit_cli_ms = submitted - started;
  check(results.queue_row_after_submit_ms <= 1000,
    `the job appeared ${results.queue_row_after_submit_ms} ms after mgpu submit returned (more than a second)`);
  await page.waitForSelector(`tr[data-job="${id}"].running`, { timeout: 20_000 });
  const waiting = submit(["--name", "waits-behind", "--gpus", "2", "--", "sleep", "60"]);
  await page.waitForSelector(`tr.queued[data-job="${waiting}"]`, { timeout: 10_000 });
  await page.screenshot({ path: `${shots}/queue.png` });
  // Held and released from the page. The running job's row is kept as it is meanwhile (only
  // a row whose content changed is made again).
  const runningRow = await page.$(`tr[data-job="${id}"]`);
  await page.click(`tr[data-job="${waiting}"] button[data-action=hold]`);
  await page.waitForFunction((job) => document.querySelector(`tr[data-job="${job}"] td.state`)?.textContent === "held",
    waiting, { timeout: 10_000 });
  await page.click(`tr[data-job="${waiting}"] button[data-action=release]`);
  await page.waitForFunction((job) => document.querySelector(`tr[data-job="${job}"] td.state`)?.textContent === "queued",
    waiting, { timeout: 10_000 });
  results.held_and_released = waiting;
  check(await runningRow.evaluate((row) => row.isConnected), "the queue rebuilt an unchanged row");
  await page.click("nav a[data-view=cluster]");
  await page.waitForSelector(`[data-node=node001] .tile.busy a[href="#job/${id}"]`, { timeout: 10_000 });
  // The top of the page only, the notices dismissed: the README shows this one.
  for (const dismiss of await page.$$(".notices button")) await dismiss.click();
  await page.screenshot({ path: `${shots}/cluster.png`, clip: { x: 0, y: 0, width: 1600, height: 240 } });
  await page.click("nav a[data-view=queue]");

  await page.click(`tr[data-job="${id}"] a`);
  await page.waitForFunction(() => document.querySelectorAll("pre.output .line").length >= 300, null, { timeout: 20_000 });
  const lines = await page.$$eval("pre.output .line", (all) => all.map((l) => l.textContent));
  const expected = Array.from({ length: 300 }, (_, i) => `line ${i + 1}`);
  check(JSON.stringify(lines.slice(0, 300)) === JSON.stringify(expected),
    `output lines out of order or missing: ${lines.slice(0, 5).join(" | ")} …`);
  await page.screenshot({ path: `${shots}/job.png` });
  results.job = id;

  // Cancelled from the page: the button signs the request in the browser.
  await page.click(".actions button[data-action=cancel]");
  await page.waitForFunction(() => /cancelled/.test(document.querySelector("dd[data-field=state]")?.textContent || ""),
    null, { timeout: 20_000 });
  results.cancelled_from_page = id;

  // Her cancelled job ran a few seconds on one GPU: the usage view counts it.
  await page.click("nav a[data-view=usage]");
  await page.waitForFunction(() => /history: (everyone's|your own)/.test(document.querySelector(".usage .summary")?.textContent || "")
    && [...document.querySelectorAll("[data-chart=by-user] .chart-label")].some((l) => l.textContent === "alice"),
    null, { timeout: 15_000 });
  await page.screenshot({ path: `${shots}/usage.png` });

  // The theme button switches, and the choice outlives a reload.
  const themeBefore = await page.evaluate(() => document.documentElement.dataset.theme);
  await page.click("header.top button.theme");
  const themeAfter = await page.evaluate(() => document.documentElement.dataset.theme);
  check(themeBefore !== themeAfter && ["light", "dark"].includes(themeAfter), `the theme button left the theme ${themeBefore} (now ${themeAfter})`);
  if (themeAfter !== "dark") await page.click("header.top button.theme");
  await page.goto(`${env.WEB_URL}#cluster`);
  await page.reload();
  await page.waitForSelector("[data-node=node001] .tile");
  const themeReloaded = await page.evaluate(() => document.documentElement.dataset.theme);
  check(themeReloaded === "dark", `the dark theme was not kept across a reload: ${themeReloaded}`);
  results.theme_toggled = `${themeBefore} -> ${themeAfter}, dark kept across a reload`;
  await page.screenshot({ path: `${shots}/cluster-dark.png` });
  await page.context().close();
}

async function bobCannotActOnAlicesJob(browser) {
  const id = submit(["--name", "alices", "--", "sleep", "600"]);
  results.alices_job = id;
  const page = await signIn(browser, env.BOB_CREDS);
  await page.goto(`${env.WEB_URL}#job/${id}`);
  await page.waitForSelector("dd[data-field=user]", { timeout: 10_000 });
  check((await page.$$(".actions button")).length === 0, "bob's page offers actions on alice's job");
  // The page's own request path, as bob: stored, then refused by the scheduler (not the page).
  await page.evaluate((job) => window.mgpu.request(job, "cancel"), id);
  await new Promise((resolve) => setTimeout(resolve, 3000));
  const state = JSON.parse(cli(env.ALICE_CREDS, ["show", "--json", id])).state;
  check(["running", "queued"].includes(state), `bob's cancel ended alice's job: ${JSON.stringify(state)}`);
  cli(env.ALICE_CREDS, ["cancel", id]);
  await page.context().close();
}

async function theWallReadsNoSecrets(browser) {
  const page = await signIn(browser, env.WALL_CREDS, "?wall=2");
  await page.waitForSelector("[data-node=node001] .tile", { timeout: 10_000 });
  await page.screenshot({ path: `${shots}/wall.png` });
  // The kiosk cycles by itself: cluster, queue, cluster again, with no controls to act.
  const cycled = [];
  for (const view of ["queue", "cluster"]) {
    await page.waitForFunction((name) => document.querySelector(`nav a[data-view=${name}]`)?.hasAttribute("aria-current"),
      view, { timeout: 10_000 });
    cycled.push(view);
    if (view === "queue") check((await page.$$(".actions button, tr button")).length === 0, "the wall's queue offers buttons");
  }
  results.wall_cycled = cycled;
  await page.goto(`${env.WEB_URL}?wall#usage`);
  await page.waitForFunction(() => /gives this principal no history \(.*[Pp]ermissions [Vv]iolation/.test(document.querySelector(".usage .summary")?.textContent || ""),
    null, { timeout: 15_000 });
  const key = env.ALICE_KEY;
  check(/^U[A-Z2-7]{55}$/.test(key || ""), `ALICE_KEY is not a user's public key: ${key}`);
  const refused = await page.evaluate(async ({ job, key }) => {
    const { conn } = window.mgpu;
    const outcome = {};
    const attempt = async (name, work) => {
      try {
        await work();
        outcome[name] = "allowed";
      } catch (error) {
        outcome[name] = String(error.message || error);
      }
    };
    await attempt("environment", async () => {
      const kv = await conn.kvm.open("mgpu-job-env");
      await kv.get(`${key}.${job}`);
    });
    await attempt("private_output", async () => {
      const consumer = await conn.js.consumers.get("MGPU_OUTPUT", { filter_subjects: `users.${key}.jobs.${job}.output` });
      await consumer.info();
    });
    await attempt("history", async () => {
      const consumer = await conn.js.consumers.get("MGPU_HISTORY", { filter_subjects: `history.${key}.>` });
      await consumer.info();
    });
    await attempt("cancel", () => window.mgpu.request(job, "cancel"));
    return outcome;
  }, { job: results.alices_job, key });
  results.wall_refused = refused;
  for (const [what, answer] of Object.entries(refused)) {
    check(answer !== "allowed", `the wall viewer could read or do ${what}`);
    check(/permissions? violation|permission denied|authorization/i.test(answer), `the wall's ${what} failed, but not by the server's refusal: ${answer}`);
  }
  await page.context().close();
}

async function aBadSeedIsExplained(browser) {
  const context = await browser.newContext();
  const page = await context.newPage();
  await page.goto(env.WEB_URL);
  await page.setInputFiles("#seed-file", { name: "bad.nk", mimeType: "text/plain", buffer: Buffer.from("SUNOTASEED\n") });
  await page.click("button[type=submit]");
  await page.waitForFunction(() => /no nkey seed/.test(document.querySelector(".sign-in .error").textContent));
  await context.close();
}

async function anUnknownKeyAndAMissingListenerAreExplained(browser) {
  const stranger = nkeys.createUser();
  let page = await openSignIn(browser);
  await page.setInputFiles("#seed-file", { name: "stranger.nk", mimeType: "text/plain", buffer: Buffer.from(stranger.getSeed()) });
  await page.click("button[type=submit]");
  await page.waitForFunction(() => /refused this key/.test(document.querySelector(".sign-in .error").textContent),
    null, { timeout: 10_000 });
  await page.context().close();

  const nothing = await freePort();
  page = await openSignIn(browser, `?ws=ws://127.0.0.1:${nothing}`);
  await page.setInputFiles("#seed-file", env.ALICE_CREDS);
  await page.click("button[type=submit]");
  await page.waitForFunction(() => /cannot reach the NATS WebSocket listener/.test(document.querySelector(".sign-in .error").textContent),
    null, { timeout: 15_000 });
  await page.context().close();
}

/** The built page (dist/) served as plain files, without `mgpu web` (no config.json): opened
 * with `?ws=`, it signs in and shows the cluster all the same. */
async function thePageWorksFromAPlainFileServer(browser) {
  const dist = new URL("../../dist/", import.meta.url);
  const server = http.createServer(async (request, response) => {
    const name = new URL(request.url, "http://x").pathname.replace(/^\/+/, "") || "index.html";
    try {
      if (name.includes("..")) throw new Error("outside");
      const body = await readFile(new URL(name, dist));
      const type = name.endsWith(".js") ? "text/javascript" : name.endsWith(".css") ? "text/css" : "text/html";
      response.writeHead(200, { "content-type": type }).end(body);
    } catch {
      response.writeHead(404).end();
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const base = `http://127.0.0.1:${server.address().port}/`;
    const page = await openSignIn(browser, `?ws=ws://127.0.0.1:${env.WEBSOCKET_PORT}`, base);
    await page.setInputFiles("#seed-file", env.ALICE_CREDS);
    await page.click("button[type=submit]");
    await page.waitForSelector("[data-node=node001] .tile", { timeout: 15_000 });
    results.from_plain_file_server = base;
    await page.context().close();
  } finally {
    server.close();
  }
}

/** A TCP proxy in front of the WebSocket listener that can be cut (every connection closed,
 * new ones refused) and healed. */
async function cuttableProxy(targetPort) {
  const sockets = new Set();
  let cut = false;
  const server = net.createServer((client) => {
    if (cut) return client.destroy();
    const upstream = net.connect(targetPort, "127.0.0.1");
    for (const [from, to] of [[client, upstream], [upstream, client]]) {
      sockets.add(from);
      from.on("error", () => to.destroy());
      from.on("close", () => { sockets.delete(from); to.destroy(); });
      from.pipe(to);
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: server.address().port,
    cut() { cut = true; for (const socket of sockets) socket.destroy(); },
    heal() { cut = false; },
    close() { server.close(); for (const socket of sockets) socket.destroy(); },
  };
}

async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function aDroppedConnectionIsSaidAndHealsByItself(browser) {
  const proxy = await cuttableProxy(Number(env.WEBSOCKET_PORT));
  try {
    const page = await signIn(browser, env.ALICE_CREDS, `?ws=ws://127.0.0.1:${proxy.port}#queue`);
    await page.waitForSelector("table.jobs");
    await page.waitForFunction(() => !document.querySelector("[data-testid=last-update]").classList.contains("stale"));
    proxy.cut();
    await page.waitForFunction(() => /reconnecting/.test(document.querySelector(".status").textContent),
      null, { timeout: 10_000 });
    const id = submit(["--name", "while-cut-off", "--", "sleep", "600"]);
    // No update for 10 s: the age turns red and the view is greyed, never shown as live.
    await page.waitForFunction(() => document.querySelector("[data-testid=last-update]").classList.contains("stale")
      && document.querySelector("main").classList.contains("stale"), null, { timeout: 20_000 });
    await page.screenshot({ path: `${shots}/disconnected.png` });
    proxy.heal();
    await page.waitForFunction(() => /connected again/.test(document.querySelector(".status").textContent),
      null, { timeout: 20_000 });
    await page.waitForSelector(`tr[data-job="${id}"]`, { timeout: 10_000 });
    await page.waitForFunction(() => !document.querySelector("main").classList.contains("stale"), null, { timeout: 10_000 });
    results.reconnected_and_caught_up = id;
    cli(env.ALICE_CREDS, ["cancel", id]);
    await page.context().close();
  } finally {
    proxy.close();
  }
}

/** What the page showed when a step failed: its notices, its store, a screenshot. */
async function describePage() {
  if (!current) return;
  try {
    console.error(`the page's notices: ${await current.textContent(".notices")}`);
    console.error(`the page's store: ${await current.evaluate(() => {
      const store = window.mgpu && window.mgpu.store;
      return store ? JSON.stringify({ nodes: store.nodes.size, jobs: [...store.jobs.keys()], version: store.version }) : "none";
    })}`);
    await current.screenshot({ path: `${shots}/failure.png` });
  } catch (inspecting) {
    console.error(`(the page could not be inspected: ${inspecting.message})`);
  }
}

main().catch((error) => {
  console.error(`dashboard story failed: ${error.stack || error}`);
  process.exit(1);
});
