// The operator's page: plain JavaScript, no build step, no CDN. The token lives in
// sessionStorage (this tab only) and travels in the Authorization header; no cookies.
"use strict";

const TOKEN_KEY = "watchkeeper.token";
const $ = (selector) => document.querySelector(selector);
let refreshTimer = null;
let tail = null; // the live stream's AbortController
let tailAsset = null; // the asset the live tail follows ("" for every asset), kept across visits

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {}, { Authorization: "Bearer " + token() });
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) { signOut("Your token was refused: sign in again."); throw new Error("401"); }
  return response;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 120) return Math.round(seconds) + "s ago";
  if (seconds < 7200) return Math.round(seconds / 60) + "m ago";
  return Math.round(seconds / 3600) + "h ago";
}

// An ISO time from the API, shorter and able to wrap: "2030-01-02 03:04:05 UTC".
function when(text) {
  if (!text) return text;
  return text.replace("T", " ").replace(/\.\d+/, "").replace(/\+00:00$/, " UTC");
}

// A time as "3 min ago", with the exact time in the viewer's own time zone on hover.
function ago(iso) {
  const seconds = (Date.now() - Date.parse(iso)) / 1000;
  if (!Number.isFinite(seconds)) return iso;
  if (seconds < 5) return "just now";
  if (seconds < 90) return Math.round(seconds) + " s ago";
  if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
  if (seconds < 129600) return Math.round(seconds / 3600) + " h ago";
  return Math.round(seconds / 86400) + " d ago";
}

function timeElement(iso) {
  const time = document.createElement("time");
  time.dateTime = iso;
  time.textContent = ago(iso);
  time.title = new Date(iso).toLocaleString();
  return time;
}

function timeCell(row, iso, className) {
  const td = cell(row, iso ? "" : null, className);
  if (iso) td.appendChild(timeElement(iso));
  return td;
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

const SVG = "http://www.w3.org/2000/svg";

// An SVG element; every value goes in through setAttribute or textContent, never as markup.
function svgElement(name, attributes = {}, text = null) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (text !== null) element.textContent = text;
  return element;
}

function show(id) {
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== id;
}

// -- sign in ----------------------------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  stopLoops();
  $("#nav").hidden = true;
  $("#login-error").textContent = message || "";
  show("login");
}

async function signIn(event) {
  event.preventDefault();
  const text = $("#token").value.trim();
  const check = await fetch("/api/v1/assets", { headers: { Authorization: "Bearer " + text } });
  if (check.status === 401) { $("#login-error").textContent = "That token is unknown, revoked or expired."; return; }
  sessionStorage.setItem(TOKEN_KEY, text);
  $("#token").value = "";
  $("#login-error").textContent = "";
  if (!location.hash || location.hash === "#/login") location.hash = "#/watchers"; else route();
}

// -- watchers ---------------------------------------------------------------------------------

async function loadWatchers() {
  const response = await api("/api/v1/watchers");
  const body = await response.json();
  const tbody = $("#watchers tbody");
  if (!response.ok) { $("#watchers-message").textContent = body.detail; tbody.replaceChildren(); return; }
  $("#watchers-message").textContent = body.watchers.length ? "" : "No watcher has been reported yet.";
  const minutes = body.rate_window_seconds / 60;
  $("#rate-header").textContent = `events/min (last ${minutes} min)`;
  const rows = body.watchers.map((w) => {
    const tr = document.createElement("tr");
    tr.dataset.watcher = w.watcher;
    const assets = cell(tr, "");
    for (const name of w.assets) {
      const link = document.createElement("a");
      link.href = "#/assets/" + encodeURIComponent(name);
      link.textContent = name;
      assets.appendChild(link);
      assets.appendChild(document.createTextNode(" "));
    }
    cell(tr, "", "name").appendChild(link("#/watchers/" + encodeURIComponent(w.watcher), w.watcher));
    cell(tr, w.state, "state state-" + w.state);
    cell(tr, w.daemon);
    cell(tr, age(w.last_event_age_seconds), "age");
    // The server's figure over the stated window (its runner's counters, or the event log).
    const rate = cell(tr, w.events_per_minute === null ? "-" : w.events_per_minute.toFixed(1), "rate");
    rate.title = `${w.events_in_window} events in the last ${minutes} min`;
    cell(tr, w.failures, "failures");
    const actions = cell(tr, "");
    if (body.may_operate) {
      const action = w.paused ? "resume" : "pause";
      actions.appendChild(controlButton(w.watcher, action));
      if (w.state === "failed") actions.appendChild(controlButton(w.watcher, "retry"));
    }
    return tr;
  });
  tbody.replaceChildren(...rows);
}

function capitalized(word) { return word.charAt(0).toUpperCase() + word.slice(1); }

function controlButton(watcher, action) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = action;
  button.textContent = action;
  button.setAttribute("aria-label", `${capitalized(action)} watcher ${watcher}`);
  button.addEventListener("click", async () => {
    button.disabled = true;
    const response = await api("/api/v1/watchers/" + encodeURIComponent(watcher) + "/" + action, { method: "POST" });
    const body = await response.json();
    $("#watchers-message").textContent = response.ok ? `${action} of ${watcher} recorded` : body.detail;
    await loadWatchers();
  });
  return button;
}

// -- assets -----------------------------------------------------------------------------------

async function loadAssets() {
  const response = await api("/api/v1/assets");
  const body = await response.json();
  $("#assets-message").textContent = response.ok ? "" : body.detail;
  const items = (body.assets || []).map((a) => {
    const li = document.createElement("li");
    const link = document.createElement("a");
    link.href = "#/assets/" + encodeURIComponent(a.name);
    link.textContent = a.name + (a.active ? "" : " (inactive)");
    li.appendChild(link);
    return li;
  });
  $("#assets").replaceChildren(...items);
}

function eventLine(e) {
  const li = document.createElement("li");
  li.dataset.id = e.id;
  li.textContent = `#${e.id} ${e.created_at} ${e.asset} ${e.watcher} ${JSON.stringify(e.payload)}`;
  return li;
}

// Each load of an asset view takes a number; an answer that comes back after a later load
// began (the user moved on) is dropped, so one asset's rows never land under another's name.
let assetLoads = 0;

async function loadAsset(name) {
  const load = ++assetLoads;
  $("#asset-name").textContent = name;
  const response = await api("/api/v1/assets/" + encodeURIComponent(name));
  const body = await response.json();
  if (load !== assetLoads) return;
  $("#asset-message").textContent = response.ok ? "" : body.detail;
  if (!response.ok) {
    $("#state tbody").replaceChildren();
    $("#asset-events").replaceChildren();
    $("#edit-form").hidden = true;
    return;
  }
  const rows = body.state.map((entry) => {
    const tr = document.createElement("tr");
    tr.dataset.key = entry.key;
    cell(tr, entry.key);
    cell(tr, JSON.stringify(entry.value), "value");
    cell(tr, entry.version, "version");
    cell(tr, entry.writer, "writer");
    cell(tr, entry.updated_at);
    tr.addEventListener("click", () => {
      $("#edit-key").value = entry.key;
      $("#edit-version").value = entry.version;
      $("#edit-value").value = JSON.stringify(entry.value);
    });
    return tr;
  });
  $("#state tbody").replaceChildren(...rows);
  $("#edit-form").hidden = !body.writable;
  // The newest page of the log, newest first (not the tail of its oldest page).
  const answer = await api("/api/v1/events?order=desc&limit=20&asset=" + encodeURIComponent(name));
  const events = await answer.json();
  if (load !== assetLoads) return;
  if (!answer.ok) $("#asset-message").textContent = events.detail;
  $("#asset-events").replaceChildren(...(events.events || []).map(eventLine));
}

async function saveEntry(event) {
  event.preventDefault();
  const name = $("#asset-name").textContent;
  const key = $("#edit-key").value;
  const version = $("#edit-version").value;
  const headers = { "Content-Type": "application/json" };
  if (version !== "") headers["If-Match"] = '"' + version + '"';
  const response = await api(
    "/api/v1/assets/" + encodeURIComponent(name) + "/state/" + encodeURIComponent(key),
    { method: "PUT", headers, body: $("#edit-value").value },
  );
  const body = await response.json();
  const result = $("#edit-result");
  if (response.status === 412) {
    result.className = "error conflict";
    result.textContent = `Conflict: ${body.detail}. The current version is ${body.current_version}; reload and edit again.`;
  } else if (!response.ok) {
    result.className = "error";
    result.textContent = body.detail;
  } else {
    result.className = "ok";
    result.textContent = `Saved ${key} at version ${body.version}.`;
    $("#edit-version").value = body.version;
  }
  await loadAsset(name);
}

// -- the live tail (SSE read with fetch, so the token goes in a header) ----------------------

// The assets the tail may follow: "every asset" only for a token that reads them all; a token
// scoped to some assets follows one of them (the stream needs its asset filter).
async function tailChoices() {
  const response = await api("/api/v1/assets");
  const body = await response.json();
  if (!response.ok) { $("#tail-status").textContent = body.detail; return null; }
  const choices = body.assets.map((a) => [a.name, a.name]);
  if (body.may_read_all) choices.unshift(["", "every asset"]);
  if (!choices.length) { $("#tail-status").textContent = "This token reads no asset's events."; return null; }
  if (!choices.some(([value]) => value === tailAsset)) tailAsset = choices[0][0];
  const select = $("#tail-asset");
  select.replaceChildren(...choices.map(([value, label]) => {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = label;
    return option;
  }));
  select.value = tailAsset;
  return tailAsset;
}

async function startTail() {
  if (tail) return;
  tail = new AbortController();
  const signal = tail.signal;
  $("#tail-status").textContent = "connecting";
  const asset = await tailChoices();
  if (asset === null || signal.aborted) return;
  const path = "/api/v1/events/stream" + (asset ? "?asset=" + encodeURIComponent(asset) : "");
  let lastId = null;
  while (!signal.aborted) {
    try {
      const headers = { Authorization: "Bearer " + token() };
      if (lastId !== null) headers["Last-Event-ID"] = String(lastId);
      const response = await fetch(path, { headers, signal });
      if (!response.ok) { $("#tail-status").textContent = (await response.json()).detail; return; }
      $("#tail-status").textContent = "connected";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let data = null;
          for (const line of frame.split("\n")) {
            if (line.startsWith("id: ")) lastId = Number(line.slice(4));
            else if (line.startsWith("data: ")) data = line.slice(6);
          }
          if (data !== null) {
            const list = $("#tail");
            list.prepend(eventLine(JSON.parse(data)));
            while (list.children.length > 200) list.lastChild.remove();
          }
        }
      }
    } catch (error) {
      if (signal.aborted) return;
    }
    $("#tail-status").textContent = "reconnecting";
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// -- tasks and runs ---------------------------------------------------------------------------

function schedule(task) {
  return (task.mode === "any" ? "any of " : "all of ") + task.assets.join(", ");
}

function pendingText(task) {
  return task.assets.map((asset) => `${asset}: ${task.pending[asset] || 0}`).join(", ");
}

// A button for an operator's action: disabled, with the reason, for a token without `operate`.
// `name` is its accessible name: the action and what it acts on ("Pause task load").
function operateButton(className, label, name, allowed, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = className;
  button.textContent = label;
  button.setAttribute("aria-label", name);
  if (!allowed) {
    button.disabled = true;
    button.title = "needs a token with the operate scope";
    return button;
  }
  button.addEventListener("click", async () => {
    button.disabled = true;
    try { await onClick(); } finally { button.disabled = false; }
  });
  return button;
}

async function pauseTask(name, paused, message, reload) {
  const action = paused ? "resume" : "pause";
  const response = await api("/api/v1/tasks/" + encodeURIComponent(name) + "/" + action, { method: "POST" });
  const body = await response.json();
  message.textContent = response.ok ? `${action} of ${name} recorded` : body.detail;
  await reload();
}

function taskCells(tr, task, mayOperate, message, reload) {
  cell(tr, schedule(task), "schedule");
  cell(tr, pendingText(task), "pending");
  cell(tr, task.paused ? "yes" : "no", "paused");
  const action = task.paused ? "resume" : "pause";
  cell(tr, "").appendChild(
    operateButton(action, action, `${capitalized(action)} task ${task.name}`, mayOperate,
      () => pauseTask(task.name, task.paused, message, reload)),
  );
}

async function loadTasks() {
  const response = await api("/api/v1/tasks");
  const body = await response.json();
  const tbody = $("#tasks tbody");
  if (!response.ok) { $("#tasks-message").textContent = body.detail; tbody.replaceChildren(); return; }
  if (!body.tasks.length) $("#tasks-message").textContent = "No task is registered (a worker registers its tasks when it starts).";
  const rows = body.tasks.map((task) => {
    const tr = document.createElement("tr");
    tr.dataset.task = task.name;
    const link = document.createElement("a");
    link.href = "#/tasks/" + encodeURIComponent(task.name);
    link.textContent = task.name;
    cell(tr, "").appendChild(link);
    taskCells(tr, task, body.may_operate, $("#tasks-message"), loadTasks);
    return tr;
  });
  tbody.replaceChildren(...rows);
}

async function loadTask(name, runId) {
  $("#task-name").textContent = name;
  const reload = () => loadTask(name, runId);
  const response = await api("/api/v1/tasks");
  const body = await response.json();
  if (!response.ok) { $("#runs-message").textContent = body.detail; return; }
  const task = body.tasks.find((t) => t.name === name);
  if (!task) { $("#runs-message").textContent = `No task named ${name} is registered.`; return; }
  const summary = document.createElement("tr");
  summary.dataset.task = name;
  taskCells(summary, task, body.may_operate, $("#runs-message"), reload);
  $("#task-summary tbody").replaceChildren(summary);
  const runs = await loadRunsPage(name);
  if (runs === null) return;
  drawTimeline(name, runs);
  const rows = runs.map((run) => {
    const tr = document.createElement("tr");
    tr.dataset.run = run.id;
    if (run.id === runId) tr.className = "selected";
    const link = document.createElement("a");
    link.href = `#/tasks/${encodeURIComponent(name)}/runs/${run.id}`;
    link.textContent = "#" + run.id;
    cell(tr, "", "id").appendChild(link);
    cell(tr, run.state, "state state-" + run.state);
    cell(tr, `${run.try_number} of ${run.max_tries}`, "try");
    cell(tr, run.event_count, "events");
    timeCell(tr, run.created_at, "created");
    timeCell(tr, run.started_at, "started");
    timeCell(tr, run.finished_at, "finished");
    const actions = cell(tr, "");
    if (run.state === "failed") {
      actions.appendChild(operateButton("retry", "retry", `Retry run #${run.id}`, body.may_operate, async () => {
        const answer = await api("/api/v1/runs/" + run.id + "/retry", { method: "POST" });
        const result = await answer.json();
        $("#runs-message").textContent = answer.ok ? `run #${run.id} queued again (try ${result.try_number})` : result.detail;
        await reload();
      }));
    }
    tr.addEventListener("click", (event) => {
      if (event.target.tagName !== "BUTTON" && event.target.tagName !== "A") location.hash = `#/tasks/${encodeURIComponent(name)}/runs/${run.id}`;
    });
    return tr;
  });
  $("#runs tbody").replaceChildren(...rows);
  const none = runsView.state || runsView.range ? "No run matches these filters." : "No run yet.";
  if (!rows.length) $("#runs-message").textContent = none;
  else if ($("#runs-message").textContent.startsWith("No run")) $("#runs-message").textContent = "";
  if (runId !== null) await loadRun(runId);
}

async function loadRun(runId) {
  const response = await api("/api/v1/runs/" + runId);
  const run = await response.json();
  $("#run-detail").hidden = false;
  $("#run-id").textContent = "#" + runId;
  if (!response.ok) {
    $("#run-summary").textContent = run.detail;
    runLogs = { runId: null, after: 0, tries: new Map() }; // nothing of another run stays
    for (const id of ["#run-tries tbody", "#run-errors", "#run-logs", "#run-events"]) $(id).replaceChildren();
    $("#run-logs-status").textContent = "";
    return;
  }
  $("#run-summary").textContent =
    `${run.state}, try ${run.try_number} of ${run.max_tries}; created ${when(run.created_at)}` +
    (run.started_at ? `, started ${when(run.started_at)}` : "") +
    (run.finished_at ? `, finished ${when(run.finished_at)}` : "");
  $("#run-errors").replaceChildren(...run.errors.map((e) => {
    const li = document.createElement("li");
    li.textContent = `try ${e.try} at ${when(e.at)}: ${e.error}`;
    return li;
  }));
  $("#run-tries tbody").replaceChildren(...tryRows(run));
  const events = run.events === undefined ? null : run.events.map(eventLine);
  if (events === null) {
    const li = document.createElement("li");
    li.textContent = `${run.event_count} event(s); their payloads need the read scope`;
    $("#run-events").replaceChildren(li);
  } else {
    $("#run-events").replaceChildren(...events);
  }
  await loadLogs(run);
}

// -- a run's tries and their logs -------------------------------------------------------------

// One row per try: how it ended (an error's cause, or the run's state for its current try)
// and its duration where the run tells it: the store keeps the start of the current try only.
function tryRows(run) {
  const rows = [];
  for (let n = 1; n <= run.try_number; n++) {
    const error = run.errors.filter((e) => e.try === n).pop();
    const current = n === run.try_number;
    const tr = document.createElement("tr");
    tr.dataset.try = n;
    cell(tr, n, "try");
    cell(tr, error ? error.cause : current ? run.state : null, "cause");
    let took = null;
    if (current && run.started_at) {
      const end = error ? error.at : run.finished_at || (run.state === "running" ? new Date().toISOString() : null);
      if (end) took = Math.max(0, (Date.parse(end) - Date.parse(run.started_at)) / 1000);
    }
    cell(tr, took === null ? null : seconds(took), "duration");
    cell(tr, error ? error.error : null, "error");
    rows.push(tr);
  }
  return rows;
}

// The logs of the run shown beside the list: the chunks read so far, one block per try, and
// the position after the last one. Each refresh asks for the chunks after it and appends
// them (each once, by its seq), so a running try's output is followed as it is written.
let runLogs = { runId: null, after: 0, tries: new Map() };

function logBlock(logs, tryNumber) {
  let pre = logs.tries.get(tryNumber);
  if (pre) return pre;
  const block = document.createElement("section");
  block.dataset.try = tryNumber;
  const title = document.createElement("h5");
  title.textContent = `Try ${tryNumber}`;
  pre = document.createElement("pre");
  pre.className = "log";
  pre.tabIndex = 0; // a scrolled block is reachable from the keyboard
  pre.setAttribute("role", "log");
  pre.setAttribute("aria-label", `Logs of try ${tryNumber}`);
  block.append(title, pre);
  const later = [...$("#run-logs").children].find((b) => Number(b.dataset.try) > tryNumber);
  $("#run-logs").insertBefore(block, later || null);
  logs.tries.set(tryNumber, pre);
  return pre;
}

function appendChunk(logs, chunk) {
  if (chunk.seq <= logs.after) return; // already shown by an earlier refresh
  logs.after = chunk.seq;
  const pre = logBlock(logs, chunk.try_number);
  const follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  const span = document.createElement("span");
  span.className = "stream-" + chunk.stream;
  span.dataset.seq = chunk.seq;
  span.textContent = chunk.text;
  pre.appendChild(span);
  if (follow) pre.scrollTop = pre.scrollHeight; // kept at the end unless the reader scrolled up
}

async function loadLogs(run) {
  if (runLogs.runId !== run.id) {
    runLogs = { runId: run.id, after: 0, tries: new Map() };
    $("#run-logs").replaceChildren();
    $("#run-logs-status").textContent = "";
  }
  const logs = runLogs;
  for (let pages = 0; pages < 10; pages++) {
    const response = await api(`/api/v1/runs/${run.id}/logs?after=${logs.after}`);
    const body = await response.json();
    if (logs !== runLogs) return; // another run was opened meanwhile
    if (!response.ok) { $("#run-logs-status").textContent = body.detail; return; }
    for (const chunk of body.chunks) appendChunk(logs, chunk);
    const over = body.state === "success" || body.state === "failed";
    $("#run-logs-status").textContent = !logs.tries.size
      ? (over ? "No try wrote any output." : "No output yet; followed while the run runs.")
      : (over ? "" : "Followed while the run runs.");
    if (!body.more) break;
  }
}

// -- run history: filters, pages of any size, a timeline ------------------------------------

const RUNS_PAGE = 100;
// The task view's query: its filters and the cursors of the pages seen (pages[i] is the
// `before` of page i; null: the newest), kept across refreshes and a run's selection.
const runsView = { task: null, state: "", range: "", pages: [null], page: 0 };

function resetRuns(task) {
  if (runsView.task === task) return;
  Object.assign(runsView, { task, state: "", range: "", pages: [null], page: 0 });
  $("#runs-state").value = "";
  $("#runs-range").value = "";
}

// One page of the task's runs, newest first, cut at the chosen time range (runs are listed
// by id, which grows with creation: once one run is older than the range, all after it are).
async function loadRunsPage(name) {
  const params = new URLSearchParams({ limit: String(RUNS_PAGE), task: name });
  if (runsView.state) params.set("state", runsView.state);
  const before = runsView.pages[runsView.page];
  if (before !== null) params.set("before", String(before));
  const response = await api("/api/v1/runs?" + params);
  const body = await response.json();
  if (!response.ok) { $("#runs-message").textContent = body.detail; return null; }
  const since = runsView.range ? Date.now() - Number(runsView.range) * 1000 : null;
  const runs = since === null ? body.runs : body.runs.filter((r) => Date.parse(r.created_at) >= since);
  const older = body.more && runs.length === body.runs.length;
  runsView.pages[runsView.page + 1] = older ? body.next_before : undefined;
  $("#runs-older").disabled = !older;
  $("#runs-newer").disabled = runsView.page === 0;
  $("#runs-page").textContent = runs.length
    ? `page ${runsView.page + 1}: runs #${runs[runs.length - 1].id} to #${runs[0].id}`
    : `page ${runsView.page + 1}: no run`;
  return runs;
}

function duration(run) {
  if (run.duration_seconds !== null && run.duration_seconds !== undefined) return run.duration_seconds;
  if (run.state === "running" && run.started_at) return (Date.now() - Date.parse(run.started_at)) / 1000;
  return null;
}

function seconds(value) {
  if (value === null) return "no duration yet";
  return value < 60 ? value.toFixed(value < 10 ? 2 : 1) + " s" : (value / 60).toFixed(1) + " min";
}

// One bar per run of the page, oldest left: its height the duration, its colour the state.
function drawTimeline(name, runs) {
  const svg = $("#runs-timeline");
  const width = 800, height = 90, floor = 4;
  const ordered = runs.slice().reverse();
  const longest = Math.max(1e-9, ...ordered.map((r) => duration(r) || 0));
  const slot = Math.min(width / Math.max(ordered.length, 1), 30);
  const bars = ordered.map((run, i) => {
    const took = duration(run);
    const tall = took === null ? floor : Math.max(floor, (height - 6) * took / longest);
    const label = `Run #${run.id}, ${run.state}, ${seconds(took)}, created ${ago(run.created_at)}`;
    const anchor = svgElement("a", {
      href: `#/tasks/${encodeURIComponent(name)}/runs/${run.id}`, "aria-label": label, "data-run": run.id,
    });
    const bar = svgElement("rect", {
      class: "bar " + run.state, x: (i * slot + slot * 0.1).toFixed(1), y: (height - tall).toFixed(1),
      width: Math.max(slot * 0.8, 1).toFixed(1), height: tall.toFixed(1),
    });
    bar.appendChild(svgElement("title", {}, label));
    anchor.appendChild(bar);
    return anchor;
  });
  svg.replaceChildren(svgElement("line", { x1: 0, y1: height - 0.5, x2: width, y2: height - 0.5, stroke: "#ccd" }), ...bars);
  svg.dataset.runs = String(bars.length);
}

// -- a watcher: its last hour as two small charts, its state history, its watermark --------

function drawSpark(figure, points, field, unit) {
  const svg = figure.querySelector("svg");
  const width = 300, height = 80, pad = 4;
  const values = points.map((p) => p[field]);
  const known = values.filter((v) => v !== null);
  const highest = Math.max(1e-9, ...known);
  const x = (i) => (values.length <= 1 ? width - pad : pad + (width - 2 * pad) * i / (values.length - 1));
  const y = (v) => height - pad - (height - 2 * pad) * v / highest;
  const parts = [svgElement("line", { class: "axis", x1: 0, y1: height - pad, x2: width, y2: height - pad })];
  let segment = [];
  const flush = () => { // a lone sample (between gaps) is a dot
    if (segment.length > 1) parts.push(svgElement("polyline", { class: "line", points: segment.join(" ") }));
    else if (segment.length === 1) {
      const [cx, cy] = segment[0].split(",");
      parts.push(svgElement("circle", { class: "line", cx, cy, r: 1.5 }));
    }
    segment = [];
  };
  values.forEach((v, i) => { if (v === null) flush(); else segment.push(`${x(i).toFixed(1)},${y(v).toFixed(1)}`); });
  flush();
  const lastIndex = values.map((v) => v !== null).lastIndexOf(true);
  if (lastIndex >= 0) parts.push(svgElement("circle", { class: "line", cx: x(lastIndex), cy: y(values[lastIndex]), r: 2.5 }));
  svg.replaceChildren(...parts);
  svg.dataset.samples = String(known.length);
  const caption = figure.querySelector("figcaption").textContent;
  const format = (v) => (Math.round(v * 10) / 10) + unit;
  const text = known.length
    ? `latest ${format(known[known.length - 1])}, highest ${format(Math.max(...known))} (${known.length} samples)`
    : "no samples yet";
  svg.setAttribute("aria-label", `${caption}: ${text}`);
  figure.querySelector(".latest").textContent = text;
}

let watcherLoads = 0;

async function loadWatcher(name) {
  const load = ++watcherLoads;
  $("#watcher-name").textContent = name;
  const response = await api("/api/v1/watchers/" + encodeURIComponent(name) + "/history");
  const body = await response.json();
  if (load !== watcherLoads) return;
  $("#watcher-message").textContent = response.ok ? "" : body.detail;
  if (!response.ok) {
    $("#watcher-summary").replaceChildren();
    $("#watcher-changes tbody").replaceChildren();
    $("#watcher-watermark tbody").replaceChildren();
    return;
  }
  const summary = $("#watcher-summary");
  const state = document.createElement("span");
  state.className = "state state-" + body.state;
  state.textContent = body.state || "unknown";
  summary.replaceChildren("State ", state, body.assets.length ? "; feeds " : "; feeds no asset");
  for (const asset of body.assets) summary.append(link("#/assets/" + encodeURIComponent(asset), asset), " ");
  summary.append(`; one sample every ${body.interval_seconds} s.`);
  drawSpark($("#rate-chart"), body.points, "events_per_minute", "/min");
  drawSpark($("#lag-chart"), body.points, "last_event_age_seconds", " s");
  $("#watcher-changes tbody").replaceChildren(...body.changes.slice().reverse().map((change) => {
    const tr = document.createElement("tr");
    timeCell(tr, change.at, "when");
    cell(tr, change.state, "state state-" + change.state);
    cell(tr, change.detail, "why");
    return tr;
  }));
  const rows = [];
  const refused = [];
  for (const asset of body.assets) {
    const answer = await api("/api/v1/assets/" + encodeURIComponent(asset) + "/state");
    const entries = await answer.json();
    if (load !== watcherLoads) return;
    if (!answer.ok) { refused.push(entries.detail); continue; }
    for (const entry of entries.entries) {
      const tr = document.createElement("tr");
      tr.dataset.key = entry.key;
      cell(tr, asset, "asset");
      cell(tr, entry.key, "key");
      cell(tr, JSON.stringify(entry.value), "value");
      cell(tr, entry.version, "version");
      timeCell(tr, entry.updated_at, "written");
      rows.push(tr);
    }
  }
  $("#watcher-watermark tbody").replaceChildren(...rows);
  $("#watermark-message").textContent = refused.length ? refused.join("; ") : rows.length ? "" : "No state written yet.";
}

// -- the asset graph: watchers -> assets -> tasks -> assets, in columns ---------------------

const NODE_HREF = { asset: "#/assets/", watcher: "#/watchers/", task: "#/tasks/" };

function layers(graph) {
  const rank = new Map(graph.nodes.map((n) => [n.id, 0]));
  for (let pass = 0; pass < graph.nodes.length; pass++) { // longest path; a cycle stops at the cap
    let moved = false;
    for (const edge of graph.edges) {
      const next = rank.get(edge.from) + 1;
      if (rank.has(edge.to) && next > rank.get(edge.to) && next < graph.nodes.length) { rank.set(edge.to, next); moved = true; }
    }
    if (!moved) break;
  }
  const columns = [];
  for (const node of graph.nodes) (columns[rank.get(node.id)] ||= []).push(node);
  // Each column ordered by where its inputs sit, so edges cross less.
  const row = new Map();
  for (const column of columns.filter(Boolean)) {
    const weight = (node) => {
      const from = graph.edges.filter((e) => e.to === node.id && row.has(e.from)).map((e) => row.get(e.from));
      return from.length ? from.reduce((a, b) => a + b, 0) / from.length : -1;
    };
    column.sort((a, b) => weight(a) - weight(b) || a.name.localeCompare(b.name));
    column.forEach((node, i) => row.set(node.id, i));
  }
  return { columns: columns.filter(Boolean), row };
}

function shortName(name) { return name.length > 20 ? name.slice(0, 19) + "\u2026" : name; }

function nodeStatus(node) {
  const backlog = node.backlog === null ? "" : `, backlog ${node.backlog}`;
  return `${node.kind}: ${node.state}${backlog}`;
}

function drawGraph(graph) {
  const svg = $("#graph");
  const nodeWidth = 150, nodeHeight = 44, gapX = 50, gapY = 20, margin = 10;
  const { columns } = layers(graph);
  const where = new Map();
  columns.forEach((column, c) => column.forEach((node, r) => where.set(node.id, {
    x: margin + c * (nodeWidth + gapX), y: margin + r * (nodeHeight + gapY),
  })));
  const tallest = Math.max(1, ...columns.map((c) => c.length));
  svg.setAttribute("width", margin * 2 + columns.length * (nodeWidth + gapX) - gapX);
  svg.setAttribute("height", margin * 2 + tallest * (nodeHeight + gapY) - gapY);
  const marker = svgElement("marker", {
    id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto",
  });
  marker.appendChild(svgElement("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
  const defs = svgElement("defs");
  defs.appendChild(marker);
  const edges = graph.edges.filter((e) => where.has(e.from) && where.has(e.to)).map((edge) => {
    const a = where.get(edge.from), b = where.get(edge.to);
    const x1 = a.x + nodeWidth, y1 = a.y + nodeHeight / 2, x2 = b.x, y2 = b.y + nodeHeight / 2;
    const bend = Math.max(30, Math.abs(x2 - x1) / 2);
    return svgElement("path", {
      class: "edge " + edge.kind, "marker-end": "url(#arrow)", "data-from": edge.from, "data-to": edge.to,
      d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
    });
  });
  const nodes = graph.nodes.map((node) => {
    const at = where.get(node.id);
    const anchor = svgElement("a", { href: NODE_HREF[node.kind] + encodeURIComponent(node.name), "aria-label": `${node.name}, ${nodeStatus(node)}` });
    const group = svgElement("g", { class: `node ${node.kind} state-${node.state}`, "data-id": node.id, transform: `translate(${at.x},${at.y})` });
    group.appendChild(svgElement("title", {}, `${node.name} (${nodeStatus(node)})`));
    group.appendChild(svgElement("rect", { width: nodeWidth, height: nodeHeight, rx: node.kind === "asset" ? 14 : 3 }));
    group.appendChild(svgElement("text", { class: "name", x: 8, y: 18 }, shortName(node.name)));
    group.appendChild(svgElement("text", { class: "kind", x: 8, y: 35 }, nodeStatus(node)));
    anchor.appendChild(group);
    return anchor;
  });
  svg.replaceChildren(defs, ...edges, ...nodes);
  svg.dataset.nodes = String(nodes.length);
  svg.dataset.edges = String(edges.length);
}

async function loadGraph() {
  const response = await api("/api/v1/graph");
  const body = await response.json();
  if (!response.ok) { $("#graph-message").textContent = body.detail; $("#graph").replaceChildren(); return; }
  $("#graph-message").textContent = body.nodes.length ? "" : "Nothing registered yet.";
  drawGraph(body);
}

function stopLoops() {
  if (refreshTimer) { clearInterval(refreshTimer); refreshTimer = null; }
  if (tail) { tail.abort(); tail = null; }
}

// -- routing ----------------------------------------------------------------------------------

function route() {
  if (!token()) { signOut(); return; }
  $("#nav").hidden = false;
  stopLoops();
  const hash = location.hash || "#/watchers";
  const guard = (promise) => promise.catch(() => {});
  if (hash.startsWith("#/watchers/")) {
    const name = decodeURIComponent(hash.slice("#/watchers/".length));
    show("watcher-view");
    guard(loadWatcher(name));
    refreshTimer = setInterval(() => guard(loadWatcher(name)), 5000);
  } else if (hash === "#/graph") {
    show("graph-view");
    guard(loadGraph());
    refreshTimer = setInterval(() => guard(loadGraph()), 5000);
  } else if (hash.startsWith("#/assets/")) {
    const name = decodeURIComponent(hash.slice("#/assets/".length));
    show("asset-view");
    $("#edit-result").textContent = "";
    guard(loadAsset(name));
  } else if (hash === "#/assets") {
    show("assets-view");
    $("#assets-message").textContent = "";
    guard(loadAssets());
  } else if (hash.startsWith("#/tasks/")) {
    const [name, word, id] = hash.slice("#/tasks/".length).split("/");
    const runId = word === "runs" && /^[0-9]+$/.test(id || "") ? Number(id) : null;
    show("task-view");
    $("#runs-message").textContent = "";
    $("#run-detail").hidden = runId === null;
    const task = decodeURIComponent(name);
    resetRuns(task);
    guard(loadTask(task, runId));
    refreshTimer = setInterval(() => guard(loadTask(task, runId)), 2000);
  } else if (hash === "#/tasks") {
    show("tasks-view");
    $("#tasks-message").textContent = "";
    guard(loadTasks());
    refreshTimer = setInterval(() => guard(loadTasks()), 2000);
  } else if (hash === "#/events") {
    show("events-view");
    guard(startTail());
  } else {
    show("watchers-view");
    guard(loadWatchers());
    refreshTimer = setInterval(() => guard(loadWatchers()), 2000);
  }
}

$("#login-form").addEventListener("submit", (event) => { signIn(event).catch(() => {}); });
$("#logout").addEventListener("click", () => signOut());
$("#edit-form").addEventListener("submit", (event) => { saveEntry(event).catch(() => {}); });
$("#tail-asset").addEventListener("change", () => {
  tailAsset = $("#tail-asset").value;
  if (tail) { tail.abort(); tail = null; }
  $("#tail").replaceChildren();
  startTail().catch(() => {});
});
function runsQueryChanged() {
  runsView.state = $("#runs-state").value;
  runsView.range = $("#runs-range").value;
  runsView.pages = [null];
  runsView.page = 0;
  route();
}
$("#runs-state").addEventListener("change", runsQueryChanged);
$("#runs-range").addEventListener("change", runsQueryChanged);
$("#runs-filters").addEventListener("submit", (event) => event.preventDefault());
$("#runs-older").addEventListener("click", () => {
  if (runsView.pages[runsView.page + 1] === undefined) return;
  runsView.page += 1;
  route();
});
$("#runs-newer").addEventListener("click", () => {
  if (runsView.page === 0) return;
  runsView.page -= 1;
  route();
});
window.addEventListener("hashchange", route);
route();
