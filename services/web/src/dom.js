// A small element builder and the formats every view shares (durations, sizes, ids).

/** An element: h("div.tile.busy", {title: "…"}, child, "text", …). */
export function h(spec, attributes = {}, ...children) {
  const [tag, ...classes] = spec.split(".");
  const element = document.createElement(tag || "div");
  if (classes.length) element.className = classes.join(" ");
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(element.dataset, value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** The short form of a job id, as the CLI prints it. */
export function shortId(id) {
  return String(id).slice(0, 8);
}

/** "3 s", "4 min", "2 h 5 min", "3 d". */
export function ago(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return `${hours} h ${m % 60} min`;
  return `${Math.floor(hours / 24)} d`;
}

/** MiB as "512 MiB", "79.6 GiB". */
export function mib(value) {
  if (value === undefined || value === null) return "";
  return value >= 1024 ? `${(value / 1024).toFixed(1)} GiB` : `${value} MiB`;
}

/** A job's GPU request ("2", "0.5", "1 of 2 nodes"). */
export function gpusOf(spec) {
  if (!spec) return "";
  const gpus = typeof spec.gpus === "object" ? JSON.stringify(spec.gpus) : String(spec.gpus ?? "");
  return spec.nodes > 1 ? `${gpus} × ${spec.nodes} nodes` : gpus;
}

/** The name a job shows: its --name, else its command. */
export function jobTitle(record) {
  const spec = record.spec || {};
  return spec.name || (spec.command || []).join(" ") || "(script)";
}
