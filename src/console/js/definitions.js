// The namelist operator console, the Metrics and rules page, and the wiring of every page (run last).
// Loaded after core.js (index.html's order); the rules of core.js's header hold here too.
"use strict";

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
