// The namelist operator console, the Audit page: filters, paging, the reason filter, the CSV export.
// Loaded after core.js (index.html's order); the rules of core.js's header hold here too.
"use strict";

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
