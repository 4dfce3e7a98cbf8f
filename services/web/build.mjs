// Builds the page into dist/: app.js (every module and dependency bundled by esbuild),
// index.html and style.css copied. `mgpu web` compiles dist/ into its binary.
import { build } from "esbuild";
import { copyFile, mkdir, rm } from "node:fs/promises";

const out = new URL("./dist/", import.meta.url);
await rm(out, { recursive: true, force: true });
await mkdir(out, { recursive: true });
await build({
  entryPoints: [new URL("./src/main.js", import.meta.url).pathname],
  bundle: true,
  format: "esm",
  minify: true,
  target: ["chrome110", "firefox115", "safari16"],
  outfile: new URL("app.js", out).pathname,
  logLevel: "warning",
});
for (const file of ["index.html", "style.css"]) {
  await copyFile(new URL(`./src/${file}`, import.meta.url), new URL(file, out));
}
console.log("built dist/ (index.html, app.js, style.css)");
