#!/bin/bash
# The embedded store's writes with the fsync (issue 28), against the release binary:
#
#   cargo build --release --bins && benches/durable_writes.sh
#
# For each concurrency in CONC (1 8 64): SECS seconds of `POST /v1/lists/black/entries`
# with one entry a request (a random uid of 10^9, so nearly every one is new), then
# `POST /v1/check` of 7 never-seen subjects at -c 64; once with a data directory
# (`NAMELIST_DATA_DIR` under $TMPDIR: every write committed with fsync before its answer,
# commits grouped) and once in memory only (no data directory) for reference. The commits and
# the operations they carried come from the service's own line at shutdown ("embedded store
# closed"): operations / commits is the group size. Needs oha ($OHA, PATH or target/oha/bin).
set -eu
cd "$(dirname "$0")/.."
. benches/lib.sh
SECS=${SECS:-10}
CONC=${CONC:-1 8 64}
python3 - "$D/upserts" <<'PY'
import json, random, sys
random.seed(28)
with open(sys.argv[1], "w") as f:
    for _ in range(200000):
        f.write(json.dumps({"entries": [{"dimension": "uid", "value": "w%d" % random.randrange(10**9)}]}) + "\n")
PY
echo '{"lists":["black","grey"],"subjects":{"uid":"n1","phone":"13900000001","device":"d1","imei":"490154203237518","ip":"10.9.8.7","wifi_mac":"AA-BB-CC-DD-EE-01","email":"a@b.example"}}' >"$D/check"
echo "disk of \$TMPDIR: $(df -T "${TMPDIR:-/tmp}" | awk 'NR==2 {print $1, $2}')"
for mode in durable memory; do
  SPORT=$(free_port)
  extra=()
  [ "$mode" = durable ] && extra=(NAMELIST_DATA_DIR="$D/data")
  env "${extra[@]}" NAMELIST_LISTEN=127.0.0.1:$SPORT RUST_LOG=info NAMELIST_LOG_FORMAT=text \
    "$BIN" >"$D/$mode.log" 2>&1 &
  SVC=$!
  for _ in $(seq 100); do curl -sf "localhost:$SPORT/readyz" >/dev/null && break; sleep 0.1; done
  for c in $CONC; do
    "$OHA" --no-tui --output-format json -z "${SECS}s" -c "$c" -m POST -H "content-type: application/json" \
      -Z "$D/upserts" "http://127.0.0.1:$SPORT/v1/lists/black/entries" >"$D/o.json"
    python3 - "$mode" "$c" "$D/o.json" <<'PY'
import json, sys
mode, c, path = sys.argv[1:]
o = json.load(open(path))
ok = o["statusCodeDistribution"].get("200", 0)
p = o["latencyPercentiles"]
print(f"{mode:7} upserts -c {c:>2}: {o['summary']['requestsPerSec']:8.0f} req/s, p50 {p['p50']*1000:6.2f} ms, p99 {p['p99']*1000:6.2f} ms, 200s {ok}")
PY
  done
  "$OHA" --no-tui --output-format json -z "${SECS}s" -c 64 -m POST -H "content-type: application/json" -D "$D/check" \
    "http://127.0.0.1:$SPORT/v1/check" >"$D/o.json"
  python3 - "$mode" "$D/o.json" <<'PY'
import json, sys
mode, path = sys.argv[1:]
o = json.load(open(path))
p = o["latencyPercentiles"]
print(f"{mode:7} check   -c 64: {o['summary']['requestsPerSec']:8.0f} req/s, p99 {p['p99']*1000:6.2f} ms")
PY
  kill -TERM "$SVC"
  wait "$SVC" 2>/dev/null || true
  SVC=
  grep -h "embedded store closed" "$D/$mode.log" | sed 's/^/  /' || true
done
[ -f "$D/data/namelist.redb" ] && echo "database file: $(du -b "$D/data/namelist.redb" | cut -f1) bytes"
