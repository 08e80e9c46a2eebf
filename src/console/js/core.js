// The namelist operator console: plain JavaScript, no build step, no dependencies.
//
// Rules kept throughout: every value from the API is rendered with textContent (never
// parsed as HTML), so a reason such as <img src=x onerror=alert(1)> stays text; the bearer token
// lives in sessionStorage and travels only in the Authorization header. An identifier never
// appears in a request URL: searches and audit filters send it in a POST body
// (`POST /v1/lists/-/lookup`, `POST /v1/audit`). A page's
// query may sit in the address's fragment (`#search?value=…`), which browsers never send.
// Times are shown in the browser's zone, with the zone.
//
// The script is six classic scripts run in this order (index.html, `routes::console`):
// core.js (this), search.js, edit.js, audit.js, health.js, definitions.js (the wiring, last);
// they share the page's global scope, so each may call what an earlier one defines.
"use strict";

const TOKEN_KEY = "namelist.token";
const HEALTH_KEY = "namelist.health";
const DIMENSIONS = ["uid", "phone", "id_card", "device", "imei", "wifi_mac", "ip", "email"];
const LIST_RE = /^[a-z0-9_-]{1,32}$/;
const SANDBOX_RE = /^[A-Za-z0-9_-]{1,64}$/;
const MAX_CSV_ROWS = 10000;
const UNDO_SECONDS = 10;
const HEALTH_EVERY_MS = 10000;
const EXPORT_MAX = 10000;
const PAGES = ["search", "lists", "edit", "audit", "health", "definitions"];

const state = {
  perms: new Set(),
  auth: true,
  known: null, // {lists, sandboxes, pairs} from GET /v1/lists
  lists: { cursor: null, filter: null },
  holds: null,
  audit: null,
  csvFile: null,
  undo: null,
  healthTimer: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function status(message, kind) {
  const s = $("status");
  s.textContent = message || "";
  s.className = kind || "";
}

function fail(e) {
  status(e.code ? e.code + ": " + e.message : String(e), "error");
}

function can(permission) {
  return state.perms.has(permission);
}

// ---- time ----

const pad = (n) => String(n).padStart(2, "0");

// "UTC+8", "UTC-3:30", "UTC" for the zone offset at that instant.
function offsetLabel(d) {
  const m = -d.getTimezoneOffset();
  if (m === 0) return "UTC";
  const a = Math.abs(m);
  return "UTC" + (m > 0 ? "+" : "-") + Math.floor(a / 60) + (a % 60 ? ":" + pad(a % 60) : "");
}

function zoneName() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  } catch (_) {
    return "";
  }
}

// Local time with its zone offset: "2026-11-27 16:20:41 UTC+8".
function time(ms) {
  if (ms === null || ms === undefined) return "never";
  const d = new Date(ms);
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + " " + offsetLabel(d);
}

// "5 s ago", "3 min ago", "2 h ago", "4 d ago"; "in 6 d" for the future.
function ago(ms) {
  const diff = Date.now() - ms;
  const a = Math.abs(diff);
  let text;
  if (a < 45000) text = Math.round(a / 1000) + " s";
  else if (a < 3600000) text = Math.round(a / 60000) + " min";
  else if (a < 86400000) text = Math.round(a / 3600000) + " h";
  else text = Math.round(a / 86400000) + " d";
  return diff >= 0 ? text + " ago" : "in " + text;
}

// A table cell holding a time: local with zone, the UTC instant on hover. It may wrap
// between the date and the time, never inside either.
function timeCell(ms, relative) {
  const td = el("td");
  if (ms === null || ms === undefined) {
    td.textContent = "never";
    return td;
  }
  const [date, clock] = time(ms).split(/ (.*)/s);
  td.append(el("span", date, "nowrap"), " ", el("span", clock, "nowrap"));
  if (relative) td.append(" ", el("span", "(" + ago(ms) + ")", "rel nowrap"));
  td.title = new Date(ms).toISOString() + " (" + ago(ms) + ")";
  return td;
}

// Milliseconds as the API's durations read: "1d", "7d", "1h", "15m", "30s".
function dur(ms) {
  if (ms === null || ms === undefined) return "";
  for (const [unit, size] of [["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000]]) {
    if (ms >= size && ms % size === 0) return ms / size + unit;
  }
  return ms + "ms";
}

// "7d", "12h", "30m", "90s" or a bare number of days → seconds; null when empty; NaN when bad.
function parseTtl(text) {
  const t = text.trim();
  if (!t) return null;
  const m = /^(\d+)\s*([smhd]?)$/i.exec(t);
  if (!m || Number(m[1]) === 0) return NaN;
  const unit = { s: 1, m: 60, h: 3600, d: 86400, "": 86400 }[m[2].toLowerCase()];
  return Number(m[1]) * unit;
}

// ---- the API ----

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  const text = await res.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (_) {
    json = null;
  }
  if (!res.ok) {
    const err = (json && json.error) || {};
    // Without a token a 401 only means "sign in": no error before anything was typed.
    if (res.status === 401) showLogin(token ? "The token was refused: " + (err.message || "unauthorized") : "");
    throw new ApiError(res.status, err.code || "http_" + res.status, err.message || res.statusText);
  }
  return json;
}

// Every page of `POST /v1/audit` for `filters`, from `cursor`, until `enough(records)` or
// the end of the trail.
async function auditPages(filters, cursor, enough) {
  const records = [];
  let next = cursor;
  do {
    const body = Object.assign({}, filters);
    if (next) body.cursor = next;
    const page = await api("POST", "/v1/audit", body);
    records.push(...page.records);
    next = page.next_cursor;
  } while (next && !enough(records));
  return { records, cursor: next };
}

// ---- sign-in and roles ----

function showLogin(message) {
  $("login").hidden = false;
  $("app").hidden = true;
  status(message || "", message ? "error" : "");
  if (!message) $("token").focus();
}

async function start() {
  let me;
  try {
    me = await api("GET", "/v1/whoami");
  } catch (e) {
    if (e.status !== 401) fail(e);
    return;
  }
  state.auth = me.auth;
  // The page's controls follow the token's permissions (a custom set included).
  state.perms = new Set(me.permissions || []);
  document.body.classList.remove("role-read", "role-write", "role-admin", "can-lists", "can-audit", "can-check");
  document.body.classList.add(can("definitions") ? "role-admin" : can("entries") ? "role-write" : "role-read");
  // Pages a token may not use are not offered (their calls would only be refused).
  for (const p of ["lists", "audit", "check"]) if (can(p)) document.body.classList.add("can-" + p);
  $("banner-noauth").hidden = me.auth;
  $("who").textContent = me.auth ? me.name + " (" + me.role + ")" : "no authentication";
  $("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  $("login").hidden = true;
  $("app").hidden = false;
  const zone = zoneName();
  const offset = offsetLabel(new Date());
  $("zone").textContent = "Times are this browser's: " + (zone && zone !== offset ? zone + ", " : "") + offset + ".";
  loadKnown();
  route();
}

// ---- pages and their addresses ----

// "#audit?list=black&op=delete" → {page: "audit", params}.
function parseHash() {
  const h = location.hash.replace(/^#/, "");
  const i = h.indexOf("?");
  return {
    page: i < 0 ? h : h.slice(0, i),
    params: new URLSearchParams(i < 0 ? "" : h.slice(i + 1)),
  };
}

// Writes a page's query into the fragment (never sent to a server) so that the address can
// be kept or shared; replaceState fires no hashchange, so nothing runs twice.
function setHash(page, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  history.replaceState(null, "", "#" + page + (s ? "?" + s : ""));
}

function route() {
  const { page: wanted, params } = parseHash();
  let page = PAGES.includes(wanted) ? wanted : "search";
  if (page === "edit" && !can("entries")) page = "search";
  if (page === "lists" && !can("lists")) page = "search";
  if (page === "audit" && !can("audit")) page = "search";
  if (page === "definitions" && !can("check")) page = "search";
  for (const p of PAGES) $("page-" + p).classList.toggle("current", p === page);
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === page);
  }
  status("", "");
  if (state.healthTimer) {
    clearTimeout(state.healthTimer);
    state.healthTimer = null;
  }
  if (page === "search" && params.has("value")) openSearch(params);
  if (page === "lists") openLists(params);
  if (page === "edit") refreshNotes();
  if (page === "audit") openAudit(params);
  if (page === "health") loadHealth();
  if (page === "definitions") loadDefinitions();
}

function fillDimensions(select, withAuto, withAny) {
  if (withAny) select.append(new Option("any", ""));
  if (withAuto) select.append(new Option("guess", "auto"));
  for (const d of DIMENSIONS) select.append(new Option(d, d));
}

function emptyRow(cols, text) {
  const tr = el("tr");
  const td = el("td", text, "empty");
  td.colSpan = cols;
  tr.append(td);
  return tr;
}

// ---- what lists and sandboxes exist (the pickers) ----

async function loadKnown() {
  if (!can("lists")) return;
  const lists = new Set();
  const sandboxes = new Set(["default"]);
  const pairs = new Set();
  try {
    let cursor = null;
    let pages = 0;
    do {
      const q = new URLSearchParams({ limit: "1000" });
      if (cursor) q.set("cursor", cursor);
      const page = await api("GET", "/v1/lists?" + q);
      for (const s of page.lists) {
        lists.add(s.list);
        sandboxes.add(s.sandbox);
        pairs.add(s.list + "\n" + s.sandbox);
      }
      cursor = page.next_cursor;
    } while (cursor && ++pages < 10);
  } catch (_) {
    return; // The pickers stay empty; typing works as before.
  }
  state.known = { lists, sandboxes, pairs };
  const options = (names) => [...names].sort().map((n) => {
    const o = document.createElement("option");
    o.value = n;
    return o;
  });
  $("dl-lists").replaceChildren(...options(lists));
  $("dl-sandboxes").replaceChildren(...options(sandboxes));
  refreshNotes();
}

// What an operator should know about writing to (list, sandbox): a new list, a list new to
// the sandbox, a name the API would refuse. "" when nothing.
function scopeNote(list, sandbox) {
  if (!list) return "";
  if (!LIST_RE.test(list)) return "“" + list + "” is not a list name (a-z, 0-9, _ and -, at most 32).";
  if (sandbox && !SANDBOX_RE.test(sandbox)) return "“" + sandbox + "” is not a sandbox name (letters, digits, _ and -, at most 64).";
  const k = state.known;
  if (!k) return "";
  if (!k.lists.has(list)) {
    const some = [...k.lists].sort().slice(0, 8).join(", ");
    return "New list: “" + list + "” holds nothing yet" + (some ? " (lists with entries: " + some + ")" : "") + ".";
  }
  if (sandbox && !k.pairs.has(list + "\n" + sandbox)) {
    return "“" + list + "” has no entries in sandbox “" + sandbox + "” yet" +
      (k.sandboxes.has(sandbox) ? "." : ": a new sandbox.");
  }
  return "";
}

function note(id, parts) {
  const p = $(id);
  p.replaceChildren();
  for (const [text, cls] of parts) if (text) p.append(el("span", text, cls || ""), " ");
}
