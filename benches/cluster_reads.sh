#!/bin/bash
# What a cluster costs the checks and the events, and what the shard markers add to it, on a
# local 6-node cluster (3 primaries and their replicas, all on this machine's cores), default
# settings but for the knob each row names:
#
#   cargo build --release --bins && benches/cluster_reads.sh
#   OLD=path/to/an/older/namelist benches/cluster_reads.sh   # the two builds alternating
#
# Rows, ROUNDS times (default 2), each on a key prefix of its own, SECS (8) s of `oha -c 64`
# after 2 s of warm-up:
# * `POST /v1/check` of 7 never-seen subjects on lists black and grey with the local tier off
#   (`local_memory_mb = 0`: every lookup to Redis, so every read carries its slots' shard
#   markers; the markers' worst case, said so on the row);
# * the same check at the default tier (what the engine's traffic meets);
# * `POST /v1/events`, one event a request, five metrics (as in benches/velocity_engine.sh),
#   200,000 entities, with `write_replicas = 1` (the production recommendation);
# * `mixed`: production's settings (`write_replicas = 1`, default tier) under reads and writes
#   at once: checks at their maximum (`oha -c 32`), events at 1,000/s (`-q 1000 -c 16`), a
#   writer upserting 1,000 new devices a second and a victim checking one request at a time
#   (benches/mixed_victim.py: its history must hold, read-your-writes included; the bench
#   exits 1 if not). Redis CPU is the whole run's, in % of a core.
# ROWS picks rows (default: tier-off default events mixed). ENTRIES=N (default 0) first has
# `namelist-tools gen` + `import` load N entries into the mixed row's keyspace, and measures
# once every bucket answers locally: the production settings at the size users reach.
# INSTANCES=2 gives the `mixed` row a second instance (same settings and keyspace) that the
# writer writes through: the victim then checks another instance's writes, which must show
# within the invalidation bound (100 ms) of their acknowledgement.
# TOPOLOGY=node runs the same rows on one primary and its replica instead of the cluster
# (`NAMELIST_REDIS_URL`, `write_replicas = 1` waiting for that replica): where one node's
# events share script calls (`store::redis::coalesce`), which a cluster's do not.
# Prints requests/s, p99, and Redis CPU per request (`used_cpu_user + used_cpu_sys` of all the
# nodes around the run). Needs redis-server, redis-cli, python3 and oha ($OHA, PATH, or
# target/oha/bin, which `cargo bench --bench load` installs).
set -eu
cd "$(dirname "$0")/.."
. benches/lib.sh
NEW=$BIN
OLD=${OLD:-}
SECS=${SECS:-8}
ROUNDS=${ROUNDS:-2}
ROWS=${ROWS:-tier-off default events mixed}
ENTRIES=${ENTRIES:-0}
row() { case " $ROWS " in *" $1 "*) return 0 ;; esac; return 1; }
TOPOLOGY=${TOPOLOGY:-cluster}
want=6; [ "$TOPOLOGY" = node ] && want=2
PORTS=""
while [ "$(echo $PORTS | wc -w)" -lt $want ]; do
  p=$(free_port)
  python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', $p + 10000))" 2>/dev/null && PORTS="$PORTS $p"
done
SVC2=
stop_all() {
  [ -n "$SVC2" ] && kill $SVC2 2>/dev/null
  for p in $PORTS; do redis-cli -p $p shutdown nosave >/dev/null 2>&1 || true; done
  cleanup
}
trap stop_all EXIT
FIRST=$(echo $PORTS | cut -d' ' -f1)
if [ "$TOPOLOGY" = node ]; then
  for p in $PORTS; do
    mkdir -p $D/$p
    redis-server --port $p --save '' --appendonly no --dir $D/$p --daemonize yes --logfile $D/$p/log
  done
  sleep 0.5
  redis-cli -p "$(echo $PORTS | cut -d' ' -f2)" replicaof 127.0.0.1 $FIRST >/dev/null
  for _ in $(seq 100); do redis-cli -p $FIRST info replication | grep -q 'connected_slaves:1' && break; sleep 0.2; done
  REDIS_ENV="NAMELIST_REDIS_URL=redis://127.0.0.1:$FIRST"
else
  for p in $PORTS; do
    mkdir -p $D/$p
    redis-server --port $p --cluster-enabled yes --cluster-node-timeout 1000 --cluster-config-file $D/$p/nodes.conf \
      --save '' --appendonly no --dir $D/$p --daemonize yes --logfile $D/$p/log
  done
  sleep 0.5
  redis-cli --cluster create $(for p in $PORTS; do echo 127.0.0.1:$p; done) --cluster-replicas 1 --cluster-yes >/dev/null
  for _ in $(seq 100); do redis-cli -p $FIRST cluster info | grep -q cluster_state:ok && break; sleep 0.2; done
  sleep 2
  REDIS_ENV="NAMELIST_REDIS_CLUSTER_NODES=$(for p in $PORTS; do printf "redis://127.0.0.1:%s," $p; done | sed 's/,$//')"
fi
"$TOOLS" keygen --out $D/fp.key >/dev/null 2>&1
python3 - $D <<'PY'
import json, random, sys
sys.path.insert(0, "benches")
from bodies import subjects, transaction
d = sys.argv[1]; rnd = random.Random(7)
with open(d + "/checks.txt", "w") as f:
    for i in range(100000):
        f.write(json.dumps({"sandbox": "loan", "lists": ["black", "grey"], "subjects": subjects(rnd)}) + "\n")
with open(d + "/events.txt", "w") as f:
    for i in range(600000):
        f.write(json.dumps(transaction(rnd, i, 200000)) + "\n")
PY
cpu() { local t=0; for p in $PORTS; do t=$(python3 -c "print($t + $(redis-cli -p $p info cpu | awk -F: '/used_cpu_(user|sys):/{s+=$2} END{print s}'))"); done; echo $t; }
SP=$(free_port)
start_svc() { # binary prefix extra-env...
  local bin=$1 prefix=$2; shift 2
  env "$@" NAMELIST_LISTEN=127.0.0.1:$SP $REDIS_ENV NAMELIST_FINGERPRINT_KEY_FILE=$D/fp.key \
    NAMELIST_KEY_PREFIX=$prefix RUST_LOG=warn "$bin" >>$D/svc.log 2>&1 &
  SVC=$!
  for _ in $(seq 200); do curl -sf localhost:$SP/readyz >/dev/null && break; sleep 0.1; done
}
stop_svc() { kill $SVC; wait $SVC 2>/dev/null || true; SVC=; }
define5() {
  def() { curl -sf -X PUT -H 'content-type: application/json' localhost:$SP/v1/metrics/$1 -d "{\"expr\": \"$2\"}" >/dev/null; }
  def tx_dev_1h "COUNT(1h, transaction) BY device_id"
  def amt_user_1d "SUM(1d, transaction, amount) BY userid"
  def avg_user_1d "AVG(1d, transaction, amount) BY userid"
  def users_dev_30d "COUNT_DISTINCT(30d, transaction, userid) BY device_id"
  def devs_ip_1d "APPROX_COUNT_DISTINCT(1d, transaction, device_id) BY ip"
  sleep 1
}
load() { # json-out path file oha-args...
  local out=$1 path=$2 file=$3; shift 3
  "$OHA" --no-tui --output-format json -z ${SECS}s -m POST -H 'content-type: application/json' -Z $file "$@" http://127.0.0.1:$SP$path >$out
}
report() { # name cpu0 cpu1 oha-json
  python3 - "$@" <<'PY'
import json, sys
name, c0, c1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
o = json.load(open(sys.argv[4])); n = sum(o["statusCodeDistribution"].values())
redis = "  Redis %6.1f us/request" % ((c1 - c0) * 1e6 / n) if c1 > c0 else ""
print("%-34s %8.0f/s  p99 %6.2f ms%s  %s" % (name, o["summary"]["requestsPerSec"],
      o["latencyPercentiles"]["p99"] * 1e3, redis, o["statusCodeDistribution"]))
PY
}
run() { # name binary prefix path file extra-env...
  local name=$1 bin=$2 prefix=$3 path=$4 file=$5; shift 5
  start_svc "$bin" "$prefix" "$@"
  [ "$path" = /v1/events ] && define5
  "$OHA" --no-tui -z 2s -m POST -H 'content-type: application/json' -Z $file -c 64 http://127.0.0.1:$SP$path >/dev/null
  local c0=$(cpu)
  load $D/o.json "$path" "$file" -c 64
  local c1=$(cpu)
  stop_svc
  report "$name" $c0 $c1 $D/o.json
}
# Checks at their maximum, events at 1,000/s and list writes at once, with write_replicas = 1
# and the default tier (production's settings); the victim's history must hold (exit 1 if not).
mixed() { # name binary prefix
  local name=$1 bin=$2 prefix=$3
  if [ "$ENTRIES" -gt 0 ]; then
    "$TOOLS" gen --rows "$ENTRIES" --out $D/lists.csv >/dev/null 2>&1
    local t0=$(date +%s.%N)
    env $REDIS_ENV NAMELIST_FINGERPRINT_KEY_FILE=$D/fp.key NAMELIST_KEY_PREFIX=$prefix \
      NAMELIST_EXPECTED_ENTRIES=$ENTRIES "$TOOLS" import $D/lists.csv >$D/import.json 2>$D/import.log \
      || { echo "import failed:" >&2; grep -m2 -B2 -A6 -i "panicked\|error" $D/import.log >&2; exit 1; }
    rm -f $D/lists.csv
    echo "  $ENTRIES entries imported in $(python3 -c "print('%.0f' % ($(date +%s.%N) - $t0))") s"
  fi
  local t1=$(date +%s.%N) wp=$SP
  start_svc "$bin" "$prefix" NAMELIST_WRITE_REPLICAS=1
  if [ "${INSTANCES:-1}" = 2 ]; then
    wp=$(free_port)
    env NAMELIST_WRITE_REPLICAS=1 NAMELIST_LISTEN=127.0.0.1:$wp $REDIS_ENV NAMELIST_FINGERPRINT_KEY_FILE=$D/fp.key \
      NAMELIST_KEY_PREFIX=$prefix RUST_LOG=warn "$bin" >>$D/svc2.log 2>&1 &
    SVC2=$!
    for _ in $(seq 200); do curl -sf localhost:$wp/readyz >/dev/null && break; sleep 0.1; done
  fi
  if [ "$ENTRIES" -gt 0 ]; then
    # Measured once every bucket answers locally, as an instance in service does.
    for port in $SP $wp; do
      for _ in $(seq 1200); do
        python3 -c "import sys; sys.exit(0 if float(sys.argv[1] or 0) >= 0.999 else 1)" \
          "$(curl -s localhost:$port/metrics | awk '$1 == "namelist_tier_answering_ratio" {print $2}')" && break
        sleep 0.5
      done
    done
    echo "  every bucket answering locally $(python3 -c "print('%.0f' % ($(date +%s.%N) - $t1))") s after the start"
  fi
  define5
  curl -sf -X POST -H 'content-type: application/json' localhost:$SP/v1/lists/black/entries \
    -d '{"entries": [{"dimension": "device", "value": "victim-listed", "sandbox": "loan"}]}' >/dev/null
  local c0=$(cpu)
  load $D/mc.json /v1/check $D/checks.txt -c 32 &
  local lc=$!
  load $D/me.json /v1/events $D/events.txt -q 1000 -c 16 &
  local le=$!
  local v=0
  python3 benches/mixed_victim.py $SP $SECS victim-listed $wp || v=$?
  wait $lc $le
  local c1=$(cpu)
  stop_svc
  if [ -n "$SVC2" ]; then kill $SVC2; wait $SVC2 2>/dev/null || true; SVC2=; fi
  report "$name: checks (-c 32)" 0 0 $D/mc.json
  report "$name: events (1,000/s)" 0 0 $D/me.json
  echo "  Redis CPU, $want nodes: $(python3 -c "print('%.0f' % (($c1 - $c0) * 100 / $SECS))") % of a core"
  [ $v = 0 ] || { echo "$name: the victim's history broke" >&2; exit 1; }
}
echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, $TOPOLOGY of $want nodes; ${INSTANCES:-1} instance(s) in the mixed row; $SECS s a run"
for round in $(seq "$ROUNDS"); do
  for which in ${OLD:+old} new; do
    bin=$NEW; [ $which = old ] && bin=$OLD
    if row tier-off; then run "$which check, tier off" "$bin" "c$which$round:" /v1/check $D/checks.txt NAMELIST_LOCAL_MEMORY_MB=0; fi
    if row default; then run "$which check, default tier" "$bin" "d$which$round:" /v1/check $D/checks.txt; fi
    if row events; then run "$which events, write_replicas=1" "$bin" "e$which$round:" /v1/events $D/events.txt NAMELIST_WRITE_REPLICAS=1; fi
    if row mixed; then mixed "$which mixed, write_replicas=1" "$bin" "m$which$round:"; fi
  done
done
