// The dashboard over wss:// (a cluster that requires TLS: its WebSocket listener speaks TLS
// with the cluster's own certificate). Chromium is told to trust it as a lab's browsers would
// once the lab's CA is installed. Signs in with ALICE_CREDS at WEB_URL and waits for the node.
import { chromium } from "playwright-core";

const env = process.env;
const browser = await chromium.launch({
  executablePath: env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--ignore-certificate-errors"],
});
try {
  const page = await (await browser.newContext({ ignoreHTTPSErrors: true })).newPage();
  await page.goto(env.WEB_URL);
  const websocket = await page.inputValue("input[name=server]");
  if (!websocket.startsWith("wss://")) throw new Error(`the page connects to ${websocket}, not wss://`);
  await page.setInputFiles("#seed-file", env.ALICE_CREDS);
  await page.click("button[type=submit]");
  await page.waitForSelector("[data-node=node001] .tile", { timeout: 15_000 });
  console.log(JSON.stringify({ websocket, signed_in: true }));
} catch (error) {
  console.error(`tls story failed: ${error.stack || error}`);
  process.exitCode = 1;
} finally {
  await browser.close();
}
