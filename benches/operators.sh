#!/bin/bash
# The operators' endpoints (issue 13) and what their bookkeeping costs writes, measured by
# hand against a release binary on its own redis-server:
#
#   cargo build --release --bins && benches/operators.sh [BIN] [before]
#
# BIN defaults to target/release/namelist; `before` measures only the routes an older binary
# has (writes and checks), for a before/after comparison. It loads 100 upserts of 1,000
# phones each (so 100,000 audit records), then runs oha for 10 s, one connection, on: a
# single-entry upsert (a refresh: the same entry every time), a check that hits it,
# GET /v1/lists, a page of 100 audit records, an audit filter that matches nothing (10,000
# records examined), an audit value filter, and the lookup of one identity on every list.
# Needs redis-server and python3; oha from $OHA, PATH, or target/oha/bin (which
# `cargo bench --bench load` installs).
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-target/release/namelist}
MODE=${2:-new}
TOOLS=target/release/namelist-tools
OHA=${OHA:-$(command -v oha || echo target/oha/bin/oha)}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
RPORT=$(free_port)
SPORT=$(free_port)
D=$(mktemp -d)
redis-server --port "$RPORT" --save '' --appendonly no --dir "$D" --daemonize yes --logfile "$D/redis.log"
"$TOOLS" keygen --out "$D/fp.key" >/dev/null
NAMELIST_LISTEN=127.0.0.1:$SPORT NAMELIST_REDIS_URL=redis://127.0.0.1:$RPORT \
  NAMELIST_FINGERPRINT_KEY_FILE=$D/fp.key "$BIN" >"$D/service.log" 2>&1 &
SVC=$!
trap 'kill $SVC 2>/dev/null; redis-cli -p $RPORT shutdown nosave >/dev/null 2>&1; rm -rf "$D"' EXIT
for _ in $(seq 100); do curl -sf "localhost:$SPORT/readyz" >/dev/null && break; sleep 0.1; done
echo "binary $BIN ($MODE), redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), default settings"
python3 - "$SPORT" <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
t = time.time()
for b in range(100):
    entries = [{"dimension": "phone", "value": "+8613%09d" % (b * 1000 + i), "reason": "load %d" % b,
                "ttl_seconds": 86400 * 30} for i in range(1000)]
    req = urllib.request.Request("http://127.0.0.1:%s/v1/lists/black/entries" % port,
                                 data=json.dumps({"entries": entries}).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    urllib.request.urlopen(req).read()
print("100 upserts of 1,000 entries: %.2f s" % (time.time() - t))
PY
run() { # name method url [body]
  local name=$1 url=$3 body=()
  if [ $# -ge 4 ]; then
    echo "$4" >"$D/body.json"
    body=(-m POST -H 'content-type: application/json' -D "$D/body.json")
  fi
  "$OHA" --no-tui --output-format json -z 10s -c 1 "${body[@]}" "$url" >"$D/$name.json"
  python3 - "$name" "$D/$name.json" <<'PY'
import json, sys
o = json.load(open(sys.argv[2]))
s, p = o["summary"], o["latencyPercentiles"]
ms = lambda v: "%.3f" % (v * 1e3) if v is not None else "-"
print("%-18s %7.0f/s  avg %s ms  p50 %s  p99 %s  max %s  %s" % (sys.argv[1], s["requestsPerSec"],
      ms(s["average"]), ms(p["p50"]), ms(p["p99"]), ms(s["slowest"]), o["statusCodeDistribution"]))
PY
}
U=http://127.0.0.1:$SPORT
run upsert-refresh POST "$U/v1/lists/black/entries" \
  '{"entries":[{"dimension":"phone","value":"+8613000000007","reason":"refresh","ttl_seconds":86400}]}'
run check-hit POST "$U/v1/check" '{"sandbox":"default","lists":["black"],"subjects":{"phone":"+8613000000007"}}'
if [ "$MODE" != before ]; then
  run lists GET "$U/v1/lists"
  run audit-page-100 GET "$U/v1/audit?limit=100"
  run audit-no-match GET "$U/v1/audit?who=nobody"
  run audit-value GET "$U/v1/audit?dimension=phone&value=%2B8613000050007"
  run lookup GET "$U/v1/lists/-/lookup/phone/%2B8613000000007?sandbox=default"
fi
