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
    cell(tr, w.watcher);
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
  const runs = await (await api("/api/v1/runs?limit=100&task=" + encodeURIComponent(name))).json();
  const rows = (runs.runs || []).map((run) => {
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
    cell(tr, when(run.created_at));
    cell(tr, when(run.started_at));
    cell(tr, when(run.finished_at));
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
  if (!rows.length) $("#runs-message").textContent = "No run yet.";
  else if ($("#runs-message").textContent === "No run yet.") $("#runs-message").textContent = "";
  if (runId !== null) await loadRun(runId);
}

async function loadRun(runId) {
  const response = await api("/api/v1/runs/" + runId);
  const run = await response.json();
  $("#run-detail").hidden = false;
  $("#run-id").textContent = "#" + runId;
  if (!response.ok) { $("#run-summary").textContent = run.detail; return; }
  $("#run-summary").textContent =
    `${run.state}, try ${run.try_number} of ${run.max_tries}; created ${when(run.created_at)}` +
    (run.started_at ? `, started ${when(run.started_at)}` : "") +
    (run.finished_at ? `, finished ${when(run.finished_at)}` : "");
  $("#run-errors").replaceChildren(...run.errors.map((e) => {
    const li = document.createElement("li");
    li.textContent = `try ${e.try} at ${when(e.at)}: ${e.error}`;
    return li;
  }));
  const events = run.events === undefined ? null : run.events.map(eventLine);
  if (events === null) {
    const li = document.createElement("li");
    li.textContent = `${run.event_count} event(s); their payloads need the read scope`;
    $("#run-events").replaceChildren(li);
  } else {
    $("#run-events").replaceChildren(...events);
  }
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
  if (hash.startsWith("#/assets/")) {
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
window.addEventListener("hashchange", route);
route();
