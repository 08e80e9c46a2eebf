// The namelist operator console, the Search page (a value looked up everywhere, why it is listed) and the Lists page (every list and sandbox, a list's live entries).
// Loaded after core.js (index.html's order); the rules of core.js's header hold here too.
"use strict";

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
