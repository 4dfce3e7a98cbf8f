// Builds the page into dist/: app.js (every module and dependency bundled by esbuild),
// index.html and style.css copied. `mgpu web` compiles dist/ into its binary, so a file whose
// content did not change is left alone (its time too): cargo then has nothing to rebuild.
import { build } from "esbuild";
import { mkdir, readFile, readdir, rm, writeFile } from "node:fs/promises";

const out = new URL("./dist/", import.meta.url);
const bundled = await build({
  entryPoints: [new URL("./src/main.js", import.meta.url).pathname],
  bundle: true,
  format: "esm",
  minify: true,
  target: ["chrome110", "firefox115", "safari16"],
  outfile: "app.js",
  write: false,
  logLevel: "warning",
});
const files = new Map([["app.js", bundled.outputFiles[0].contents]]);
for (const file of ["index.html", "style.css"]) {
  files.set(file, await readFile(new URL(`./src/${file}`, import.meta.url)));
}

await mkdir(out, { recursive: true });
let written = 0;
for (const [name, content] of files) {
  const target = new URL(name, out);
  const before = await readFile(target).catch(() => null);
  if (before && Buffer.compare(before, Buffer.from(content)) === 0) continue;
  await writeFile(target, content);
  written += 1;
}
for (const name of await readdir(out)) {
  if (!files.has(name)) await rm(new URL(name, out), { recursive: true, force: true });
}
console.log(`dist/: ${written} of ${files.size} files written (index.html, app.js, style.css)`);
