#!/bin/bash
# The start-up window of the local tier (issue 25, figures): how long after a start the tier
# is loaded, and what an outage inside that window answers. Against a release binary on its
# own redis-server, at default settings:
#
#   cargo build --release --bins && benches/tier_window.sh [ROWS...]     (default: 1000000 10000000)
#
# Per size: `namelist-tools gen` + `import`, then
#   1. a start, undisturbed: seconds from the process start to /readyz 200 and to
#      namelist_tier_loaded_ratio = 1 (every bucket held);
#   2. a second start, and 1 s after /readyz is 200 Redis is stopped (SIGSTOP) while checks ask
#      for 500 listed entries and 500 never-seen values (one a check, 8 at a time); each answer is
#      sorted into: hit, unanswered (said so), and "not listed" with a stale_ms. A listed
#      value answered "not listed" would be the wrong answer issue 25 is about: counted as
#      WRONG. Then Redis continues (SIGCONT).
# Needs redis-server, python3, ~3 GB of free memory at 10M rows.
set -eu
cd "$(dirname "$0")/.."
BIN=target/release/namelist
TOOLS=target/release/namelist-tools
SIZES=${*:-1000000 10000000}
. benches/lib.sh
"$TOOLS" keygen --out "$D/fp.key" >/dev/null
echo "binary $BIN, redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, default settings"
for ROWS in $SIZES; do
  start_redis
  export NAMELIST_REDIS_URL=redis://127.0.0.1:$RPORT NAMELIST_FINGERPRINT_KEY_FILE=$D/fp.key
  export NAMELIST_EXPECTED_ENTRIES=$ROWS
  "$TOOLS" gen --rows "$ROWS" --out "$D/lists.csv" --non-members "$D/outsiders.csv" >/dev/null 2>&1
  "$TOOLS" import "$D/lists.csv" >/dev/null 2>&1
  echo "--- $ROWS entries imported ($(redis-cli -p "$RPORT" dbsize) keys)"
  for RUN in load outage; do
    SPORT=$(free_port)
    NAMELIST_LISTEN=127.0.0.1:$SPORT "$BIN" >"$D/service.log" 2>&1 &
    SVC=$!
    python3 - "$RUN" "$SPORT" "$RPORT" "$SVC" "$D/lists.csv" "$D/outsiders.csv" <<'PY'
import csv, http.client, json, os, signal, subprocess, sys, time
run, sport, rport, pid, lists, outsiders = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
t0 = time.time()
def get(path):
    try:
        c = http.client.HTTPConnection("127.0.0.1", sport, timeout=5)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    except OSError:
        return None, ""
def loaded():
    _, text = get("/metrics")
    for line in text.splitlines():
        if line.startswith("namelist_tier_loaded_ratio "):
            return float(line.split()[1])
    return 0.0
while get("/readyz")[0] != 200:
    time.sleep(0.02)
ready = time.time() - t0
if run == "load":
    while loaded() < 1.0:
        time.sleep(0.1)
        if time.time() - t0 > 600:
            sys.exit("the tier did not load within 600 s")
    rss = int(open("/proc/%d/status" % pid).read().split("VmRSS:")[1].split()[0]) // 1024
    print("start: /readyz 200 after %.2f s, tier loaded (ratio 1) after %.2f s, RSS %d MiB"
          % (ready, time.time() - t0, rss))
    sys.exit(0)
def pick(path, n):
    out = []
    with open(path) as f:
        for row in csv.DictReader(f):
            v = row["value"]
            exact = "/" not in v and "*" not in v and not v.startswith("@")
            if exact and row["sandbox"] == "default" and not row["expires_at"] and not row["ttl_seconds"]:
                out.append((row["dimension"], row["value"]))
                if len(out) == n:
                    break
    return out
listed, never = pick(lists, 500), pick(outsiders, 500)
time.sleep(max(0.0, ready + 1.0 - (time.time() - t0)))
at = time.time() - t0
redis = subprocess.run(["redis-cli", "-p", str(rport), "info", "server"], capture_output=True, text=True).stdout
rpid = int([l for l in redis.splitlines() if l.startswith("process_id:")][0].split(":")[1])
os.kill(rpid, signal.SIGSTOP)
ratio = loaded()  # /metrics needs no Redis: the share loaded when the outage began
try:
    from concurrent.futures import ThreadPoolExecutor
    def one(dv):
        d, v = dv
        c = http.client.HTTPConnection("127.0.0.1", sport, timeout=5)
        c.request("POST", "/v1/check", json.dumps({"lists": ["black", "grey", "white"], "subjects": {d: [v]}}),
                  {"content-type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        return body
    tally = {}
    stale = []
    with ThreadPoolExecutor(8) as pool:
        for name, values in (("listed", listed), ("never-seen", never)):
            t = {"hit": 0, "unanswered": 0, "not listed": 0, "WRONG": 0, "not degraded": 0}
            for body in pool.map(one, values):
                if not body["degraded"]:
                    t["not degraded"] += 1
                if body.get("stale_ms") is not None:
                    stale.append(body["stale_ms"])
                if body["hits"]:
                    t["hit"] += 1
                elif body.get("unanswered"):
                    t["unanswered"] += 1
                elif name == "listed":
                    t["WRONG"] += 1
                else:
                    t["not listed"] += 1
            tally[name] = t
finally:
    os.kill(rpid, signal.SIGCONT)
print("outage %.2f s after start (/readyz 200 after %.2f s), tier %.0f %% loaded; Redis stopped for the checks:"
      % (at, ready, 100 * ratio))
for name, t in tally.items():
    print("  %-10s %s" % (name, ", ".join("%s %d" % kv for kv in t.items() if kv[1] or kv[0] == "WRONG")))
print("  stale_ms of the answers: %s" % (("min %d, max %d" % (min(stale), max(stale))) if stale else "none (null)"))
PY
    kill "$SVC"; wait "$SVC" 2>/dev/null || true; SVC=
  done
done
