#!/bin/bash
# A victim's events while another client floods events (issue 27's shared calls: the
# flood's events and the victim's share one queue and its calls):
#
#   cargo build --release --bins && benches/events_flood_victim.sh
#
# The release binary on its own redis-server, default settings, the engine bench's five
# metrics. The victim sends one event a request with an id, one at a time, then sleeps 5 ms:
# 5 s alone, then 8 s while the attacker (`oha -c 64`, 10 s, one event a request, random
# ids over 200,000 entities) floods `POST /v1/events`. Prints, per phase, the victim's
# events, how many were applied whole (5 updates), any other answer, its latency p50 / p99
# / max, and whether its COUNT and SUM read back equal the events applied (EXACT or WRONG);
# then the attacker's rate. Needs redis-server, python3 and oha ($OHA, PATH, or
# target/oha/bin, which `cargo bench --bench load` installs).
set -eu
cd "$(dirname "$0")/.."
. benches/lib.sh
start_redis
"$TOOLS" keygen --out "$D/fp.key" >/dev/null
python3 - "$D" <<'PY'
import json, random, sys
sys.path.insert(0, "benches")
import bodies
rnd = random.Random(27)
with open(sys.argv[1] + "/events.txt", "w") as f:
    for i in range(300000):
        f.write(json.dumps(bodies.transaction(rnd, i, 200000, "att")) + "\n")
PY
SPORT=$(free_port)
NAMELIST_LISTEN=127.0.0.1:$SPORT NAMELIST_REDIS_URL=redis://127.0.0.1:$RPORT \
  NAMELIST_FINGERPRINT_KEY_FILE="$D/fp.key" RUST_LOG=warn "$BIN" >>"$D/service.log" 2>&1 &
SVC=$!
for _ in $(seq 100); do curl -sf "localhost:$SPORT/readyz" >/dev/null && break; sleep 0.1; done
define() { curl -sf -X PUT -H 'content-type: application/json' "localhost:$SPORT/v1/metrics/$1" -d "{\"expr\": \"$2\"}" >/dev/null; }
define tx_dev_1h "COUNT(1h, transaction) BY device_id"
define amt_user_1d "SUM(1d, transaction, amount) BY userid"
define avg_user_1d "AVG(1d, transaction, amount) BY userid"
define users_dev_30d "COUNT_DISTINCT(30d, transaction, userid) BY device_id"
define devs_ip_1d "APPROX_COUNT_DISTINCT(1d, transaction, device_id) BY ip"
sleep 2
victim() { # label secs
python3 - "$SPORT" "$2" "$1" <<'PY'
import http.client, json, sys, time
port, secs, label = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
conn = http.client.HTTPConnection("127.0.0.1", port)
def post(path, body):
    t = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse(); data = r.read()
    return r.status, json.loads(data), (time.perf_counter() - t) * 1e3
ms, ok, bad, stop, i = [], 0, {}, time.monotonic() + secs, 0
while time.monotonic() < stop:
    i += 1
    ev = {"id": "victim-%s-%d" % (label, i), "type": "transaction",
          "fields": {"device_id": "victim-d-" + label, "userid": "victim-u-" + label, "ip": "10.250.0.1", "amount": 1}}
    st, body, t = post("/v1/events", ev)
    ms.append(t)
    if st == 200 and body.get("applied") == 5: ok += 1
    else: bad[st] = bad.get(st, 0) + 1
    time.sleep(0.005)
st, f, _ = post("/v1/features", {"metrics": ["tx_dev_1h", "amt_user_1d"], "fields": {"device_id": "victim-d-" + label, "userid": "victim-u-" + label}})
ms.sort(); q = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]
exact = f["values"]["tx_dev_1h"] == ok and f["values"]["amt_user_1d"] == ok
print("%-8s victim: %d events, %d applied, other %s; p50 %.2f p99 %.2f max %.2f ms; counts %s (COUNT %s, SUM %s)" % (
    label, len(ms), ok, bad, q(0.5), q(0.99), ms[-1], "EXACT" if exact else "WRONG", f["values"]["tx_dev_1h"], f["values"]["amt_user_1d"]))
PY
}
victim alone 5
"$OHA" --no-tui --output-format json -z 10s -m POST -H 'content-type: application/json' -c 64 \
  -Z "$D/events.txt" "http://127.0.0.1:$SPORT/v1/events" > "$D/att.json" &
ATT=$!
sleep 1
victim flood 8
wait $ATT
python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); print("attacker: %.0f events/s, %s" % (o["summary"]["requestsPerSec"], o["statusCodeDistribution"]))' "$D/att.json"
kill $SVC; wait $SVC 2>/dev/null || true
