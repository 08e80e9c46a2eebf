// The namelist operator console: plain JavaScript, no build step, no dependencies.
//
// Rules kept throughout: every value from the API is rendered with textContent (never
// parsed as HTML), so a reason such as <img src=x onerror=alert(1)> stays text; the bearer token
// lives in sessionStorage and travels only in the Authorization header; an identifier appears
// in a request URL only in the lookup path the operator typed (audit searches send theirs in
// a POST body).
"use strict";

const TOKEN_KEY = "namelist.token";
const DIMENSIONS = ["uid", "phone", "id_card", "device", "imei", "wifi_mac", "ip", "email"];
const MAX_CSV_ROWS = 10000;
const state = { role: null, auth: true, auditCursor: null, auditFilters: null, lastSample: null };

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

function time(ms) {
  if (ms === null || ms === undefined) return "never";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
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
    if (res.status === 401) showLogin("The token was refused: " + (err.message || "unauthorized"));
    throw new ApiError(res.status, err.code || "http_" + res.status, err.message || res.statusText);
  }
  return json;
}

function fail(e) {
  status(e.code ? e.code + ": " + e.message : String(e), "error");
}

// ---- sign-in and roles ----

function showLogin(message) {
  $("login").hidden = false;
  $("app").hidden = true;
  if (message) status(message, "error");
}

async function start() {
  let me;
  try {
    me = await api("GET", "/v1/whoami");
  } catch (e) {
    if (e.status !== 401) fail(e);
    return;
  }
  state.role = me.role;
  state.auth = me.auth;
  // The page's controls follow the token's permissions (a custom set included).
  const can = new Set(me.permissions || []);
  state.canEdit = can.has("entries");
  document.body.classList.remove("role-read", "role-write", "role-admin");
  document.body.classList.add(can.has("definitions") ? "role-admin" : can.has("entries") ? "role-write" : "role-read");
  $("banner-noauth").hidden = me.auth;
  $("who").textContent = me.auth ? me.name + " (" + me.role + ")" : "no authentication";
  $("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  $("login").hidden = true;
  $("app").hidden = false;
  route();
}

// ---- pages ----

const PAGES = ["search", "edit", "audit", "health", "definitions"];

function route() {
  let page = location.hash.replace("#", "") || "search";
  if (!PAGES.includes(page)) page = "search";
  if (page === "edit" && !state.canEdit) page = "search";
  for (const p of PAGES) $("page-" + p).classList.toggle("current", p === page);
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === page);
  }
  if (page === "health") loadHealth();
  if (page === "definitions") loadDefinitions();
  if (page === "audit" && !state.auditFilters) searchAudit(false);
}

function fillDimensions(select, withAuto, withAny) {
  if (withAny) select.append(new Option("any", ""));
  if (withAuto) select.append(new Option("guess", "auto"));
  for (const d of DIMENSIONS) select.append(new Option(d, d));
}

// ---- search ----

// Guesses an identity's dimension the way an operator would read it.
function guessDimension(raw) {
  const v = raw.trim();
  const compact = v.replace(/[\s\-().]/g, "");
  if (/^([0-9a-f]{2}[:\-]){5}[0-9a-f]{2}$/i.test(v) || /^[0-9a-f]{4}\.[0-9a-f]{4}\.[0-9a-f]{4}$/i.test(v)) return "wifi_mac";
  if (/^\d{1,3}(\.\d{1,3}){3}$/.test(v) || (v.includes(":") && /^[0-9a-f:]+$/i.test(v) && v.split(":").length > 2)) return "ip";
  if (v.includes("@")) return "email";
  if (/^\d{17}[\dXx]$/.test(compact)) return "id_card";
  if (/^\d{14,16}$/.test(compact) && !/^1[3-9]\d{9}$/.test(compact)) return "imei";
  if (/^\+?\d{5,20}$/.test(compact)) return "phone";
  return "uid";
}

async function search(ev) {
  ev.preventDefault();
  const q = $("search-q").value.trim();
  const chosen = $("search-dim").value;
  const dimension = chosen === "auto" ? guessDimension(q) : chosen;
  const sandbox = $("search-sandbox").value.trim();
  $("search-guess").textContent = chosen === "auto" ? "Searched as " + dimension + " (change it above if that is wrong)." : "";
  const hits = $("search-hits").tBodies[0];
  const audit = $("search-audit").tBodies[0];
  hits.replaceChildren();
  audit.replaceChildren();
  status("Searching…");
  try {
    // The one URL that carries the identifier: the lookup path the operator typed.
    const found = await api("GET", "/v1/lists/-/lookup/" + encodeURIComponent(dimension) + "/" +
      encodeURIComponent(q) + "?sandbox=" + encodeURIComponent(sandbox));
    for (const h of found.hits) {
      const tr = el("tr");
      tr.append(el("td", h.list), el("td", h.dimension), el("td", h.value), el("td", time(h.expires_at)));
      hits.append(tr);
    }
    if (found.hits.length === 0) hits.append(emptyRow(4, "On no list of sandbox " + sandbox));
    const trail = await api("POST", "/v1/audit", { dimension, value: q, sandbox, limit: 10 });
    for (const r of trail.records) {
      const tr = el("tr");
      tr.append(el("td", time(r.at)), el("td", r.who), el("td", r.op), el("td", r.list), el("td", r.value), el("td", r.reason));
      audit.append(tr);
    }
    if (trail.records.length === 0) audit.append(emptyRow(6, "No audit records"));
    status(found.degraded ? "Answered from the local copy (the store did not answer in time)" : "", found.degraded ? "error" : "ok");
  } catch (e) {
    fail(e);
  }
}

function emptyRow(cols, text) {
  const tr = el("tr");
  const td = el("td", text, "empty");
  td.colSpan = cols;
  tr.append(td);
  return tr;
}

// ---- edit ----

function entryFrom(prefix) {
  const e = { dimension: $(prefix + "-dim").value, value: $(prefix + "-value").value, sandbox: $(prefix + "-sandbox").value.trim() };
  return e;
}

async function addOne(ev) {
  ev.preventDefault();
  const entry = entryFrom("add");
  const days = $("add-days").value.trim();
  if (days) {
    if (!/^\d+$/.test(days) || Number(days) === 0) return status("Expires after: a whole number of days", "error");
    entry.ttl_seconds = Number(days) * 86400;
  }
  const reason = $("add-reason").value;
  if (reason) entry.reason = reason;
  const list = $("add-list").value.trim();
  try {
    const r = await api("POST", "/v1/lists/" + encodeURIComponent(list) + "/entries", { entries: [entry] });
    status("Written: " + r.written + " entry on " + list, "ok");
  } catch (e) {
    fail(e);
  }
}

async function removeOne(ev) {
  ev.preventDefault();
  const list = $("del-list").value.trim();
  try {
    const r = await api("DELETE", "/v1/lists/" + encodeURIComponent(list) + "/entries", { entries: [entryFrom("del")] });
    status(r.removed === 1 ? "Removed from " + list : "It was not on " + list + " (nothing removed)", "ok");
  } catch (e) {
    fail(e);
  }
}

// RFC 4180 CSV: quoted fields, doubled quotes, CRLF or LF.
function parseCsv(text) {
  const rows = [];
  let row = [], field = "", quoted = false, i = 0;
  while (i < text.length) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i += 2; continue; }
      if (c === '"') { quoted = false; i++; continue; }
      field += c; i++; continue;
    }
    if (c === '"' && field === "") { quoted = true; i++; continue; }
    if (c === ",") { row.push(field); field = ""; i++; continue; }
    if (c === "\r") { i++; continue; }
    if (c === "\n") { row.push(field); rows.push(row); row = []; field = ""; i++; continue; }
    field += c; i++;
  }
  if (field !== "" || row.length) { row.push(field); rows.push(row); }
  return rows.filter((r) => r.some((f) => f.trim() !== ""));
}

const VALUE_RULES = {
  phone: [/^\+?\d{5,20}\*?$|^\+?\d{1,19}\*$/, "5 to 20 digits (spaces, -, ( ) allowed), or a segment ending in *"],
  imei: [/^\d{14,16}$/, "14 to 16 digits"],
  id_card: [/^[0-9A-Za-z]{4,32}$/, "4 to 32 letters or digits"],
  wifi_mac: [/^[0-9a-f]{12}$/i, "12 hex digits"],
};

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

// Checks every row; returns {entries, errors} with errors as "row N: ..." (N counts data rows
// from 1; the header is row 0).
function checkCsv(text) {
  const rows = parseCsv(text);
  const errors = [];
  if (rows.length === 0) return { entries: [], errors: ["no rows: paste a header and rows"] };
  const header = rows[0].map((h) => h.trim());
  const known = ["dimension", "value", "sandbox", "ttl_seconds", "expires_at", "reason"];
  for (const h of header) if (!known.includes(h)) errors.push("header: unknown column " + JSON.stringify(h));
  if (!header.includes("dimension") || !header.includes("value")) errors.push("header: needs dimension and value");
  if (rows.length - 1 > MAX_CSV_ROWS) errors.push((rows.length - 1) + " rows: at most " + MAX_CSV_ROWS);
  if (errors.length) return { entries: [], errors };
  const entries = [];
  rows.slice(1).forEach((r, i) => {
    const n = i + 1;
    if (r.length !== header.length) { errors.push("row " + n + ": " + r.length + " fields, the header has " + header.length); return; }
    const f = Object.fromEntries(header.map((h, j) => [h, r[j].trim()]));
    const e = { dimension: f.dimension, value: f.value };
    if (!DIMENSIONS.includes(f.dimension) && !/^[a-z][a-z0-9_]{0,31}$/.test(f.dimension)) { errors.push("row " + n + ": unknown dimension " + JSON.stringify(f.dimension)); return; }
    const bad = checkValue(f.dimension, f.value);
    if (bad) { errors.push("row " + n + ": " + bad); return; }
    if (f.sandbox) {
      if (!/^[A-Za-z0-9_-]{1,64}$/.test(f.sandbox)) { errors.push("row " + n + ": invalid sandbox"); return; }
      e.sandbox = f.sandbox;
    }
    if (f.ttl_seconds && f.expires_at) { errors.push("row " + n + ": give at most one of ttl_seconds and expires_at"); return; }
    if (f.ttl_seconds) {
      if (!/^\d+$/.test(f.ttl_seconds) || Number(f.ttl_seconds) === 0) { errors.push("row " + n + ": ttl_seconds must be a positive whole number"); return; }
      e.ttl_seconds = Number(f.ttl_seconds);
    }
    if (f.expires_at) {
      if (!/^\d+$/.test(f.expires_at) || Number(f.expires_at) <= Date.now()) { errors.push("row " + n + ": expires_at must be Unix ms in the future"); return; }
      e.expires_at = Number(f.expires_at);
    }
    if (f.reason) {
      if (new TextEncoder().encode(f.reason).length > 256) { errors.push("row " + n + ": reason is over 256 bytes"); return; }
      e.reason = f.reason;
    }
    entries.push(e);
  });
  return { entries, errors };
}

function showCsvErrors(errors) {
  const ul = $("csv-errors");
  ul.replaceChildren(...errors.slice(0, 200).map((m) => el("li", m)));
  if (errors.length > 200) ul.append(el("li", "… and " + (errors.length - 200) + " more"));
}

function csvCheckOnly() {
  const { entries, errors } = checkCsv($("csv-text").value);
  showCsvErrors(errors);
  status(errors.length ? errors.length + " row(s) to fix; nothing written" : entries.length + " rows ready to write", errors.length ? "error" : "ok");
}

async function csvWrite(ev) {
  ev.preventDefault();
  const { entries, errors } = checkCsv($("csv-text").value);
  showCsvErrors(errors);
  if (errors.length) return status(errors.length + " row(s) to fix; nothing written", "error");
  const list = $("csv-list").value.trim();
  try {
    const r = await api("POST", "/v1/lists/" + encodeURIComponent(list) + "/entries", { entries });
    status("Written: " + r.written + " entries on " + list, "ok");
  } catch (e) {
    // The API refuses the whole batch; its message names entries[i]: row i + 1.
    const m = /^entries\[(\d+)\]/.exec(e.message || "");
    if (m) showCsvErrors(["row " + (Number(m[1]) + 1) + ": " + e.message]);
    fail(e);
  }
}

// ---- audit ----

function auditFilters() {
  const f = {};
  for (const k of ["list", "sandbox", "dimension", "value", "who", "op"]) {
    const v = $("audit-" + (k === "dimension" ? "dim" : k)).value.trim();
    if (v) f[k] = v;
  }
  for (const k of ["since", "until"]) {
    const v = $("audit-" + k).value;
    if (v) f[k] = new Date(v).getTime();
  }
  f.limit = 50;
  return f;
}

async function searchAudit(more) {
  if (!more) {
    state.auditFilters = auditFilters();
    state.auditCursor = null;
    $("audit-rows").tBodies[0].replaceChildren();
  }
  const body = Object.assign({}, state.auditFilters);
  if (state.auditCursor) body.cursor = state.auditCursor;
  try {
    const page = await api("POST", "/v1/audit", body);
    const tbody = $("audit-rows").tBodies[0];
    for (const r of page.records) {
      const tr = el("tr");
      tr.append(el("td", time(r.at)), el("td", r.who), el("td", r.op), el("td", r.list), el("td", r.dimension),
        el("td", r.sandbox), el("td", r.value), el("td", r.fingerprint), el("td", r.op === "upsert" ? time(r.expires_at) : ""), el("td", r.reason));
      tbody.append(tr);
    }
    if (!more && page.records.length === 0) tbody.append(emptyRow(10, "No records"));
    state.auditCursor = page.next_cursor;
    $("audit-more").hidden = !page.next_cursor;
    status("", "");
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

function chart(bins) {
  const box = $("health-chart");
  box.replaceChildren();
  if (bins.length === 0) { box.append(el("p", "No audit has written a fill histogram yet (run namelist-tools audit).", "hint")); return; }
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

async function loadHealth() {
  try {
    const res = await fetch("/metrics", { cache: "no-store" });
    const all = parseMetrics(await res.text());
    const at = metric(all, "namelist_audit_last_run_timestamp_seconds");
    facts($("health-audit"), at === 0 ? [["last audit", "none yet (namelist-tools audit writes one)"]] : [
      ["ran at", time(at * 1000)],
      ["bytes per entry", metric(all, "namelist_audit_bytes_per_entry").toFixed(2)],
      ["entries", metric(all, "namelist_audit_entries")],
      ["expired, not swept", metric(all, "namelist_audit_expired_entries")],
      ["buckets", metric(all, "namelist_audit_buckets", { state: "all" })],
      ["near the listpack limit", metric(all, "namelist_audit_buckets", { state: "near_limit" })],
      ["hashtable buckets", metric(all, "namelist_audit_buckets", { state: "hashtable" })],
    ]);
    const bins = all.filter((s) => s.name === "namelist_audit_fill_buckets")
      .map((s) => ({ bin: s.labels.bin, n: s.value }))
      .sort((a, b) => Number(a.bin.split("-")[0]) - Number(b.bin.split("-")[0]));
    chart(bins);
    const hits = metric(all, "namelist_cache_hits_total");
    const misses = metric(all, "namelist_cache_misses_total");
    const checks = metric(all, "namelist_http_request_duration_seconds_count", { route: "/v1/check" });
    const now = Date.now();
    let rate = "measuring (refresh again)";
    if (state.lastSample && now > state.lastSample.at) {
      rate = ((checks - state.lastSample.checks) * 1000 / (now - state.lastSample.at)).toFixed(1) + " /s";
    }
    state.lastSample = { at: now, checks };
    const mode = all.find((s) => s.name === "namelist_tier_mode" && s.value === 1);
    facts($("health-stats"), [
      ["local tier hit ratio", hits + misses === 0 ? "no lookups yet" : (100 * hits / (hits + misses)).toFixed(1) + " %"],
      ["checks", checks + " (" + rate + ")"],
      ["degraded answers", metric(all, "namelist_degraded_answers_total")],
      ["invalidation subscription", metric(all, "namelist_invalidation_subscription_up") === 1 ? "up" : "down"],
      ["local tier", mode ? mode.labels.mode + ", " + (100 * metric(all, "namelist_tier_loaded_ratio")).toFixed(0) + " % loaded" : "off"],
    ]);
  } catch (e) {
    fail(e);
  }
}

// ---- metrics and rules ----

function showDefError(e, input) {
  const box = $("def-error");
  const m = /column (\d+)/.exec(e.message || "");
  let text = e.code + ": " + e.message;
  if (m && input) text += "\n" + input.value + "\n" + " ".repeat(Math.max(Number(m[1]) - 1, 0)) + "^";
  box.textContent = text;
  box.hidden = false;
}

async function loadDefinitions() {
  $("def-error").hidden = true;
  try {
    const [metrics, rules] = await Promise.all([api("GET", "/v1/metrics"), api("GET", "/v1/rules")]);
    const mt = $("metrics-rows").tBodies[0];
    mt.replaceChildren();
    for (const m of metrics.metrics) {
      const tr = el("tr");
      tr.append(el("td", m.id), el("td", m.version), el("td", m.expr), el("td", m.window_ms / 1000 + " s"), deleteCell("metrics", m));
      mt.append(tr);
    }
    const rt = $("rules-rows").tBodies[0];
    rt.replaceChildren();
    for (const r of rules.rules) {
      const tr = el("tr");
      tr.append(el("td", r.id), el("td", r.version), el("td", r.expr), deleteCell("rules", r));
      rt.append(tr);
    }
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
      $("metric-res").value = def.resolution_ms ? def.resolution_ms / 1000 + "s" : "";
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
  const td = el("td", null, "admin-only");
  td.append(editButton(kind, def), document.createTextNode(" "));
  const b = el("button", "Delete", "link");
  b.type = "button";
  b.addEventListener("click", async () => {
    try {
      await api("DELETE", "/v1/" + kind + "/" + encodeURIComponent(id));
      status("Deleted " + id, "ok");
      loadDefinitions();
    } catch (e) {
      showDefError(e);
    }
  });
  td.append(b);
  return td;
}

async function saveMetric(ev) {
  ev.preventDefault();
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
  fillDimensions($("add-dim"), false, false);
  fillDimensions($("del-dim"), false, false);
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
    location.reload();
  });
  $("search-form").addEventListener("submit", search);
  $("add-form").addEventListener("submit", addOne);
  $("del-form").addEventListener("submit", removeOne);
  $("csv-check-btn").addEventListener("click", csvCheckOnly);
  $("csv-form").addEventListener("submit", csvWrite);
  $("audit-form").addEventListener("submit", (ev) => { ev.preventDefault(); searchAudit(false); });
  $("audit-more").addEventListener("click", () => searchAudit(true));
  $("health-refresh").addEventListener("click", loadHealth);
  $("metric-form").addEventListener("submit", saveMetric);
  $("rule-form").addEventListener("submit", saveRule);
  $("try-form").addEventListener("submit", (ev) => { ev.preventDefault(); tryIt("features"); });
  $("try-evaluate").addEventListener("click", () => tryIt("evaluate"));
  window.addEventListener("hashchange", route);
  start();
});
