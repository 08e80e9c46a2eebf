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
#   200,000 entities, with `write_replicas = 1` (the production recommendation).
# Prints requests/s, p99, and Redis CPU per request (`used_cpu_user + used_cpu_sys` of all six
# nodes around the run). Needs redis-server, redis-cli, python3 and oha ($OHA, PATH, or
# target/oha/bin, which `cargo bench --bench load` installs).
set -eu
cd "$(dirname "$0")/.."
. benches/lib.sh
NEW=${BIN:-target/release/namelist}
OLD=${OLD:-}
TOOLS=target/release/namelist-tools
OHA=${OHA:-$(command -v oha || echo target/oha/bin/oha)}
SECS=${SECS:-8}
ROUNDS=${ROUNDS:-2}
PORTS=""
while [ "$(echo $PORTS | wc -w)" -lt 6 ]; do
  p=$(free_port)
  python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', $p + 10000))" 2>/dev/null && PORTS="$PORTS $p"
done
stop_all() { for p in $PORTS; do redis-cli -p $p shutdown nosave >/dev/null 2>&1 || true; done; cleanup; }
trap stop_all EXIT
for p in $PORTS; do
  mkdir -p $D/$p
  redis-server --port $p --cluster-enabled yes --cluster-node-timeout 1000 --cluster-config-file $D/$p/nodes.conf \
    --save '' --appendonly no --dir $D/$p --daemonize yes --logfile $D/$p/log
done
sleep 0.5
redis-cli --cluster create $(for p in $PORTS; do echo 127.0.0.1:$p; done) --cluster-replicas 1 --cluster-yes >/dev/null
FIRST=$(echo $PORTS | cut -d' ' -f1)
for _ in $(seq 100); do redis-cli -p $FIRST cluster info | grep -q cluster_state:ok && break; sleep 0.2; done
sleep 2
NODES=$(for p in $PORTS; do printf "redis://127.0.0.1:%s," $p; done | sed 's/,$//')
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
run() { # name binary prefix path file extra-env...
  local name=$1 bin=$2 prefix=$3 path=$4 file=$5; shift 5
  env "$@" NAMELIST_LISTEN=127.0.0.1:$SP NAMELIST_REDIS_CLUSTER_NODES=$NODES NAMELIST_FINGERPRINT_KEY_FILE=$D/fp.key \
    NAMELIST_KEY_PREFIX=$prefix RUST_LOG=warn "$bin" >>$D/svc.log 2>&1 &
  SVC=$!
  for _ in $(seq 200); do curl -sf localhost:$SP/readyz >/dev/null && break; sleep 0.1; done
  if [ "$path" = /v1/events ]; then
    def() { curl -sf -X PUT -H 'content-type: application/json' localhost:$SP/v1/metrics/$1 -d "{\"expr\": \"$2\"}" >/dev/null; }
    def tx_dev_1h "COUNT(1h, transaction) BY device_id"
    def amt_user_1d "SUM(1d, transaction, amount) BY userid"
    def avg_user_1d "AVG(1d, transaction, amount) BY userid"
    def users_dev_30d "COUNT_DISTINCT(30d, transaction, userid) BY device_id"
    def devs_ip_1d "APPROX_COUNT_DISTINCT(1d, transaction, device_id) BY ip"
    sleep 1
  fi
  "$OHA" --no-tui -z 2s -m POST -H 'content-type: application/json' -Z $file -c 64 http://127.0.0.1:$SP$path >/dev/null
  local c0=$(cpu)
  "$OHA" --no-tui --output-format json -z ${SECS}s -m POST -H 'content-type: application/json' -Z $file -c 64 http://127.0.0.1:$SP$path >$D/o.json
  local c1=$(cpu)
  kill $SVC; wait $SVC 2>/dev/null || true; SVC=
  python3 - "$name" $c0 $c1 $D/o.json <<'PY'
import json, sys
name, c0, c1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
o = json.load(open(sys.argv[4])); n = sum(o["statusCodeDistribution"].values())
print("%-34s %8.0f/s  p99 %6.2f ms  Redis %6.1f us/request  %s" % (name, o["summary"]["requestsPerSec"],
      o["latencyPercentiles"]["p99"] * 1e3, (c1 - c0) * 1e6 / n, o["statusCodeDistribution"]))
PY
}
echo "redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, 6 nodes; $SECS s a run"
for round in $(seq "$ROUNDS"); do
  for which in ${OLD:+old} new; do
    bin=$NEW; [ $which = old ] && bin=$OLD
    run "$which check, tier off" "$bin" "c$which$round:" /v1/check $D/checks.txt NAMELIST_LOCAL_MEMORY_MB=0
    run "$which check, default tier" "$bin" "d$which$round:" /v1/check $D/checks.txt
    run "$which events, write_replicas=1" "$bin" "e$which$round:" /v1/events $D/events.txt NAMELIST_WRITE_REPLICAS=1
  done
done
