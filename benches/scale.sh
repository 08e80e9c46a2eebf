#!/bin/bash
# The scale benchmark (issue 26): the service at default settings over ROWS entries (default
# 100,000,000) on one redis-server, measured in one run:
#
#   cargo build --release --bins && benches/scale.sh [ROWS]
#
#   1. `namelist-tools gen` + `import` into a fresh keyspace: rows/s, Redis bytes per entry
#      (used_memory after, less before, over the rows);
#   2. a service at default settings: seconds to /readyz and until every bucket answers
#      locally (`namelist_tier_answering_ratio` >= 0.999: a copy or, partial, a filter in
#      sync), its mode, filter bits per entry and resident memory then;
#   3. idle: Redis CPU (`used_cpu_user + used_cpu_sys`) over IDLE_SECS (60) with the service
#      loaded and no traffic, against Redis alone over the same time before the service
#      started, and the tier's background reads meanwhile (`namelist_tier_fetches_total`);
#  3c. a broken subscription (`CLIENT KILL TYPE pubsub`, 20 upserts just before): seconds until
#      every bucket answers locally again and buckets read again, caught up from the change
#      log, then with the log trimmed first (every bucket read again, as before the log);
#   4. the hit and never-seen mixes (max, p99 at 5,000/s, Redis CPU per 1,000 checks) with
#      writes going on: `cargo bench --bench load` at ROWS entries, mixes hit,new, with
#      NAMELIST_LOAD_WRITE_RATE upserts/s (default here 50, 10 entries each) -- it makes its
#      own keyspace on its own redis-server, after this script's is stopped.
#
# Needs redis-server, python3, ~12 GB of free memory and ~12 GB of disk at 100M rows (the CSV
# and the import's spill files). SKIP_LOAD=1 skips part 4.
set -eu
cd "$(dirname "$0")/.."
BIN=target/release/namelist
TOOLS=target/release/namelist-tools
ROWS=${1:-100000000}
IDLE_SECS=${IDLE_SECS:-60}
. benches/lib.sh
redis_cpu() { redis-cli -p "$RPORT" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.3f", s}'; }
redis_mem() { redis-cli -p "$RPORT" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }
metric() { curl -s "http://127.0.0.1:$SPORT/metrics" | awk -v n="$1" '$1 == n {print $2}'; }

KNOBS=$(env | grep '^NAMELIST_' | grep -v -e '^NAMELIST_LOAD_' -e '^NAMELIST_REDIS_URL=' -e '^NAMELIST_FINGERPRINT_KEY_FILE=' | sort | tr '\n' ' ')
echo "scale: $ROWS rows; binary $BIN; redis-server $(redis-server --version | grep -o 'v=[0-9.]*'); $(nproc) cores; settings: ${KNOBS:-defaults}"
"$TOOLS" keygen --out "$D/fp.key" >/dev/null
start_redis
export NAMELIST_REDIS_URL=redis://127.0.0.1:$RPORT NAMELIST_FINGERPRINT_KEY_FILE=$D/fp.key
export NAMELIST_EXPECTED_ENTRIES=$ROWS

# 1. gen + import.
T0=$(date +%s.%N)
"$TOOLS" gen --rows "$ROWS" --out "$D/lists.csv" >/dev/null 2>&1
T1=$(date +%s.%N)
MEM0=$(redis_mem)
"$TOOLS" import "$D/lists.csv" >"$D/import.json" 2>"$D/import.log"
T2=$(date +%s.%N)
MEM1=$(redis_mem)
rm -f "$D/lists.csv"
python3 - "$ROWS" "$T0" "$T1" "$T2" "$MEM0" "$MEM1" <<'PY'
import sys
rows, t0, t1, t2, m0, m1 = int(sys.argv[1]), *map(float, sys.argv[2:5]), int(sys.argv[5]), int(sys.argv[6])
print("1. gen %.1f s; import %.1f s = %.2fM rows/s; Redis %.2f B/entry (used_memory %.2f GB)"
      % (t1 - t0, t2 - t1, rows / (t2 - t1) / 1e6, (m1 - m0) / rows, m1 / 1e9))
PY

# 3a. Redis alone, idle.
C0=$(redis_cpu); sleep "$IDLE_SECS"; C1=$(redis_cpu)
ALONE=$(python3 -c "print('%.2f' % (($C1 - $C0) / $IDLE_SECS * 100))")

# 2. the service.
SPORT=$(free_port)
START=$(date +%s.%N)
NAMELIST_LISTEN=127.0.0.1:$SPORT RUST_LOG=warn "$BIN" >"$D/service.log" 2>&1 &
SVC=$!
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$SPORT/readyz")" = 200 ]; do sleep 0.05; done
READY=$(python3 -c "import time; print('%.1f' % (time.time() - $START))")
while :; do
  A=$(metric namelist_tier_answering_ratio)
  [ -n "$A" ] || { echo "no namelist_tier_answering_ratio in /metrics"; exit 1; }
  python3 -c "import sys; sys.exit(0 if float('${A:-0}') >= 0.999 else 1)" && break
  python3 -c "import sys, time; sys.exit(0 if time.time() - $START < 900 else 1)" \
    || { echo "the tier did not answer every bucket within 900 s (ratio $A)"; break; }
  sleep 0.5
done
LOCAL=$(python3 -c "import time; print('%.1f' % (time.time() - $START))")
MODE=$(curl -s "http://127.0.0.1:$SPORT/metrics" | awk '/^namelist_tier_mode\{/ && $2 == 1 {print $1}')
BITS=$(metric namelist_tier_filter_bits_per_entry)
RSS=$(awk '/VmRSS/ {printf "%d", $2 / 1024}' "/proc/$SVC/status")
echo "2. service: /readyz after $READY s; every bucket answering locally after $LOCAL s ($MODE, filter bits/entry ${BITS:-0}); RSS $RSS MiB"

# 3b. idle with the service.
sleep 10
F0=$(metric namelist_tier_fetches_total); C0=$(redis_cpu); sleep "$IDLE_SECS"; C1=$(redis_cpu); F1=$(metric namelist_tier_fetches_total)
python3 - "$C0" "$C1" "$IDLE_SECS" "$ALONE" "$F0" "$F1" <<'PY'
import sys
c0, c1, secs, alone, f0, f1 = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
total = (c1 - c0) / secs * 100
print("3. idle Redis CPU over %d s: %.2f %% of a core with one loaded instance, %.2f %% alone: "
      "%.2f %% per instance; the tier's background reads %.1f buckets/s"
      % (secs, total, alone, total - alone, (f1 - f0) / secs))
PY

# 3c. a broken subscription, twice: caught up from the change log, then with the log trimmed
# first (a gap: every bucket read again). 20 upserts through the service just before each
# break (their records lie after the mark the catch-up starts from: read again, or trimmed).
catch_up() {
  local trim=$1 f0 c0 t0 n0 ratio
  n0=$(curl -s "http://127.0.0.1:$SPORT/metrics" | awk '/^namelist_tier_catch_ups_total\{/ {s += $2} END {print s}')
  # The parts first: at 100M a SCAN of the keyspace takes seconds, and a trim after them
  # would come after the mark the catch-up starts from (nothing of it trimmed, no gap).
  local parts
  parts=$(redis-cli -p "$RPORT" --scan --pattern '*audit:{*}' | grep -v ':ix')
  # The writes just before the break: after the mark a catch-up starts from (3 s older).
  for i in $(seq 1 20); do
    curl -s -o /dev/null -X POST -H 'content-type: application/json' "http://127.0.0.1:$SPORT/v1/lists/black/entries" \
      -d "{\"entries\": [{\"dimension\": \"device\", \"value\": \"scale-break-$trim-$i\"}]}"
  done
  if [ "$trim" = 1 ]; then
    for k in $parts; do echo "XTRIM $k MAXLEN 0"; done | redis-cli -p "$RPORT" >/dev/null
  fi
  f0=$(metric namelist_tier_fetches_total); c0=$(redis_cpu); t0=$(date +%s.%N)
  redis-cli -p "$RPORT" client kill type pubsub >/dev/null
  while [ "$(curl -s "http://127.0.0.1:$SPORT/metrics" | awk '/^namelist_tier_catch_ups_total\{/ {s += $2} END {print s}')" = "$n0" ]; do sleep 0.05; done
  # A full re-read: wait until every bucket was read again (the answering gauge is refreshed
  # by the tier's sweep, and at 100M it still says 1 for a while after a new generation).
  if [ "$trim" = 1 ]; then
    while python3 -c "import sys; sys.exit(0 if float('$(metric namelist_tier_fetches_total)') - $f0 < $(( (ROWS + 199) / 200 )) * 0.999 else 1)"; do sleep 0.5; done
  fi
  while :; do
    ratio=$(metric namelist_tier_answering_ratio)
    python3 -c "import sys; sys.exit(0 if float('${ratio:-0}') >= 0.999 else 1)" && break
    sleep 0.2
  done
  python3 - "$t0" "$f0" "$(metric namelist_tier_fetches_total)" "$c0" "$(redis_cpu)" \
    "$(curl -s "http://127.0.0.1:$SPORT/metrics" | awk '/^namelist_tier_catch_ups_total\{/ {printf "%s=%s ", $1, $2}')" "$trim" <<'PY'
import sys, time
t0, f0, f1, c0, c1 = map(float, sys.argv[1:6])
print("3c. pub/sub killed%s: every bucket answering locally again after %.1f s; %d buckets read again; Redis CPU %.2f s; %s"
      % (" with the change log trimmed first" if sys.argv[7] == "1" else "", time.time() - t0, f1 - f0, c1 - c0, sys.argv[6]))
PY
}
sleep 5; catch_up 0
sleep 5; catch_up 1

kill "$SVC"; wait "$SVC" 2>/dev/null || true; SVC=
redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1 || true

# 4. the mixes, with writes going on.
if [ "${SKIP_LOAD:-0}" != 1 ]; then
  echo "4. cargo bench --bench load at $ROWS entries (mixes hit,new; ${NAMELIST_LOAD_WRITE_RATE:-50} upserts/s of 10 entries)"
  NAMELIST_LOAD_ENTRIES=$ROWS NAMELIST_LOAD_MIXES=${NAMELIST_LOAD_MIXES:-hit,new} \
    NAMELIST_LOAD_STARTUP_ENTRIES=0 NAMELIST_LOAD_WRITE_RATE=${NAMELIST_LOAD_WRITE_RATE:-50} \
    cargo bench --bench load 2>&1 | grep -v '^\s*\(Compiling\|Finished\|Running\)'
fi
