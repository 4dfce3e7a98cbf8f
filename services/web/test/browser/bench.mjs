// The dashboard's benchmark, run by `scripts/bench.sh --only web` (tests/benches/mgpu-bench/
// web.rs), which wrote a fleet straight into a server (1 000 nodes × 8 GPUs, 10 000 jobs),
// keeps their heartbeats coming and makes one job print 10 000 lines a second. In Debian's
// Chromium it measures: the time from signing in to every GPU tile drawn, how long each redraw
// takes while heartbeats arrive, the time to draw the queue, and the tab's memory after
// following the busy job's output for OUTPUT_SECONDS. Prints one JSON line.
//   env: WEB_URL, CREDS, GPUS (tiles expected), JOBS (records), RUNNING (busy tiles expected),
//   OUTPUT_JOB, OUTPUT_SECONDS, CHROMIUM,
//   PROFILE_DIR (optional: CPU profiles of the first render and of the queue's, written there)

import { chromium } from "playwright-core";

const env = process.env;
const results = {};

function summary(samples) {
  const sorted = [...samples].sort((a, b) => a - b);
  const rank = (q) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
  return { count: sorted.length, median: rank(0.5), p99: rank(0.99), max: sorted.at(-1) };
}

/** With PROFILE_DIR set, a CPU profile of the page (Chrome's .cpuprofile, which DevTools
 * opens) from here to stopProfile. */
async function startProfile(page) {
  if (!env.PROFILE_DIR) return null;
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Profiler.enable");
  await cdp.send("Profiler.setSamplingInterval", { interval: 200 });
  await cdp.send("Profiler.start");
  return cdp;
}

async function stopProfile(cdp, name) {
  if (!cdp) return;
  const { profile } = await cdp.send("Profiler.stop");
  const { writeFile } = await import("node:fs/promises");
  const path = `${env.PROFILE_DIR}/${name}.cpuprofile`;
  await writeFile(path, JSON.stringify(profile));
  console.error(`[bench]   profile of the page written to ${path}`);
}

async function main() {
  const browser = await chromium.launch({
    executablePath: env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--enable-precise-memory-info"],
  });
  try {
    const page = await (await browser.newContext({ viewport: { width: 1920, height: 1080 } })).newPage();
    await page.goto(env.WEB_URL);
    await page.setInputFiles("#seed-file", env.CREDS);
    const profiler = await startProfile(page);
    const started = Date.now();
    await page.click("button[type=submit]");
    const gpus = Number(env.GPUS);
    // Where the first render's time goes: when the connection was up, when every heartbeat
    // and every record had arrived, when every tile was drawn.
    const milestones = {};
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline) {
      const seen = await page.evaluate(() => ({
        connected: Boolean(window.mgpu),
        nodes: window.mgpu ? window.mgpu.store.nodes.size : 0,
        jobs: window.mgpu ? window.mgpu.store.jobs.size : 0,
        tiles: document.querySelectorAll(".tile").length,
        busy: document.querySelectorAll(".tile.busy").length,
      }));
      const at = Date.now() - started;
      if (seen.connected) milestones.connected_ms ??= at;
      if (seen.nodes >= gpus / 8) milestones.all_heartbeats_ms ??= at;
      if (seen.jobs >= Number(env.JOBS)) milestones.all_records_ms ??= at;
      if (seen.tiles >= gpus) milestones.all_tiles_ms ??= at;
      if (seen.busy >= Number(env.RUNNING)) milestones.jobs_on_tiles_ms ??= at;
      // Full: every tile drawn, every record read, and the running jobs on their tiles.
      const full = ["all_tiles_ms", "all_records_ms", "jobs_on_tiles_ms"];
      if (full.every((name) => milestones[name] !== undefined)) break;
      await page.waitForTimeout(50);
    }
    if (["all_tiles_ms", "all_records_ms", "jobs_on_tiles_ms"].some((name) => milestones[name] === undefined)) {
      throw new Error(`not every tile, record or running job was drawn: ${JSON.stringify(milestones)}`);
    }
    results.first_full_render_ms = Math.max(milestones.all_tiles_ms, milestones.all_records_ms, milestones.jobs_on_tiles_ms);
    results.first_render_milestones = milestones;
    await stopProfile(profiler, "first-render");

    // Heartbeats keep arriving: every redraw they cause is timed by the page.
    await page.evaluate(() => window.mgpu.frames.splice(0));
    await page.waitForTimeout(20_000);
    const frames = await page.evaluate(() => [...window.mgpu.frames]);
    results.update_frame_ms = summary(frames);
    results.updates_seen = frames.length;

    await page.evaluate(() => window.mgpu.frames.splice(0));
    const queueProfiler = await startProfile(page);
    const queueStarted = Date.now();
    await page.click("nav a[data-view=queue]");
    await page.waitForFunction((jobs) => document.querySelector(".summary")?.textContent.includes(`${jobs} jobs`)
      && document.querySelectorAll("table.jobs tbody tr").length > 0, Number(env.JOBS), { timeout: 60_000, polling: "raf" });
    results.queue_render_ms = Date.now() - queueStarted;
    results.queue_redraws_ms = summary(await page.evaluate(() => [...window.mgpu.frames]));
    await stopProfile(queueProfiler, "queue");
    console.error(`[bench]   queue drawn ${results.queue_render_ms} ms after the click; its redraws: ${JSON.stringify(results.queue_redraws_ms)}`);

    // A job printing without end: follow it, then read the tab's memory.
    await page.goto(`${env.WEB_URL}#job/${env.OUTPUT_JOB}`);
    await page.waitForSelector("pre.output .line", { timeout: 60_000 });
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Performance.enable");
    const metric = async () => Object.fromEntries((await cdp.send("Performance.getMetrics")).metrics.map((m) => [m.name, m.value]));
    const before = await metric();
    await page.waitForTimeout(Number(env.OUTPUT_SECONDS) * 1000);
    await cdp.send("HeapProfiler.collectGarbage");
    const after = await metric();
    const shown = await page.evaluate(() => ({
      lines: document.querySelectorAll("pre.output .line").length,
      last: document.querySelector("pre.output .line:last-child")?.textContent || "",
    }));
    results.output = {
      seconds: Number(env.OUTPUT_SECONDS),
      heap_mib_before: before.JSHeapUsedSize / 1048576,
      heap_mib_after: after.JSHeapUsedSize / 1048576,
      dom_nodes_after: after.Nodes,
      lines_shown: shown.lines,
      last_line: shown.last.slice(0, 80),
    };
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(results));
}

main().catch((error) => {
  console.error(`web benchmark failed: ${error.stack || error}`);
  process.exit(1);
});
