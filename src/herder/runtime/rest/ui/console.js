// herder's web console: plain JavaScript over the worker's REST API, no build step.
// Every second it reads /admin/cluster (workers, group, ensemble, task metrics) and
// /connectors?expand=status&expand=info, and redraws. Actions are Connect's REST calls.
"use strict";

const REFRESH_MS = 1000;
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function pill(state) {
  return el("span", { class: `pill state-${state}`, "data-state": state }, state);
}

function fmt(value, digits = 0) {
  if (value === undefined || value === null) return "–";
  if (typeof value !== "number") return String(value);
  return value.toLocaleString("en-US", { maximumFractionDigits: digits, useGrouping: false });
}

function ago(ms) {
  if (ms === undefined || ms === null) return "never";
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

async function api(method, path, body) {
  const options = { method, headers: {} };
  if (body !== undefined) {
    options.headers["content-type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const reply = await fetch(path, options);
  const text = await reply.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = text; }
  if (!reply.ok) {
    const message = data && data.message ? data.message : `${reply.status} ${reply.statusText}`;
    throw new Error(message);
  }
  return data;
}

// -- drawing ---------------------------------------------------------------------------

function drawCluster(cluster) {
  const worker = cluster.worker;
  $("worker-id").textContent = `worker ${worker.id}`;
  const health = $("health");
  health.textContent = worker.health.ok ? "healthy" : "not ready";
  health.className = `pill ${worker.health.ok ? "healthy" : "unhealthy"}`;
  health.title = worker.health.message;
  $("group-id").textContent = worker.group_id;
  $("leader").textContent = worker.leader_url || "none known";
  const group = cluster.group || {};
  $("generation").textContent = fmt(group.generation ?? worker.generation);
  $("group-state").textContent = group.state || group.error || "–";
  const rebalance = worker.rebalance || {};
  const took = rebalance["rebalance-max-time-ms"];
  const last = (rebalance.timeline || []).at(-1);
  const lastGroup = (group.rebalances || []).at(-1);
  $("last-rebalance").textContent = lastGroup
    ? `${ago(Date.now() - lastGroup.started_ms)}, took ${fmt(lastGroup.took_ms)} ms (generation ${lastGroup.generation})`
    : last
      ? `${ago(last["ago-ms"])}, took ${fmt(last["took-ms"])} ms (generation ${last.epoch})`
      : (took === undefined ? "none yet" : "–");
  $("rebalance-cause").textContent = group.rebalance_reason || "–";

  const workers = $("workers");
  workers.replaceChildren(...(group.workers || []).map((w) => el("tr", { "data-worker": w.id },
    el("td", {}, w.id),
    el("td", {}, /^https?:\/\//.test(w.url || "") ? el("a", { href: `${w.url}/ui` }, w.url) : (w.url || "–")),
    el("td", {}, w.leader ? "leader" : "member"),
    el("td", { class: "num" }, w.connectors.length),
    el("td", { class: "num", "data-testid": `worker-tasks-${w.id}` }, w.tasks.length),
  )));

  // the group's rebalances as the coordinator saw them (with their causes), newest
  // first; this worker's own if the coordinator could not be asked
  const timeline = $("timeline");
  const groupEntries = (group.rebalances || []).slice().reverse();
  const entries = groupEntries.length
    ? groupEntries.map((r) => el("li", { "data-generation": r.generation },
        el("strong", {}, `generation ${r.generation}`),
        ` at ${new Date(r.started_ms).toLocaleTimeString()}, took ${fmt(r.took_ms)} ms: `,
        el("span", { class: "muted" }, r.reason || "?")))
    : (rebalance.timeline || []).slice().reverse().map((r) => el("li", {},
        `generation ${r.epoch}: ${ago(r["ago-ms"])}, took ${fmt(r["took-ms"])} ms, leader ${r["leader-name"] || "?"}`));
  timeline.replaceChildren(...entries);
  if (!entries.length) timeline.replaceChildren(el("li", { class: "muted" }, "none yet"));

  const servers = $("ensemble");
  if (!Array.isArray(cluster.ensemble)) {
    servers.replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "error" },
      (cluster.ensemble || {}).error || "the ensemble did not answer")));
    return;
  }
  servers.replaceChildren(...cluster.ensemble.map((s) =>
    el("tr", { "data-server": s.server_id ?? s.address },
      el("td", {}, s.server_id ?? "?"),
      el("td", {}, s.address),
      el("td", { "data-testid": `server-role-${s.server_id}` }, s.error ? el("span", { class: "error" }, s.error) : s.role),
      el("td", {}, s.leader ?? "–"),
      el("td", {}, s.epoch ?? "–"),
      el("td", {}, s.last_zxid ?? "–"),
      el("td", {}, (s.learners || []).join(", ") || "–"),
      el("td", {}, s.last_sync || "–"),
      el("td", { class: "num" }, s.sessions ?? "–"),
    )));
}

function connectorActions(name, state) {
  const act = (label, method, path) => el("button", {
    type: "button", "data-testid": `${label}-${name}`,
    onclick: () => runAction(`${label} ${name}`, method, path),
  }, label);
  const base = `/connectors/${encodeURIComponent(name)}`;
  return [
    state === "PAUSED" || state === "STOPPED"
      ? act("resume", "PUT", `${base}/resume`)
      : act("pause", "PUT", `${base}/pause`),
    act("stop", "PUT", `${base}/stop`),
    act("restart", "POST", `${base}/restart?includeTasks=true`),
    el("button", {
      type: "button", "data-testid": `delete-${name}`,
      onclick: () => { if (confirm(`Delete connector ${name}?`)) runAction(`delete ${name}`, "DELETE", base); },
    }, "delete"),
  ];
}

function trace(text) {
  return text ? el("details", {}, el("summary", {}, "trace"), el("pre", {}, text)) : null;
}

function drawConnectors(connectors, cluster) {
  const rows = [];
  const taskRows = [];
  const metrics = new Map((cluster.tasks || []).map((t) => [`${t.connector}-${t.task}`, t]));
  for (const name of Object.keys(connectors).sort()) {
    const status = connectors[name].status || {};
    const state = (status.connector || {}).state || "UNASSIGNED";
    const tasks = status.tasks || [];
    rows.push(el("tr", { "data-connector": name },
      el("td", {}, name),
      el("td", {}, status.type || (connectors[name].info || {}).type || "–"),
      el("td", { "data-testid": `state-${name}` }, pill(state), trace((status.connector || {}).trace)),
      el("td", {}, (status.connector || {}).worker_id || "–"),
      el("td", {}, tasks.map((t) => pill(t.state))),
      el("td", { class: "actions" }, connectorActions(name, state)),
    ));
    for (const task of tasks) {
      const id = `${name}-${task.id}`;
      const m = (metrics.get(id) || {}).metrics || {};
      const sink = status.type === "sink";
      const records = sink ? m["sink-record-send-total"] : m["source-record-write-total"];
      const rate = sink ? m["sink-record-send-rate"] : m["source-record-write-rate"];
      taskRows.push(el("tr", { "data-task": id },
        el("td", {}, id),
        el("td", { "data-testid": `task-state-${id}` }, pill(task.state), trace(task.trace)),
        el("td", {}, task.worker_id || "–"),
        el("td", { class: "num", "data-testid": `records-${id}` }, fmt(records)),
        el("td", { class: "num", "data-testid": `rate-${id}` }, fmt(rate, 1)),
        el("td", { class: "num", "data-testid": `lag-${id}` }, sink ? fmt(m["sink-task-lag-records"]) : "–"),
        el("td", { class: "num", "data-testid": `lag-seconds-${id}` }, sink ? fmt(m["sink-task-lag-seconds"], 1) : "–"),
        el("td", { class: "num", "data-testid": `errors-${id}` }, fmt(m["total-record-errors"])),
        el("td", { class: "num", "data-testid": `dlq-${id}` }, fmt(m["deadletterqueue-produce-requests"])),
      ));
    }
  }
  $("connectors").replaceChildren(...rows);
  if (!rows.length) $("connectors").replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no connectors yet")));
  $("tasks").replaceChildren(...taskRows);
}

// -- actions -----------------------------------------------------------------------------

async function runAction(what, method, path) {
  const box = $("action-error");
  try {
    await api(method, path);
    box.hidden = true;
  } catch (error) {
    box.hidden = false;
    box.textContent = `${what}: ${error.message}`;
  }
  refresh();
}

function parseConfig(text) {
  const config = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const at = line.indexOf("=");
    if (at < 0) throw new Error(`"${line}" is not key=value`);
    config[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return config;
}

function formConfig() {
  const config = parseConfig($("create-config").value);
  config["connector.class"] = $("create-class").value;
  const name = $("create-name").value.trim();
  if (name) config.name = name;
  return config;
}

function showErrors(errors) {
  const list = $("create-errors");
  list.replaceChildren(...errors.map(([key, message]) =>
    el("li", { "data-testid": `error-${key}`, "data-key": key }, el("code", {}, key), `: ${message}`)));
  $("create-config").classList.toggle("invalid", errors.length > 0);
}

async function validate() {
  let config;
  try {
    config = formConfig();
  } catch (error) {
    showErrors([["config", error.message]]);
    return false;
  }
  const klass = encodeURIComponent(config["connector.class"]);
  try {
    const result = await api("PUT", `/connector-plugins/${klass}/config/validate`, config);
    const errors = [];
    for (const entry of result.configs || []) {
      for (const message of (entry.value || {}).errors || []) errors.push([entry.value.name, message]);
    }
    showErrors(errors);
    return errors.length === 0;
  } catch (error) {
    showErrors([["connector.class", error.message]]);
    return false;
  }
}

async function create(event) {
  event.preventDefault();
  const result = $("create-result");
  result.textContent = "";
  if (!(await validate())) return;
  const config = formConfig();
  const name = config.name;
  delete config.name;
  try {
    await api("POST", "/connectors", { name, config });
    result.textContent = `created ${name}`;
    $("create-form").reset();
    showErrors([]);
  } catch (error) {
    showErrors([["name", error.message]]);
  }
  refresh();
}

async function loadPlugins() {
  const plugins = await api("GET", "/connector-plugins");
  $("create-class").replaceChildren(...plugins.map((p) =>
    el("option", { value: p.class }, `${p.class.split(".").at(-1)} (${p.type})`)));
}

// -- the loop ------------------------------------------------------------------------------

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    const [cluster, connectors] = await Promise.all([
      api("GET", "/admin/cluster"),
      api("GET", "/connectors?expand=status&expand=info"),
    ]);
    drawCluster(cluster);
    drawConnectors(connectors || {}, cluster);
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.loaded = "true";
  } catch (error) {
    $("updated").textContent = `update failed: ${error.message}`;
  } finally {
    refreshing = false;
  }
}

$("create-form").addEventListener("submit", create);
$("validate-button").addEventListener("click", validate);
loadPlugins().catch((error) => showErrors([["connector.class", error.message]]));
refresh();
setInterval(refresh, REFRESH_MS);
