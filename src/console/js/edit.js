// The namelist operator console, the Edit page: one entry added or deleted (asked, then undoable), CSV pasted or from a file.
// Loaded after core.js (index.html's order); the rules of core.js's header hold here too.
"use strict";

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
