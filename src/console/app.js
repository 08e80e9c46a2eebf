// The namelist operator console: plain JavaScript, no build step, no dependencies.
//
// Rules kept throughout: every value from the API is rendered with textContent (never
// parsed as HTML), so a reason such as <img src=x onerror=alert(1)> stays text; the bearer token
// lives in sessionStorage and travels only in the Authorization header. An identifier never
// appears in a request URL: searches and audit filters send it in a POST body
// (`POST /v1/lists/-/lookup`, `POST /v1/audit`). A page's
// query may sit in the address's fragment (`#search?value=…`), which browsers never send.
// Times are shown in the browser's zone, with the zone.
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

// ---- search ----

// Guesses an identity's dimension the way an operator would read it. `entry`: also the
// forms only entries take (a range, a phone segment, an e-mail domain).
function guessDimension(raw, entry) {
  const v = raw.trim();
  const compact = v.replace(/[\s\-().]/g, "");
  if (entry && /^\+?[\d\s-]{1,24}\*$/.test(v)) return "phone";
  if (entry && (/^\d{1,3}(\.\d{1,3}){3}\/\d{1,2}$/.test(v) || /^[0-9a-f:]+\/\d{1,3}$/i.test(v))) return "ip";
  if (/^([0-9a-f]{2}[:\-]){5}[0-9a-f]{2}$/i.test(v) || /^[0-9a-f]{4}\.[0-9a-f]{4}\.[0-9a-f]{4}$/i.test(v)) return "wifi_mac";
  if (/^\d{1,3}(\.\d{1,3}){3}$/.test(v) || (v.includes(":") && /^[0-9a-f:]+$/i.test(v) && v.split(":").length > 2)) return "ip";
  if (v.includes("@")) return "email";
  if (/^\d{17}[\dXx]$/.test(compact)) return "id_card";
  if (/^\d{14,16}$/.test(compact) && !/^1[3-9]\d{9}$/.test(compact)) return "imei";
  if (/^\+?\d{5,20}$/.test(compact)) return "phone";
  return "uid";
}

// How a listed value reached the identity: itself, or a range, segment or domain holding it.
function matchKind(h) {
  if (h.dimension === "ip" && h.value.includes("/")) return "range";
  if (h.dimension === "phone" && h.value.endsWith("*")) return "segment";
  if (h.dimension === "email" && h.value.startsWith("@")) return "domain";
  return "";
}

function openSearch(params) {
  $("search-q").value = params.get("value") || "";
  $("search-sandbox").value = params.get("sandbox") || "default";
  const d = params.get("dimension");
  $("search-dim").value = d && DIMENSIONS.includes(d) ? d : "auto";
  runSearch();
}

async function runSearch() {
  const q = $("search-q").value.trim();
  if (!q) return;
  if (!can("lists")) return status("This token may not look identities up (it lacks the lists permission)", "error");
  const chosen = $("search-dim").value;
  const dimension = chosen === "auto" ? guessDimension(q, false) : chosen;
  const sandbox = $("search-sandbox").value.trim() || "default";
  setHash("search", { value: q, sandbox, dimension: chosen === "auto" ? "" : chosen });
  $("search-guess").textContent = chosen === "auto" ? "Searched as " + dimension + " (guessed; choose another dimension above if that is wrong)." : "";
  const hits = $("search-hits").tBodies[0];
  const audit = $("search-audit").tBodies[0];
  hits.replaceChildren();
  audit.replaceChildren();
  status("Searching…");
  try {
    // The identifier in the body, never in a URL.
    const found = await api("POST", "/v1/lists/-/lookup", { dimension, value: q, sandbox });
    // Why each hit is listed: the audit records of the entry that matched (a range, segment
    // or domain has its own), not of the value typed; and the typed value's own records.
    const trail = (filters) => can("audit")
      ? api("POST", "/v1/audit", Object.assign({ sandbox, limit: 10 }, filters)).then((p) => p.records, () => null)
      : Promise.resolve(null);
    const [own, ...perHit] = await Promise.all([
      trail({ dimension, value: q }),
      ...found.hits.map((h) => trail({ list: h.list, dimension: h.dimension, value: h.value })),
    ]);
    found.hits.forEach((h, i) => {
      const kind = matchKind(h);
      const records = perHit[i];
      const why = records && records.find((r) => r.op === "upsert");
      const tr = el("tr");
      tr.append(el("td", h.list), el("td", h.dimension), el("td", h.value + (kind ? " (" + kind + ")" : "")), timeCell(h.expires_at, true));
      if (why) {
        tr.append(el("td", why.reason || "(no reason given)", why.reason ? "" : "empty"), el("td", why.who), timeCell(why.at));
      } else {
        const td = el("td", records ? "No audit record of this entry (imported in bulk, or older than the trail)" : "—", "empty");
        td.colSpan = 3;
        tr.append(td);
      }
      hits.append(tr);
    });
    if (found.hits.length === 0) {
      let text = "On no list of sandbox " + sandbox;
      if (state.known && !state.known.sandboxes.has(sandbox)) {
        text += ": this sandbox holds no entries at all (sandboxes with entries: " + [...state.known.sandboxes].sort().join(", ") + ")";
      }
      hits.append(emptyRow(7, text));
    }
    const seen = new Set();
    const records = [own, ...perHit].filter(Boolean).flat()
      .filter((r) => {
        const k = [r.at, r.op, r.list, r.fingerprint].join("\n");
        return seen.has(k) ? false : seen.add(k);
      })
      .sort((a, b) => (b.at || 0) - (a.at || 0))
      .slice(0, 10);
    for (const r of records) {
      const tr = el("tr");
      tr.append(timeCell(r.at), el("td", r.who), el("td", r.op), el("td", r.list), el("td", r.value), el("td", r.reason));
      audit.append(tr);
    }
    if (records.length === 0) audit.append(emptyRow(6, can("audit") ? "No audit records" : "This token may not read the audit trail"));
    let message = found.degraded ? "Answered from the local copy (the store did not answer in time)" : "";
    if (found.truncated) message += (message ? "; " : "") + "only the first 1,000 lists of this sandbox were looked at";
    status(message, found.degraded ? "error" : "ok");
  } catch (e) {
    fail(e);
  }
}

// ---- lists ----

function openLists(params) {
  const list = params.get("list") || "";
  const sandbox = params.get("sandbox") || "";
  $("lists-list").value = list;
  $("lists-sandbox").value = sandbox;
  loadLists(false);
  if (list && sandbox) openList(list, sandbox);
  else $("list-detail").hidden = true;
}

async function loadLists(more) {
  const tbody = $("lists-rows").tBodies[0];
  if (!more) {
    state.lists.filter = { list: $("lists-list").value.trim(), sandbox: $("lists-sandbox").value.trim() };
    state.lists.cursor = null;
    tbody.replaceChildren();
  }
  const q = new URLSearchParams({ limit: "50" });
  if (state.lists.filter.list) q.set("list", state.lists.filter.list);
  if (state.lists.filter.sandbox) q.set("sandbox", state.lists.filter.sandbox);
  if (state.lists.cursor) q.set("cursor", state.lists.cursor);
  try {
    const page = await api("GET", "/v1/lists?" + q);
    for (const s of page.lists) {
      const tr = el("tr");
      const open = el("button", "Open", "link");
      open.type = "button";
      open.addEventListener("click", () => {
        setHash("lists", { list: s.list, sandbox: s.sandbox });
        openList(s.list, s.sandbox);
      });
      const td = el("td");
      td.append(open);
      tr.append(el("td", s.list), el("td", s.sandbox), el("td", "≈ " + s.entries.toLocaleString("en"), "num"),
        el("td", s.hits.toLocaleString("en"), "num"), timeCell(s.last_change, true), td);
      tbody.append(tr);
    }
    if (!more && page.lists.length === 0) {
      tbody.append(emptyRow(6, state.lists.filter.list || state.lists.filter.sandbox ? "No list holds entries under this filter" : "No list holds entries yet"));
    }
    state.lists.cursor = page.next_cursor;
    $("lists-more").hidden = !page.next_cursor;
  } catch (e) {
    fail(e);
  }
}

async function openList(list, sandbox) {
  $("list-detail").hidden = false;
  $("list-title").textContent = list + " in sandbox " + sandbox;
  $("list-audit-link").href = "#audit?" + new URLSearchParams({ list, sandbox });
  const changes = $("list-changes").tBodies[0];
  changes.replaceChildren();
  $("list-holds").tBodies[0].replaceChildren();
  state.holds = { list, sandbox, cursor: null, seen: new Set(), read: 0, imports: 0, shown: 0 };
  if (!can("audit")) {
    changes.append(emptyRow(7, "This token may not read the audit trail"));
    $("list-holds-more").hidden = true;
    return;
  }
  try {
    const page = await api("POST", "/v1/audit", { list, sandbox, limit: 20 });
    for (const r of page.records) {
      const tr = el("tr");
      tr.append(timeCell(r.at), el("td", r.who), el("td", r.op), el("td", r.dimension), el("td", r.op === "import" ? r.entries + " entries" : r.value),
        r.op === "upsert" ? timeCell(r.expires_at) : el("td", ""), el("td", r.reason));
      changes.append(tr);
    }
    if (page.records.length === 0) changes.append(emptyRow(7, "No audit records"));
  } catch (e) {
    fail(e);
  }
  await loadHolds();
}

// The live entries of the open list, newest change first: the first record of each entry
// (by fingerprint) in the trail decides: an upsert not yet expired is live, a delete is not.
async function loadHolds() {
  const h = state.holds;
  if (!h) return;
  const tbody = $("list-holds").tBodies[0];
  const now = Date.now();
  let added = 0;
  try {
    const { records, cursor } = await auditPages(
      { list: h.list, sandbox: h.sandbox, limit: 500 },
      h.cursor,
      (rs) => rs.filter((r) => r.op === "upsert").length >= 50 || rs.length >= 5000,
    );
    if (state.holds !== h) return;
    h.cursor = cursor;
    h.read += records.length;
    for (const r of records) {
      if (r.op === "import") { h.imports++; continue; }
      if (!r.fingerprint || h.seen.has(r.fingerprint)) continue;
      h.seen.add(r.fingerprint);
      if (r.op !== "upsert" || (r.expires_at !== null && r.expires_at <= now)) continue;
      const tr = el("tr");
      tr.append(el("td", r.dimension), el("td", r.value), el("td", r.reason), el("td", r.who), timeCell(r.at), timeCell(r.expires_at, true));
      tbody.append(tr);
      added++;
    }
    h.shown += added;
    if (h.shown === 0 && !cursor) tbody.append(emptyRow(6, "No live entry in the audit trail"));
    $("list-holds-note").textContent = h.shown + " live entries from " + h.read + " audit records read" +
      (h.imports ? "; " + h.imports + " bulk imports (their entries are not itemised in the trail)" : "") +
      (cursor ? "" : "; the trail is read to its end") + ".";
    $("list-holds-more").hidden = !cursor;
  } catch (e) {
    fail(e);
  }
}

// ---- edit ----

function resolvedDim(prefix) {
  const chosen = $(prefix + "-dim").value;
  const value = $(prefix + "-value").value;
  return { dimension: chosen === "auto" ? guessDimension(value, true) : chosen, guessed: chosen === "auto" };
}

function guessText(prefix) {
  if (!$(prefix + "-value").value.trim()) return "";
  const { dimension, guessed } = resolvedDim(prefix);
  return guessed ? "Read as " + dimension + " (guessed from the value; choose the dimension if that is wrong)." : "";
}

function refreshNotes() {
  const ttl = parseTtl($("add-ttl").value);
  let expiry = "";
  if (Number.isNaN(ttl)) expiry = "Expires after: a number and a unit, such as 1h, 7d or 30d (a bare number is days).";
  else if (ttl) expiry = "Expires " + time(Date.now() + ttl * 1000) + ".";
  note("add-note", [
    [guessText("add")],
    [scopeNote($("add-list").value.trim(), $("add-sandbox").value.trim()), "warn-text"],
    [expiry, Number.isNaN(ttl) ? "warn-text" : ""],
  ]);
  note("csv-note", [[scopeNote($("csv-list").value.trim(), ""), "warn-text"]]);
  const delScope = scopeNote($("del-list").value.trim(), $("del-sandbox").value.trim());
  note("del-note", [[guessText("del")], [delScope ? delScope + " Nothing to remove there." : "", "warn-text"]]);
}

function entryFrom(prefix) {
  const { dimension } = resolvedDim(prefix);
  return { dimension, value: $(prefix + "-value").value, sandbox: $(prefix + "-sandbox").value.trim() };
}

async function addOne(ev) {
  ev.preventDefault();
  const entry = entryFrom("add");
  const ttl = parseTtl($("add-ttl").value);
  if (Number.isNaN(ttl)) return status("Expires after: a number and a unit, such as 1h, 7d or 30d", "error");
  if (ttl) entry.ttl_seconds = ttl;
  const reason = $("add-reason").value;
  if (reason) entry.reason = reason;
  const list = $("add-list").value.trim();
  const guessed = resolvedDim("add").guessed;
  try {
    const r = await api("POST", "/v1/lists/" + encodeURIComponent(list) + "/entries", { entries: [entry] });
    status("Written: " + r.written + " entry on " + list + " as " + entry.dimension + (guessed ? " (guessed)" : ""), "ok");
    loadKnown();
  } catch (e) {
    fail(e);
  }
}

// A modal question; resolves true only when the operator confirms.
function confirmDialog(text, yes) {
  const d = $("confirm");
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  return new Promise((resolve) => {
    const done = (answer) => {
      $("confirm-yes").onclick = null;
      $("confirm-no").onclick = null;
      d.oncancel = null;
      if (d.open) d.close();
      resolve(answer);
    };
    $("confirm-yes").onclick = () => done(true);
    $("confirm-no").onclick = () => done(false);
    d.oncancel = () => done(false);
    d.showModal();
    $("confirm-no").focus();
  });
}

// Shows `text` with an Undo button for UNDO_SECONDS; `undo` runs if it is pressed in time.
function offerUndo(text, undo) {
  if (state.undo) clearInterval(state.undo.timer);
  const bar = $("undo");
  let left = UNDO_SECONDS;
  const paint = () => { $("undo-text").textContent = text + " (" + left + " s to undo)"; };
  const close = () => {
    if (state.undo) clearInterval(state.undo.timer);
    state.undo = null;
    bar.hidden = true;
  };
  state.undo = {
    timer: setInterval(() => {
      left--;
      if (left <= 0) close();
      else paint();
    }, 1000),
  };
  $("undo-btn").onclick = async () => {
    close();
    try {
      status(await undo(), "ok");
    } catch (e) {
      fail(e);
    }
  };
  paint();
  bar.hidden = false;
}

async function removeOne(ev) {
  ev.preventDefault();
  const list = $("del-list").value.trim();
  const entry = entryFrom("del");
  const sandbox = entry.sandbox || "default";
  if (!(await confirmDialog("Remove " + entry.dimension + " " + entry.value.trim() + " from " + list + " in sandbox " + sandbox + "?", "Remove"))) {
    return status("Nothing removed", "");
  }
  try {
    // What the entry was (its last audit record), so that Undo can put it back as it was.
    let before = null;
    if (can("audit")) {
      const page = await api("POST", "/v1/audit", { list, sandbox, dimension: entry.dimension, value: entry.value, limit: 1 });
      before = page.records.find((r) => r.op === "upsert") || null;
    }
    const r = await api("DELETE", "/v1/lists/" + encodeURIComponent(list) + "/entries", { entries: [entry] });
    if (r.removed !== 1) return status("It was not on " + list + " (nothing removed)", "ok");
    status("Removed from " + list, "ok");
    loadKnown();
    offerUndo("Removed " + entry.dimension + " " + entry.value.trim() + " from " + list + ".", async () => {
      const back = Object.assign({}, entry);
      if (before && before.reason) back.reason = before.reason;
      if (before && before.expires_at !== null && before.expires_at > Date.now() + 1000) back.expires_at = before.expires_at;
      await api("POST", "/v1/lists/" + encodeURIComponent(list) + "/entries", { entries: [back] });
      loadKnown();
      return "Put back on " + list + (before ? ", with its reason and expiry" : " (no audit record: its reason and expiry are unknown, it never expires now)");
    });
  } catch (e) {
    fail(e);
  }
}

// RFC 4180 CSV: quoted fields, doubled quotes, CRLF or LF. Each row keeps the line of the
// text it starts on (1 = the header's), blank lines skipped but counted.
function parseCsv(text) {
  const rows = [];
  let row = [], field = "", quoted = false, i = 0, line = 1, start = 1;
  const end = () => {
    row.push(field);
    if (row.some((f) => f.trim() !== "")) rows.push({ fields: row, line: start });
    row = [];
    field = "";
  };
  while (i < text.length) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i += 2; continue; }
      if (c === '"') { quoted = false; i++; continue; }
      if (c === "\n") line++;
      field += c; i++; continue;
    }
    if (c === '"' && field === "") { quoted = true; i++; continue; }
    if (c === ",") { row.push(field); field = ""; i++; continue; }
    if (c === "\r") { i++; continue; }
    if (c === "\n") { end(); line++; start = line; i++; continue; }
    field += c; i++;
  }
  if (field !== "" || row.length) end();
  return rows;
}

const VALUE_RULES = {
  phone: [/^\+?\d{5,20}\*?$|^\+?\d{1,19}\*$/, "5 to 20 digits (spaces, -, ( ) allowed), or a segment ending in *"],
  imei: [/^\d{14,16}$/, "14 to 16 digits"],
  id_card: [/^[0-9A-Za-z]{4,32}$/, "4 to 32 letters or digits"],
  wifi_mac: [/^[0-9a-f]{12}$/i, "12 hex digits"],
};

// The checks the browser can make; the service's (check digits, phone regions: they depend
// on the keyspace's rules) come back as a refusal naming the entry.
function checkValue(dimension, value) {
  const v = value.trim();
  if (!v) return "value is empty";
  if (new TextEncoder().encode(v).length > 256) return "value is over 256 bytes";
  const compact = dimension === "phone" ? v.replace(/[\s\-()]/g, "") : dimension === "imei" ? v.replace(/[\s-]/g, "") : dimension === "wifi_mac" ? v.replace(/[:\-.]/g, "") : v;
  const rule = VALUE_RULES[dimension];
  if (rule && !rule[0].test(compact)) return "invalid " + dimension + ": expected " + rule[1];
  if (dimension === "email" && !/^[^@\s]*@[^@\s]+$/.test(v)) return "invalid email: expected one @ and a domain";
  return null;
}

function where(line) {
  return (state.csvFile ? state.csvFile + " " : "") + "line " + line;
}

// Checks every row; returns {entries, lines, errors}: lines[i] is entries[i]'s line in the
// text, and errors read "line N: …" with N as the file numbers it (the header is line 1).
function checkCsv(text) {
  const rows = parseCsv(text);
  const errors = [];
  const entries = [];
  const lines = [];
  if (rows.length === 0) return { entries, lines, errors: ["no rows: paste or choose a file with a header and rows"] };
  const header = rows[0].fields.map((h) => h.trim());
  const known = ["dimension", "value", "sandbox", "ttl_seconds", "expires_at", "reason"];
  for (const h of header) if (!known.includes(h)) errors.push(where(rows[0].line) + " (header): unknown column " + JSON.stringify(h));
  if (!header.includes("dimension") || !header.includes("value")) errors.push(where(rows[0].line) + " (header): needs dimension and value");
  if (rows.length - 1 > MAX_CSV_ROWS) errors.push((rows.length - 1) + " rows: at most " + MAX_CSV_ROWS);
  if (errors.length) return { entries, lines, errors };
  for (const { fields: r, line } of rows.slice(1)) {
    const at = where(line) + ": ";
    if (r.length !== header.length) { errors.push(at + r.length + " fields, the header has " + header.length); continue; }
    const f = Object.fromEntries(header.map((h, j) => [h, r[j].trim()]));
    const e = { dimension: f.dimension, value: f.value };
    if (!DIMENSIONS.includes(f.dimension) && !/^[a-z][a-z0-9_]{0,31}$/.test(f.dimension)) { errors.push(at + "unknown dimension " + JSON.stringify(f.dimension)); continue; }
    const bad = checkValue(f.dimension, f.value);
    if (bad) { errors.push(at + bad); continue; }
    if (f.sandbox) {
      if (!SANDBOX_RE.test(f.sandbox)) { errors.push(at + "invalid sandbox"); continue; }
      e.sandbox = f.sandbox;
    }
    if (f.ttl_seconds && f.expires_at) { errors.push(at + "give at most one of ttl_seconds and expires_at"); continue; }
    if (f.ttl_seconds) {
      if (!/^\d+$/.test(f.ttl_seconds) || Number(f.ttl_seconds) === 0) { errors.push(at + "ttl_seconds must be a positive whole number"); continue; }
      e.ttl_seconds = Number(f.ttl_seconds);
    }
    if (f.expires_at) {
      if (!/^\d+$/.test(f.expires_at) || Number(f.expires_at) <= Date.now()) { errors.push(at + "expires_at must be Unix ms in the future"); continue; }
      e.expires_at = Number(f.expires_at);
    }
    if (f.reason) {
      if (new TextEncoder().encode(f.reason).length > 256) { errors.push(at + "reason is over 256 bytes"); continue; }
      e.reason = f.reason;
    }
    entries.push(e);
    lines.push(line);
  }
  return { entries, lines, errors };
}

function showCsvErrors(errors) {
  const ul = $("csv-errors");
  ul.replaceChildren(...errors.slice(0, 200).map((m) => el("li", m)));
  if (errors.length > 200) ul.append(el("li", "… and " + (errors.length - 200) + " more"));
}

function csvCheckOnly() {
  const { entries, errors } = checkCsv($("csv-text").value);
  showCsvErrors(errors);
  status(errors.length
    ? errors.length + " row(s) to fix; nothing written"
    : entries.length + " rows pass the browser's checks; the service checks them again (check digits, phone regions) when they are written",
  errors.length ? "error" : "ok");
}

async function readCsvFile() {
  const f = $("csv-file").files[0];
  if (!f) return;
  try {
    $("csv-text").value = await f.text();
    state.csvFile = f.name;
    showCsvErrors([]);
    status("Read " + f.name + ": " + Math.max(parseCsv($("csv-text").value).length - 1, 0) + " rows", "ok");
  } catch (e) {
    status("Could not read " + f.name + ": " + e.message, "error");
  }
}

async function csvWrite(ev) {
  ev.preventDefault();
  const { entries, lines, errors } = checkCsv($("csv-text").value);
  showCsvErrors(errors);
  if (errors.length) return status(errors.length + " row(s) to fix; nothing written", "error");
  const list = $("csv-list").value.trim();
  try {
    const r = await api("POST", "/v1/lists/" + encodeURIComponent(list) + "/entries", { entries });
    status("Written: " + r.written + " entries on " + list + " (added or refreshed)", "ok");
    loadKnown();
  } catch (e) {
    // The API refuses the whole batch naming entries[i]: that entry's line of the file.
    const m = /^entries\[(\d+)\]\.?\s*/.exec(e.message || "");
    if (m && lines[Number(m[1])] !== undefined) {
      showCsvErrors([where(lines[Number(m[1])]) + ": " + e.message.slice(m[0].length) + " (refused by the service; nothing written)"]);
      status("The service refused " + where(lines[Number(m[1])]) + "; nothing written", "error");
    } else {
      fail(e);
    }
  }
}

// ---- audit ----

const AUDIT_FIELDS = ["list", "sandbox", "dimension", "value", "who", "op"];
const auditInput = (k) => $("audit-" + (k === "dimension" ? "dim" : k));

function openAudit(params) {
  if (params.toString() === "" && state.audit) return; // Back to the page as it was.
  for (const k of AUDIT_FIELDS) auditInput(k).value = params.get(k) || "";
  for (const k of ["since", "until", "reason"]) $("audit-" + k).value = params.get(k) || "";
  searchAudit(false);
}

function auditFilters() {
  const f = {};
  for (const k of AUDIT_FIELDS) {
    const v = auditInput(k).value.trim();
    if (v) f[k] = v;
  }
  for (const k of ["since", "until"]) {
    const v = $("audit-" + k).value;
    if (v) f[k] = new Date(v).getTime();
  }
  return f;
}

function reasonMatches(r) {
  const want = state.audit.reason;
  return !want || (r.reason || "").toLowerCase().includes(want);
}

function auditRow(r) {
  const tr = el("tr");
  const fp = el("td", null, "fp-cell");
  if (r.fingerprint) {
    // The whole fingerprint is in the cell (selecting it copies it all), shown shortened.
    const span = el("span", r.fingerprint, "fp");
    span.title = r.fingerprint;
    fp.append(span);
  }
  tr.append(timeCell(r.at), el("td", r.who, "nowrap"), el("td", r.op, "nowrap"), el("td", r.list, "nowrap"), el("td", r.dimension, "nowrap"),
    el("td", r.sandbox, "nowrap"), el("td", r.op === "import" ? r.entries + " entries" : r.value), fp,
    r.op === "upsert" ? timeCell(r.expires_at) : el("td", ""), el("td", r.reason));
  return tr;
}

function paintAudit(records) {
  const tbody = $("audit-rows").tBodies[0];
  const shown = records.filter(reasonMatches);
  tbody.append(...shown.map(auditRow));
  const a = state.audit;
  a.shown += shown.length;
  if (a.shown === 0 && !a.cursor) {
    tbody.replaceChildren(emptyRow(10, a.records.length ? "No record's reason contains “" + a.reason + "”" : "No records"));
  }
  $("audit-more").hidden = !a.cursor;
  $("audit-note").textContent = a.reason
    ? a.shown + " of " + a.records.length + " records read have a reason containing “" + a.reason + "” (filtered in this browser" + (a.cursor ? "; More reads on" : "") + ")."
    : "";
}

async function searchAudit(more) {
  if (!more) {
    const filters = auditFilters();
    const reason = $("audit-reason").value.trim();
    state.audit = { filters, reason: reason.toLowerCase(), cursor: null, records: [], shown: 0 };
    $("audit-rows").tBodies[0].replaceChildren();
    const h = {};
    for (const k of AUDIT_FIELDS) h[k] = auditInput(k).value.trim();
    for (const k of ["since", "until"]) h[k] = $("audit-" + k).value;
    h.reason = reason;
    setHash("audit", h);
  }
  const a = state.audit;
  try {
    // With a reason filter, read on until a page's worth matches (or 2,000 records).
    const { records, cursor } = await auditPages(
      Object.assign({ limit: a.reason ? 500 : 50 }, a.filters),
      a.cursor,
      (rs) => !a.reason || rs.filter(reasonMatches).length >= 50 || rs.length >= 2000,
    );
    if (state.audit !== a) return;
    a.cursor = cursor;
    a.records.push(...records);
    paintAudit(records);
    status("", "");
  } catch (e) {
    fail(e);
  }
}

// One CSV field, quoted; a leading = + - @ is prefixed with ' so that a spreadsheet never
// reads a reason as a formula.
function csvField(v) {
  let s = v === null || v === undefined ? "" : String(v);
  if (/^[=+\-@\t\r]/.test(s)) s = "'" + s;
  return '"' + s.replace(/"/g, '""') + '"';
}

// Exports the records the filters (and the reason filter) select, reading the rest of the
// trail first (up to EXPORT_MAX records): masked values and fingerprints only, as the API
// gives them.
async function exportAudit() {
  if (!state.audit) await searchAudit(false);
  const a = state.audit;
  try {
    if (a.cursor && a.records.length < EXPORT_MAX) {
      status("Reading the rest of the trail for the export…");
      const { records, cursor } = await auditPages(Object.assign({}, a.filters, { limit: 1000 }), a.cursor,
        (rs) => a.records.length + rs.length >= EXPORT_MAX);
      if (state.audit !== a) return;
      a.cursor = cursor;
      a.records.push(...records);
      paintAudit(records);
    }
    const rows = a.records.filter(reasonMatches);
    const cols = ["at", "at_ms", "who", "op", "list", "dimension", "sandbox", "value", "fingerprint", "expires_at", "reason", "entries"];
    const lines = [cols.join(",")];
    for (const r of rows) {
      lines.push([time(r.at), r.at, r.who, r.op, r.list, r.dimension, r.sandbox, r.value, r.fingerprint,
        r.op === "upsert" ? time(r.expires_at) : "", r.reason, r.entries].map(csvField).join(","));
    }
    const blob = new Blob([lines.join("\r\n") + "\r\n"], { type: "text/csv" });
    const url = URL.createObjectURL(blob);
    const link = el("a");
    const d = new Date();
    link.href = url;
    link.download = "audit-" + d.getFullYear() + pad(d.getMonth() + 1) + pad(d.getDate()) + "-" + pad(d.getHours()) + pad(d.getMinutes()) + pad(d.getSeconds()) + ".csv";
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    status("Exported " + rows.length + " records" + (a.cursor ? " (the first " + a.records.length + " of the trail read; narrow the filters for the rest)" : ""), "ok");
  } catch (e) {
    fail(e);
  }
}

// ---- health ----

function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const p of m[3].matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function metric(all, name, labels) {
  return all.filter((s) => s.name === name && Object.entries(labels || {}).every(([k, v]) => s.labels[k] === v))
    .reduce((a, s) => a + s.value, 0);
}

function facts(dl, pairs) {
  dl.replaceChildren();
  for (const [k, v] of pairs) dl.append(el("dt", k), el("dd", v));
}

const SVG = "http://www.w3.org/2000/svg";

function chart(bins, why) {
  const box = $("health-chart");
  box.replaceChildren();
  if (bins.length === 0) { box.append(el("p", why, "hint")); return; }
  const w = 640, h = 200, pad = 24;
  const max = Math.max(...bins.map((b) => b.n), 1);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 " + w + " " + h);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "bucket fill histogram");
  const slot = (w - pad) / bins.length;
  bins.forEach((b, i) => {
    const bh = Math.round((h - 2 * pad) * b.n / max);
    const r = document.createElementNS(SVG, "rect");
    r.setAttribute("x", String(pad + i * slot + 1));
    r.setAttribute("y", String(h - pad - bh));
    r.setAttribute("width", String(Math.max(slot - 2, 1)));
    r.setAttribute("height", String(bh));
    const t = document.createElementNS(SVG, "title");
    t.textContent = b.bin + ": " + b.n + " buckets";
    r.append(t);
    svg.append(r);
    if (i % Math.ceil(bins.length / 8) === 0) {
      const label = document.createElementNS(SVG, "text");
      label.setAttribute("x", String(pad + i * slot));
      label.setAttribute("y", String(h - 6));
      label.textContent = b.bin.split("-")[0];
      svg.append(label);
    }
  });
  box.append(svg);
}

// Counter samples of this tab (kept across reloads), to tell what happened in the last minute.
function healthSamples(now, sample) {
  let samples = [];
  try {
    samples = JSON.parse(sessionStorage.getItem(HEALTH_KEY) || "[]");
  } catch (_) {
    samples = [];
  }
  // A counter that went down: the instance restarted, the old samples say nothing.
  const last = samples[samples.length - 1];
  if (last && (sample.checks < last.checks || sample.degraded < last.degraded)) samples = [];
  samples = samples.filter((s) => now - s.at <= 120000);
  samples.push(sample);
  sessionStorage.setItem(HEALTH_KEY, JSON.stringify(samples));
  // The oldest sample at most a minute old (the window the verdict speaks of).
  return samples.find((s) => now - s.at <= 61000) || sample;
}

const TIER_WORDS = {
  off: "off: every lookup goes to Redis",
  sizing: "measuring the buckets before choosing what to hold; lookups go to Redis meanwhile",
  complete: "holds the whole keyspace: checks are answered in this instance, Redis only for writes and sync",
  partial: "holds the most-read buckets within its memory budget; other lookups go to Redis",
};

async function loadHealth() {
  if (state.healthTimer) clearTimeout(state.healthTimer);
  state.healthTimer = null;
  let ready = null;
  let all = [];
  try {
    const [r, m] = await Promise.all([
      fetch("/readyz", { cache: "no-store" }).then(async (res) => ({ ok: res.ok, body: await res.json().catch(() => ({})) }), () => null),
      fetch("/metrics", { cache: "no-store" }).then((res) => res.text()),
    ]);
    ready = r;
    all = parseMetrics(m);
  } catch (e) {
    $("health-verdict").className = "verdict bad";
    $("health-verdict").textContent = "Not well: the service did not answer (" + e.message + ").";
    facts($("health-summary"), []);
    scheduleHealth();
    return;
  }
  const now = Date.now();
  const embedded = ready && ready.body && ready.body.store === "memory";
  const storeName = !ready || !ready.body ? "unknown" : embedded ? "Embedded store, in this process (no Redis)" : ready.body.store === "redis" ? "Redis" : ready.body.store;
  const checks = metric(all, "namelist_http_request_duration_seconds_count", { route: "/v1/check" });
  const degraded = metric(all, "namelist_degraded_answers_total");
  const refused = metric(all, "namelist_refused_answers_total");
  const since = healthSamples(now, { at: now, checks, degraded, refused });
  const watched = now - since.at;
  const lost = metric(all, "namelist_keyspace_lost") === 1;
  const subscription = metric(all, "namelist_invalidation_subscription_up") === 1;
  const recentDegraded = degraded - since.degraded;
  const recentRefused = refused - since.refused;
  const full = watched >= 55000;
  const span = full ? "in the last minute" : watched < 1000 ? "since this page started watching (just now)" : "in the last " + Math.round(watched / 1000) + " s (watching since " + time(since.at) + ")";

  let verdict, kind;
  if (!ready || !ready.ok) {
    verdict = "Not well: the store does not answer (/readyz " + (ready ? "503" : "unreachable") + "); checks answer per the fail mode.";
    kind = "bad";
  } else if (lost) {
    verdict = "Not well: the keyspace is lost (Redis restarted empty or was flushed); writes are refused (503 keyspace_lost) and checks answer per the fail mode.";
    kind = "bad";
  } else if (recentRefused > 0) {
    verdict = "Not well: " + recentRefused + " checks were refused (fail-closed) " + span + ": the store did not answer in time.";
    kind = "bad";
  } else if (recentDegraded > 0) {
    verdict = "Answering, degraded: " + recentDegraded + " checks were answered from the local copy " + span + " because the store did not answer in time.";
    kind = "warn";
  } else if (!embedded && !subscription) {
    verdict = "Well, with one thing to watch: the invalidation subscription is down, so local copies are re-read by age.";
    kind = "warn";
  } else {
    verdict = "Well: the store answers, the service is ready, and no check was degraded " + span + ".";
    kind = "ok";
  }
  $("health-verdict").className = "verdict " + kind;
  $("health-verdict").textContent = verdict;

  const mode = all.find((s) => s.name === "namelist_tier_mode" && s.value === 1);
  const loaded = (100 * metric(all, "namelist_tier_loaded_ratio")).toFixed(0) + " % loaded";
  const tier = embedded
    ? "not needed: the embedded store is in this process"
    : mode ? TIER_WORDS[mode.labels.mode] ? TIER_WORDS[mode.labels.mode] + (mode.labels.mode === "off" ? "" : " (" + loaded + ")") : mode.labels.mode : "off";
  const summary = [
    ["store", storeName],
    ["ready", ready && ready.ok ? "yes: the store answers" : "no"],
    ["degraded answers", (recentDegraded ? recentDegraded : "none") + " " + span + "; " + degraded + " since the instance started"],
    ["refused answers (fail-closed)", (recentRefused ? recentRefused : "none") + " " + span + "; " + refused + " since the instance started"],
    ["local tier", tier],
  ];
  if (!embedded) summary.push(["invalidation subscription", subscription ? "up: writes elsewhere reach this instance's copies at once" : "down: copies are re-read by age"]);
  if (lost) summary.push(["keyspace", "lost"]);
  facts($("health-summary"), summary);

  const rate = watched >= 1000 ? ((checks - since.checks) * 1000 / watched).toFixed(1) + " /s over the last " + Math.round(watched / 1000) + " s" : "rate shown at the next refresh";
  const stats = [
    ["checks", checks + " since the instance started (" + rate + ")"],
    ["entries written", metric(all, "namelist_entries_written_total")],
    ["entries removed", metric(all, "namelist_entries_removed_total")],
    ["requests refused by auth", metric(all, "namelist_auth_failures_total")],
  ];
  if (!embedded) {
    const hits = metric(all, "namelist_cache_hits_total");
    const misses = metric(all, "namelist_cache_misses_total");
    stats.splice(1, 0, ["lookups answered in this instance", hits + misses === 0 ? "no lookups yet" : (100 * hits / (hits + misses)).toFixed(1) + " % (" + hits + " of " + (hits + misses) + ")"]);
  }
  facts($("health-stats"), stats);

  const at = metric(all, "namelist_audit_last_run_timestamp_seconds");
  if (embedded) {
    facts($("health-audit"), [["last audit", "not applicable: the memory audit (namelist-tools audit) measures Redis"]]);
  } else {
    facts($("health-audit"), at === 0 ? [["last audit", "none yet (namelist-tools audit writes one)"]] : [
      ["ran at", time(at * 1000) + " (" + ago(at * 1000) + ")"],
      ["bytes per entry", metric(all, "namelist_audit_bytes_per_entry").toFixed(2)],
      ["entries", metric(all, "namelist_audit_entries")],
      ["expired, not swept", metric(all, "namelist_audit_expired_entries")],
      ["buckets", metric(all, "namelist_audit_buckets", { state: "all" })],
      ["near the listpack limit", metric(all, "namelist_audit_buckets", { state: "near_limit" })],
      ["hashtable buckets", metric(all, "namelist_audit_buckets", { state: "hashtable" })],
    ]);
  }
  const bins = all.filter((s) => s.name === "namelist_audit_fill_buckets")
    .map((s) => ({ bin: s.labels.bin, n: s.value }))
    .sort((a, b) => Number(a.bin.split("-")[0]) - Number(b.bin.split("-")[0]));
  chart(bins, embedded ? "Not applicable to the embedded store." : "No audit has written a fill histogram yet (run namelist-tools audit).");
  scheduleHealth();
}

function scheduleHealth() {
  if (parseHash().page === "health") state.healthTimer = setTimeout(loadHealth, HEALTH_EVERY_MS);
}

// ---- metrics and rules ----

function showDefError(e, input) {
  const box = $("def-error");
  const m = /column (\d+)/.exec(e.message || "");
  let text = e.code + ": " + e.message;
  if (m && input) text += "\n" + input.value + "\n" + " ".repeat(Math.max(Number(m[1]) - 1, 0)) + "^";
  box.textContent = text;
  box.hidden = false;
  status("", "");
}

async function loadDefinitions() {
  $("def-error").hidden = true;
  try {
    const [metrics, rules] = await Promise.all([api("GET", "/v1/metrics"), api("GET", "/v1/rules")]);
    const mt = $("metrics-rows").tBodies[0];
    mt.replaceChildren();
    for (const m of metrics.metrics) {
      const tr = el("tr");
      tr.append(el("td", m.id), el("td", m.version), el("td", m.expr), el("td", dur(m.window_ms)), el("td", dur(m.resolution_ms)), deleteCell("metrics", m));
      mt.append(tr);
    }
    if (metrics.metrics.length === 0) mt.append(emptyRow(6, "No metrics defined"));
    const rt = $("rules-rows").tBodies[0];
    rt.replaceChildren();
    for (const r of rules.rules) {
      const tr = el("tr");
      tr.append(el("td", r.id), el("td", r.version), el("td", r.expr), deleteCell("rules", r));
      rt.append(tr);
    }
    if (rules.rules.length === 0) rt.append(emptyRow(4, "No rules defined"));
  } catch (e) {
    fail(e);
  }
}

// Fills the definition form from a row, to change it (a PUT of the same id).
function editButton(kind, def) {
  const b = el("button", "Edit", "link");
  b.type = "button";
  b.addEventListener("click", () => {
    if (kind === "metrics") {
      $("metric-id").value = def.id;
      $("metric-expr").value = def.expr;
      $("metric-res").value = def.resolution_ms ? dur(def.resolution_ms) : "";
      $("metric-expr").focus();
    } else {
      $("rule-id").value = def.id;
      $("rule-expr").value = def.expr;
      $("rule-expr").focus();
    }
  });
  return b;
}

function deleteCell(kind, def) {
  const id = def.id;
  const what = kind === "metrics" ? "metric" : "rule";
  const td = el("td", null, "admin-only nowrap");
  td.append(editButton(kind, def), document.createTextNode(" "));
  const b = el("button", "Delete", "link");
  b.type = "button";
  b.addEventListener("click", async () => {
    const question = "Delete the " + what + " " + id + "?" + (kind === "metrics" ? " Rules and callers that read it get an error until it is defined again." : "");
    if (!(await confirmDialog(question, "Delete"))) return status("Nothing deleted", "");
    try {
      await api("DELETE", "/v1/" + kind + "/" + encodeURIComponent(id));
      status("Deleted " + id, "ok");
      loadDefinitions();
      offerUndo("Deleted the " + what + " " + id + ".", async () => {
        const body = { expr: def.expr };
        if (kind === "metrics" && def.resolution_ms) body.resolution = dur(def.resolution_ms);
        await api("PUT", "/v1/" + kind + "/" + encodeURIComponent(id), body);
        loadDefinitions();
        return "Defined " + id + " again";
      });
    } catch (e) {
      showDefError(e);
    }
  });
  td.append(b);
  return td;
}

async function saveMetric(ev) {
  ev.preventDefault();
  $("def-error").hidden = true;
  status("", "");
  const body = { expr: $("metric-expr").value };
  const res = $("metric-res").value.trim();
  if (res) body.resolution = res;
  try {
    await api("PUT", "/v1/metrics/" + encodeURIComponent($("metric-id").value.trim()), body);
    status("Metric saved", "ok");
    loadDefinitions();
  } catch (e) {
    showDefError(e, $("metric-expr"));
  }
}

async function saveRule(ev) {
  ev.preventDefault();
  $("def-error").hidden = true;
  status("", "");
  try {
    await api("PUT", "/v1/rules/" + encodeURIComponent($("rule-id").value.trim()), { expr: $("rule-expr").value });
    status("Rule saved", "ok");
    loadDefinitions();
  } catch (e) {
    showDefError(e, $("rule-expr"));
  }
}

function names(id) {
  return $(id).value.split(",").map((s) => s.trim()).filter(Boolean);
}

async function tryIt(kind) {
  let fields;
  try {
    fields = JSON.parse($("try-fields").value || "{}");
  } catch (e) {
    return status("Fields: not JSON (" + e.message + ")", "error");
  }
  try {
    const out = kind === "features"
      ? await api("POST", "/v1/features", { metrics: names("try-metrics"), fields })
      : await api("POST", "/v1/evaluate", { metrics: names("try-metrics"), rules: names("try-rules"), fields });
    $("try-out").textContent = JSON.stringify(out, null, 2);
    status("", "");
  } catch (e) {
    $("try-out").textContent = "";
    fail(e);
  }
}

// ---- wiring ----

document.addEventListener("DOMContentLoaded", () => {
  fillDimensions($("search-dim"), true, false);
  fillDimensions($("add-dim"), true, false);
  fillDimensions($("del-dim"), true, false);
  fillDimensions($("audit-dim"), false, true);
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    status("", "");
    start();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(HEALTH_KEY);
    location.reload();
  });
  $("search-form").addEventListener("submit", (ev) => { ev.preventDefault(); runSearch(); });
  $("lists-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    setHash("lists", { list: $("lists-list").value.trim(), sandbox: $("lists-sandbox").value.trim() });
    $("list-detail").hidden = true;
    loadLists(false);
  });
  $("lists-more").addEventListener("click", () => loadLists(true));
  $("list-holds-more").addEventListener("click", loadHolds);
  $("add-form").addEventListener("submit", addOne);
  $("del-form").addEventListener("submit", removeOne);
  for (const id of ["add-list", "add-value", "add-dim", "add-sandbox", "add-ttl", "csv-list", "del-list", "del-value", "del-dim", "del-sandbox"]) {
    $(id).addEventListener("input", refreshNotes);
  }
  $("csv-file").addEventListener("change", readCsvFile);
  $("csv-text").addEventListener("input", () => { state.csvFile = null; });
  $("csv-check-btn").addEventListener("click", csvCheckOnly);
  $("csv-form").addEventListener("submit", csvWrite);
  $("audit-form").addEventListener("submit", (ev) => { ev.preventDefault(); searchAudit(false); });
  $("audit-more").addEventListener("click", () => searchAudit(true));
  $("audit-export").addEventListener("click", exportAudit);
  $("health-refresh").addEventListener("click", loadHealth);
  $("metric-form").addEventListener("submit", saveMetric);
  $("rule-form").addEventListener("submit", saveRule);
  $("try-form").addEventListener("submit", (ev) => { ev.preventDefault(); tryIt("features"); });
  $("try-evaluate").addEventListener("click", () => tryIt("evaluate"));
  window.addEventListener("hashchange", route);
  start();
});
