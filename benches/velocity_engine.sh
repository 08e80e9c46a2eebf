#!/bin/bash
# Velocity at the risk engine's rate and size (issue 27), measured from outside against the
# release binary on its own redis-server, default settings, in one run:
#
#   cargo build --release --bins && benches/velocity_engine.sh
#
# 1. Five metrics on `transaction` (COUNT 1h by device, SUM and AVG 1d by user,
#    COUNT_DISTINCT 30d of users by device, APPROX_COUNT_DISTINCT 1d of devices by IP);
#    bodies drawn from ENTITIES (200,000) devices, users and IPs, one event a request, each
#    with an id (LINES bodies, 600,000: oha picks a random line per request, so some
#    requests repeat an id; the replays are counted from the service's own counter and left
#    out of the per-event Redis CPU).
#    * `POST /v1/check` max (7 never-seen subjects, lists black and grey): the reference,
#      run before and after the events' maximum (the ratio is to their mean);
#    * `POST /v1/events` max (oha -c 64) and at 2,000/s (p99);
#    * `POST /v1/evaluate` (the event, 2 lists, the 5 metrics read back) max and at 2,000/s;
#    * Redis CPU per event applied: `used_cpu_user + used_cpu_sys` around the events' max run,
#      and where it went: `INFO commandstats` per event applied (calls, µs a call);
#    * the events' max again on a warm keyspace, as in service: every device, user and IP
#      first sends one event (in bodies of 1,000), and every event-id bucket is topped up to
#      ID_FILL live ids (default: what the default dedupe_expected_ids sizes it for); then
#      bodies with new ids over the same entities. The first run starts from an empty
#      keyspace, so most updates create their keys and find their id buckets nearly empty; a
#      production keyspace has seen most of its entities, and its id buckets are full. Its
#      Redis `used_memory` is printed then, per entity. With ENTITIES=5000000 the warm
#      keyspace holds 25M keys and 10M ids, as a production one might (~15 min in all).
# 2. The same events with 50 metrics (45 more, the same five kinds with other windows).
# 3. Memory at 1,000 events per entity: a fresh keyspace whose event-id buckets are sized
#    for the ids this step sends (NAMELIST_DEDUPE_EXPECTED_IDS = 20,000, printed: at the
#    default 10,000,000 a 20,000-id bench would see buckets of 0.4 ids and measure the
#    empty buckets' keys, not the ids), 20 devices, users and IPs with 1,000 events each
#    into the five metrics: `MEMORY USAGE` of every metric key per (metric, entity) and of
#    every event-id bucket per id.
#
# The load generator shares the 2 cores with the service and Redis. Needs redis-server,
# python3 and oha ($OHA, PATH, or target/oha/bin, which `cargo bench --bench load` installs).
# With VELOCITY_JSON=FILE the figures are also written there as one JSON object (the load
# bench, `cargo bench --bench load`, runs this script and puts them in its JSON line).
set -eu
cd "$(dirname "$0")/.."
. benches/lib.sh
SECS=${SECS:-10}
ENTITIES=${ENTITIES:-200000}
LINES=${LINES:-600000}
start_redis
# Every step appends its figures here as JSON lines; merged into $VELOCITY_JSON at the end.
export SUMMARY="$D/summary.jsonl"
"$TOOLS" keygen --out "$D/fp.key" >/dev/null
R="redis-cli -p $RPORT"

start_service() { # prefix [VAR=value...]
  local prefix=$1
  shift
  [ -n "$SVC" ] && kill "$SVC" && wait "$SVC" 2>/dev/null || true
  SPORT=$(free_port)
  env "$@" NAMELIST_LISTEN=127.0.0.1:$SPORT NAMELIST_REDIS_URL=redis://127.0.0.1:$RPORT \
    NAMELIST_FINGERPRINT_KEY_FILE="$D/fp.key" NAMELIST_KEY_PREFIX="$prefix" RUST_LOG=warn \
    "$BIN" >>"$D/service.log" 2>&1 &
  SVC=$!
  for _ in $(seq 100); do curl -sf "localhost:$SPORT/readyz" >/dev/null && break; sleep 0.1; done
}
define() { # id expr
  curl -sf -X PUT -H 'content-type: application/json' "localhost:$SPORT/v1/metrics/$1" \
    -d "{\"expr\": \"$2\"}" >/dev/null
}
redis_cpu() { $R info cpu | awk -F: '/used_cpu_(sys|user):/ {s += $2} END {printf "%.3f", s}'; }
events_metric() { # outcome
  curl -sf "localhost:$SPORT/metrics" | awk -v o="$1" '$1 ~ "^namelist_events_total\\{outcome=\"" o "\"" {print $2}' | head -1
}
# name path lines-file oha-args...: prints one line, leaves the oha JSON in $D/name.json
run() {
  local name=$1 path=$2 lines=$3
  shift 3
  "$OHA" --no-tui --output-format json -z "${SECS}s" -m POST -H 'content-type: application/json' \
    -Z "$lines" "$@" "http://127.0.0.1:$SPORT$path" >"$D/$name.json"
  python3 - "$name" "$D/$name.json" <<'PY'
import json, os, sys
o = json.load(open(sys.argv[2]))
s, p = o["summary"], o["latencyPercentiles"]
ms = lambda v: "%.2f" % (v * 1e3) if v is not None else "-"
print("%-22s %8.0f/s  p50 %s ms  p99 %s ms  max %s ms  %s" % (sys.argv[1], s["requestsPerSec"],
      ms(p["p50"]), ms(p["p99"]), ms(s["slowest"]), o["statusCodeDistribution"]))
with open(os.environ["SUMMARY"], "a") as f:
    f.write(json.dumps({"run": sys.argv[1], "per_sec": s["requestsPerSec"], "p50_ms": p["p50"] and p["p50"] * 1e3,
                        "p99_ms": p["p99"] and p["p99"] * 1e3, "statuses": o["statusCodeDistribution"]}) + "\n")
PY
}
rps() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["requestsPerSec"])' "$D/$1.json"; }
reqs() { python3 -c 'import json,sys; print(sum(json.load(open(sys.argv[1]))["statusCodeDistribution"].values()))' "$D/$1.json"; }

python3 - "$D" "$ENTITIES" "$LINES" <<'PY'
import json, random, sys
sys.path.insert(0, "benches")
import bodies
d, n, lines = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(27)
tx = lambda i, prefix="ev": bodies.transaction(rnd, i, n, prefix)
subjects = lambda: bodies.subjects(rnd)
with open(d + "/events.txt", "w") as f:
    for i in range(lines):
        f.write(json.dumps(tx(i)) + "\n")
with open(d + "/events_warm.txt", "w") as f:
    for i in range(lines):
        f.write(json.dumps(tx(i, "warm")) + "\n")
with open(d + "/checks.txt", "w") as f:
    for i in range(100000):
        f.write(json.dumps({"sandbox": "loan", "lists": ["black", "grey"], "subjects": subjects()}) + "\n")
five = ["tx_dev_1h", "amt_user_1d", "avg_user_1d", "users_dev_30d", "devs_ip_1d"]
with open(d + "/evaluate.txt", "w") as f:
    for i in range(lines):
        e = tx(lines + i)
        f.write(json.dumps({"sandbox": "loan", "lists": ["black", "grey"],
            "subjects": {"device": e["fields"]["device_id"], "ip": e["fields"]["ip"]},
            "event": e, "metrics": five}) + "\n")
PY

echo "binary $BIN, redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), default settings, $(nproc) cores; $SECS s a run; $ENTITIES entities; $LINES bodies"
start_service bench5:
define tx_dev_1h "COUNT(1h, transaction) BY device_id"
define amt_user_1d "SUM(1d, transaction, amount) BY userid"
define avg_user_1d "AVG(1d, transaction, amount) BY userid"
define users_dev_30d "COUNT_DISTINCT(30d, transaction, userid) BY device_id"
define devs_ip_1d "APPROX_COUNT_DISTINCT(1d, transaction, device_id) BY ip"
curl -sf -X POST -H 'content-type: application/json' "localhost:$SPORT/v1/lists/black/entries" \
  -d '{"entries": [{"dimension": "device", "value": "d000001", "sandbox": "loan"}]}' >/dev/null
sleep 2

events_run() { # label [bodies]
  local dup0 cpu0 cpu1 dup1 n
  $R config resetstat >/dev/null
  dup0=$(events_metric duplicate); cpu0=$(redis_cpu)
  run "events-max-$1" /v1/events "${2:-$D/events.txt}" -c 64
  cpu1=$(redis_cpu); dup1=$(events_metric duplicate)
  n=$(reqs "events-max-$1")
  $R info commandstats >"$D/commandstats"
  python3 - "$D/commandstats" "$1" "$n" "${dup0:-0}" "${dup1:-0}" "$cpu0" "$cpu1" <<'PY'
import json, os, re, sys
label, n = sys.argv[2], int(sys.argv[3])
d = int(float(sys.argv[5]) - float(sys.argv[4]))
cpu = float(sys.argv[7]) - float(sys.argv[6])
applied = max(n - d, 1)
print('  %s: %d events, %d of them replays (%.1f %%); Redis CPU %.2f s = %.1f us per event applied'
      % (label, n, d, 100 * d / max(n, 1), cpu, cpu / applied * 1e6))
# Redis's own time in each command (a script's time includes the commands it calls).
rows = [(m.group(1), int(m.group(2)), int(m.group(3))) for m in
        (re.match(r'cmdstat_(\w+):calls=(\d+),usec=(\d+)', l) for l in open(sys.argv[1])) if m]
print('    per event applied: ' + ', '.join('%s %.2f x %.2f us' % (c, k / applied, u / k)
      for c, k, u in sorted(rows, key=lambda r: -r[2]) if k >= n / 50))
with open(os.environ["SUMMARY"], "a") as f:
    f.write(json.dumps({"events": label, "requests": n, "replays": d,
                        "redis_us_per_event": cpu / applied * 1e6,
                        "commands": {c: {"per_event": k / applied, "us": u / k} for c, k, u in rows}}) + "\n")
PY
}
# Every entity sends one event (ids `pre-N`), so that the next run finds its keys.
prefill() {
  python3 - "$SPORT" "$ENTITIES" <<'PY'
import json, sys, urllib.request
port, n = sys.argv[1], int(sys.argv[2])
for b in range(0, n, 1000):
    events = [{"id": "pre-%d" % i, "type": "transaction", "fields": {
        "device_id": "d%06d" % i, "userid": "u%06d" % i,
        "ip": "10.%d.%d.%d" % (i >> 16 & 255, i >> 8 & 255, i & 255), "amount": 1.0}}
        for i in range(b, min(b + 1000, n))]
    req = urllib.request.Request("http://127.0.0.1:%s/v1/events" % port,
        data=json.dumps({"events": events}).encode(), headers={"content-type": "application/json"})
    o = json.load(urllib.request.urlopen(req))
    assert o["duplicates"] == 0, o
PY
}
# Every event-id bucket topped up to ~ID_FILL live ids (default: the fill the default
# dedupe_expected_ids, 10,000,000 ids remembered at once, gives the keyspace's recorded
# buckets: 50 a bucket), which a keyspace in service holds. The ids the runs send are a few per bucket: without this the
# warm run would check and record each id in a nearly empty listpack, cheaper than in service
# (an HSETNX scans its bucket). Synthetic ids: 18-digit integers (a listpack integer, as a
# real 64-bit hash is), remembered for a day.
fill_id_buckets() {
  local buckets
  buckets=$($R hget bench5:meta event_buckets)
  export FILL=${ID_FILL:-$(( (10000000 + buckets - 1) / buckets ))} CODE=$(( $(date +%s) - 1577836800 + 86400 )) SCRIPT="
    for _, k in ipairs(KEYS) do
      local n, args = tonumber(ARGV[1]) - redis.call('HLEN', k), {}
      for i = 1, n do
        args[#args + 1] = string.format('-%09d%09d', math.random(100000000, 999999999), math.random(0, 999999999))
        args[#args + 1] = ARGV[2]
        if #args >= 200 or i == n then redis.call('HSET', k, unpack(args)); args = {} end
      end
    end"
  $R --scan --pattern 'bench5:e{*' >"$D/id-buckets"
  # 500 buckets a call: the keys, then the fill and the expiry code.
  xargs -a "$D/id-buckets" -d '\n' -n 500 \
    sh -c 'redis-cli -p "$0" eval "$SCRIPT" "$#" "$@" "$FILL" "$CODE" >/dev/null' "$RPORT"
}
run check-max /v1/check "$D/checks.txt" -c 64
events_run 5-metrics
# The checks again right after: this machine's speed swings by a third within minutes, so
# the ratio is taken against the mean of the check maxima on either side of the events'.
run check-max-after /v1/check "$D/checks.txt" -c 64
prefill
fill_id_buckets
echo "  warm, as in service: every entity has sent one event, and its $(wc -l <"$D/id-buckets") event-id buckets hold ~$FILL live ids each (ID_FILL); $($R dbsize) keys"
# What that keyspace costs Redis: the five metrics' keys of every entity and the id buckets.
used=$($R info memory | awk -F: '/^used_memory:/ {print $2}' | tr -d '\r')
echo "  Redis used_memory $used B: $((used / ENTITIES)) B an entity (device, user and IP), ids included"
echo "{\"warm_used_memory\": $used, \"warm_entities\": $ENTITIES}" >>"$SUMMARY"
events_run 5-metrics-warm "$D/events_warm.txt"
run events-2000qps /v1/events "$D/events.txt" -q 2000 --latency-correction -c 16
run evaluate-max /v1/evaluate "$D/evaluate.txt" -c 64
run evaluate-2000qps /v1/evaluate "$D/evaluate.txt" -q 2000 --latency-correction -c 16
python3 -c "
import json, os
c = ($(rps check-max) + $(rps check-max-after)) / 2
r = $(rps events-max-5-metrics) / c
print('events max / check max = %.2f (target >= 0.6; the mean check max, %.0f/s, of the runs before and after)' % (r, c))
open(os.environ['SUMMARY'], 'a').write(json.dumps({'events_over_check': r}) + '\n')"

# 45 more metrics: 9 more windows of each kind.
for w in 2 3 4 5 6 7 8 9 10; do
  define "tx_dev_${w}h" "COUNT(${w}h, transaction) BY device_id"
  define "amt_user_${w}d" "SUM(${w}d, transaction, amount) BY userid"
  define "avg_user_${w}d" "AVG(${w}d, transaction, amount) BY userid"
  define "users_dev_${w}0d" "COUNT_DISTINCT(${w}0d, transaction, userid) BY device_id"
  define "devs_ip_${w}d" "APPROX_COUNT_DISTINCT(${w}d, transaction, device_id) BY ip"
done
sleep 2
events_run 50-metrics

echo "memory at 1,000 events per entity (NAMELIST_DEDUPE_EXPECTED_IDS=20000: buckets sized for this step's 20,000 ids)"
# The default key prefix (nl:): a key's length moves its allocation class (a HyperLogLog
# sub-window key of 30 bytes takes 16 B less than one of 31 to 34).
start_service nl: NAMELIST_DEDUPE_EXPECTED_IDS=20000
define tx_dev_1h "COUNT(1h, transaction) BY device_id"
define amt_user_1d "SUM(1d, transaction, amount) BY userid"
define avg_user_1d "AVG(1d, transaction, amount) BY userid"
define users_dev_30d "COUNT_DISTINCT(30d, transaction, userid) BY device_id"
define devs_ip_1d "APPROX_COUNT_DISTINCT(1d, transaction, device_id) BY ip"
python3 - "$SPORT" "$RPORT" <<'PY'
import json, os, subprocess, sys, urllib.request
port, rport = sys.argv[1], sys.argv[2]
summary = open(os.environ["SUMMARY"], "a")
for b in range(20):
    events = [{"id": "m-%d-%d" % (b, i), "type": "transaction", "fields": {
        "device_id": "md%02d" % ((b + i) % 20), "userid": "mu%02d" % (i % 20),
        "ip": "10.9.0.%d" % (i % 20), "amount": 1.5}} for i in range(1000)]
    req = urllib.request.Request("http://127.0.0.1:%s/v1/events" % port,
        data=json.dumps({"events": events}).encode(), headers={"content-type": "application/json"})
    o = json.load(urllib.request.urlopen(req))
    assert o["duplicates"] == 0, o
cli = lambda *a: subprocess.run(["redis-cli", "-p", rport, *a], capture_output=True, text=True, check=True).stdout
def usage(pattern):
    keys = [k for k in cli("--scan", "--pattern", pattern).split("\n") if k]
    return keys, sum(int(cli("memory", "usage", k, "samples", "0")) for k in keys)
ekeys, ebytes = usage("nl:e{*")
ids = sum(int(cli("hlen", k)) for k in ekeys)
if ids:
    print("  event ids: %d remembered in %d buckets, %.1f B per id (MEMORY USAGE), target <= 24" % (ids, len(ekeys), ebytes / ids))
    summary.write(json.dumps({"id_bytes": ebytes / ids, "ids": ids, "id_buckets": len(ekeys)}) + "\n")
else:
    print("  no buckets of event ids (an older build keeps them per metric key, below)")
vkeys, _ = usage("nl:v{*")
kinds = {}
for k in vkeys:
    enc = cli("object", "encoding", k).strip()
    kinds.setdefault(cli("type", k).strip() + "/" + enc, []).append(int(cli("memory", "usage", k, "samples", "0")))
for kind, sizes in sorted(kinds.items()):
    print("  %-20s %4d keys, %.0f B each" % (kind, len(sizes), sum(sizes) / len(sizes)))
    summary.write(json.dumps({"memory": kind, "keys": len(sizes), "bytes_each": sum(sizes) / len(sizes)}) + "\n")
# The same HyperLogLogs (the same values: RENAME keeps them) under velocity layout 2's names,
# `:` and the sub-window in decimal, against layout 3's base64 suffix: what the name costs.
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
base = len("nl:v{") + 12 + 1 + 8
hlls = [k for k in vkeys if cli("type", k).strip() == "string"]
old = []
for k in hlls:
    sub = sum(B64.index(ch) << (6 * i) for i, ch in enumerate(k[base:]))
    name = "%s:%d" % (k[:base], sub)
    cli("rename", k, name)
    old.append(int(cli("memory", "usage", name, "samples", "0")))
    cli("rename", name, k)
if old:
    print("  the same %d HyperLogLogs under layout 2's names (%d bytes, not %d): %.0f B each"
          % (len(old), len(name), len(hlls[-1]), sum(old) / len(old)))
    summary.write(json.dumps({"memory": "hyperloglog named as layout 2", "keys": len(old), "bytes_each": sum(old) / len(old)}) + "\n")
summary.close()
PY
if [ -n "${VELOCITY_JSON:-}" ]; then
  python3 - "$SUMMARY" "$VELOCITY_JSON" <<'PY'
import json, sys
out = {"runs": {}, "events": {}, "memory": {}}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "run" in r:
        out["runs"][r.pop("run")] = r
    elif "events" in r:
        out["events"][r.pop("events")] = r
    elif "memory" in r:
        out["memory"][r.pop("memory")] = r
    else:
        out.update(r)
json.dump(out, open(sys.argv[2], "w"))
PY
fi
