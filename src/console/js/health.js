// The namelist operator console, the Health page: the verdict first, then the store, the tier and the traffic, refreshed.
// Loaded after core.js (index.html's order); the rules of core.js's header hold here too.
"use strict";

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
  const kept = !embedded ? "" : ready.body.durable === true ? ", kept in its data directory" : ready.body.durable === false ? ", in memory only: lost when the process ends" : "";
  const storeName = !ready || !ready.body ? "unknown" : embedded ? "Embedded store, in this process (no Redis)" + kept : ready.body.store === "redis" ? "Redis" : ready.body.store;
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
