#!/bin/bash
# Where Redis's time per event goes (issue 27), without the network or the service in the
# figure: the release binary sends EVENTS events (default 5,000; one a request, each with its
# id, five metrics as in benches/velocity_engine.sh, over 200,000 entities) to its own
# redis-server while `MONITOR` records the exact metric script calls; the service is then
# stopped and the calls are replayed, pipelined 200 at a time, by a Python client (PyPI's
# redis, in a venv under target/), each round on fresh keys (the key prefix rewritten):
#
#   cargo build --release --bins && benches/velocity_redis_cost.sh
#
# Prints, best of 3 rounds, Redis CPU (`INFO cpu`) and `EVALSHA` time (`INFO commandstats`)
# per event for: the script on fresh keys (every update opens its sub-window: the sparse
# entities of the engine's traffic), with each command it ran; the same calls again (every
# event a replay: the deduplication alone); the script on fresh keys again, each event-id
# bucket first holding FILL (default 50, what a keyspace in service is sized for) other
# live ids; an empty script given the same keys and
# argument (the cost of a call); a script that only unpacks the argument. The difference
# between the first and the sum of the others is the script's own Lua.
#
# This machine's speed moves by a third within minutes, more than most changes to the
# script. INSTRUCTIONS=1 (needs valgrind: `apt-get install -y valgrind`) runs redis-server
# under callgrind instead and prints, for the same rows, the instructions Redis executed per
# event (one round each: the count repeats to within a fraction of a per cent), the figure to
# compare two builds' scripts by; it says nothing of cache misses, so a warm keyspace's cost
# is the CPU rows' to tell.
set -eu
cd "$(dirname "$0")/.."
. benches/lib.sh
EVENTS=${EVENTS:-5000}
VENV=target/bench-venv
[ -x "$VENV/bin/python" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q redis; }
if [ -n "${INSTRUCTIONS:-}" ]; then
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$D/callgrind.out" \
    redis-server --port "$RPORT" --save '' --appendonly no --dir "$D" >"$D/valgrind.log" 2>&1 &
  RPID=$!
  for _ in $(seq 300); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
else
  start_redis
fi
"$TOOLS" keygen --out "$D/fp.key" >/dev/null
SPORT=$(free_port)
NAMELIST_LISTEN=127.0.0.1:$SPORT NAMELIST_REDIS_URL=redis://127.0.0.1:$RPORT \
  NAMELIST_FINGERPRINT_KEY_FILE="$D/fp.key" NAMELIST_KEY_PREFIX=b: RUST_LOG=warn \
  "$BIN" >>"$D/service.log" 2>&1 &
SVC=$!
for _ in $(seq 100); do curl -sf "localhost:$SPORT/readyz" >/dev/null && break; sleep 0.1; done
define() {
  curl -sf -X PUT -H 'content-type: application/json' "localhost:$SPORT/v1/metrics/$1" \
    -d "{\"expr\": \"$2\"}" >/dev/null
}
define tx_dev_1h "COUNT(1h, transaction) BY device_id"
define amt_user_1d "SUM(1d, transaction, amount) BY userid"
define avg_user_1d "AVG(1d, transaction, amount) BY userid"
define users_dev_30d "COUNT_DISTINCT(30d, transaction, userid) BY device_id"
define devs_ip_1d "APPROX_COUNT_DISTINCT(1d, transaction, device_id) BY ip"
sleep 1
redis-cli -p "$RPORT" monitor >"$D/monitor.txt" &
MON=$!
sleep 0.3
python3 - "$SPORT" "$EVENTS" <<'PY'
import json, random, sys, urllib.request
port, n = sys.argv[1], int(sys.argv[2])
rnd, entities = random.Random(27), 200000
for i in range(n):
    ip = rnd.randrange(entities)
    event = {"id": "ev-%08d" % i, "type": "transaction", "fields": {
        "device_id": "d%06d" % rnd.randrange(entities), "userid": "u%06d" % rnd.randrange(entities),
        "ip": "10.%d.%d.%d" % (ip >> 16 & 255, ip >> 8 & 255, ip & 255),
        "amount": rnd.randrange(100000) / 100}}
    req = urllib.request.Request("http://127.0.0.1:%s/v1/events" % port,
        data=json.dumps({"events": [event]}).encode(), headers={"content-type": "application/json"})
    urllib.request.urlopen(req).read()
PY
sleep 0.3
kill "$MON" "$SVC"
wait "$SVC" 2>/dev/null || true
SVC=
RPID=${RPID:-} CG="$D/callgrind.out" "$VENV/bin/python" - "$RPORT" "$D/monitor.txt" <<'PY'
import glob, os, random, re, subprocess, sys
import redis
r = redis.Redis(port=int(sys.argv[1]))
ESC = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}
def unquote(s):  # MONITOR's quoting of one argument (sdscatrepr)
    out, i = bytearray(), 0
    while i < len(s):
        if s[i] == "\\":
            if s[i + 1] == "x":
                out.append(int(s[i + 2:i + 4], 16)); i += 4
            else:
                out += ESC[s[i + 1]]; i += 2
        else:
            out += s[i].encode("latin-1"); i += 1
    return bytes(out)
arg = re.compile(r'"((?:[^"\\]|\\.)*)"')
calls = []
for line in open(sys.argv[2], encoding="latin-1"):
    args = [unquote(a) for a in arg.findall(line)]
    if args and args[0].lower() == b"evalsha":
        calls.append(args)
n = len(calls)
print("%d metric script calls recorded (one an event), replayed pipelined 200 at a time" % n)
rounds = iter(range(1, 100))
def fresh(c, prefix):  # the same call on keys no earlier round wrote
    keys = int(c[2])
    return c[:3] + [prefix + k[2:] for k in c[3:3 + keys]] + c[3 + keys:]
RPID = os.environ["RPID"]
def callgrind(*args):
    subprocess.run(["callgrind_control", *args, RPID], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
def replay(cmds):
    r.config_resetstat()
    if RPID:
        callgrind("-i", "on")
        callgrind("-z")
    else:
        cpu0 = r.info("cpu")
    for i in range(0, len(cmds), 200):
        p = r.pipeline(transaction=False)
        for c in cmds[i:i + 200]:
            p.execute_command(*c)
        for reply in p.execute(raise_on_error=False):
            if isinstance(reply, Exception):
                sys.exit("a replayed call failed: %s" % reply)
    if RPID:  # instructions since the zero, from the dump just written
        callgrind("-d")
        callgrind("-i", "off")
        dump = max(glob.glob(os.environ["CG"] + "*"), key=os.path.getmtime)
        totals = [l for l in open(dump) if l.startswith(("summary:", "totals:"))]
        cost = int(totals[-1].split()[1]) / n
    else:
        cpu1 = r.info("cpu")
        cost = sum(cpu1[k] - cpu0[k] for k in ("used_cpu_user", "used_cpu_sys")) / n * 1e6
    stats = {k[8:] if k.startswith("cmdstat_") else k: v for k, v in r.info("commandstats").items()}
    return cost, stats
def guard_meta(prefix):
    # On one node a call ends with the keyspace id its script checks against the meta hash
    # (its last key) before it writes: this round's meta hash holds it.
    for c in calls[:1]:
        keys = int(c[2])
        if len(c) > 4 + keys:
            r.hset(prefix + c[2 + keys][2:], "keyspace_id", c[4 + keys])
def best(label, make, twice=False, setup=None):
    runs = []
    for _ in range(1 if RPID else 3):
        prefix = b"r%d:" % next(rounds)
        cmds = [make(c, prefix) for c in calls]
        guard_meta(prefix)
        if setup:
            setup(prefix)
        if twice:
            replay(cmds)
        runs.append(replay(cmds))
    cost, stats = min(runs, key=lambda x: x[0])
    if RPID:
        print("%-40s %7.0f instructions an event" % (label, cost))
        return stats
    script = stats.get("evalsha", {}).get("usec", 0) / n
    inner = sum(v["usec"] for k, v in stats.items() if k not in ("evalsha", "config|resetstat", "info")) / n
    print("%-40s Redis CPU %5.1f us, EVALSHA %5.1f us (commands it ran %4.1f us) an event" % (label, cost, script, inner))
    return stats
stats = best("the script, fresh keys", fresh)
for k, v in sorted(stats.items(), key=lambda x: -x[1]["usec"]):
    if k not in ("evalsha", "config|resetstat", "info") and not RPID:
        print("    %-10s %4.2f an event, %4.2f us each" % (k, v["calls"] / n, v["usec"] / v["calls"]))
best("the script, every event a replay", fresh, twice=True)
# A keyspace in service holds dedupe_expected_ids live ids (50 a bucket by default; 100 or
# 200 in keyspaces made earlier; a bucket drops its expired ones past 1.28x that): the calls
# above find their id buckets nearly empty. The same calls, each bucket first holding FILL other live ids.
FILL = int(os.environ.get("FILL", "50"))
def fill_buckets(prefix, fill=FILL):
    rnd = random.Random(prefix)
    p = r.pipeline(transaction=False)
    for i, key in enumerate(sorted({c[3] for c in calls})):
        p.hset(prefix + key[2:], mapping={str(rnd.getrandbits(64) - (1 << 63)): "4000000000"
                                          for _ in range(fill)})
        if i % 200 == 199:
            p.execute()
    p.execute()
best("the script, id buckets holding %d ids" % FILL, fresh, setup=fill_buckets)
for label, body in (("an empty script, the same keys and arg", "return 1"),
                    ("a script that only unpacks the arg", "return select('#', cmsgpack.unpack_limit(ARGV[1], 1000, 0))")):
    sha = r.script_load(body).encode()
    best(label, lambda c, prefix, sha=sha: [c[0], sha] + fresh(c, prefix)[2:])
PY
