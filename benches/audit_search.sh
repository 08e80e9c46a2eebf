#!/bin/bash
# What one audit search costs, by kind, measured by hand against a release binary on its own
# redis-server (the audit index: src/store/layout.rs, *Audit trail*):
#
#   cargo build --release --bins && benches/audit_search.sh [BIN]
#
# Loads what benches/operators.sh loads (100 upserts of 1,000 phones: 100,000 audit records,
# 96,649 kept under the default cap), then runs each search one at a time over one keep-alive
# connection for 10 s and prints, per call: latency (avg, p99), the service's CPU (its
# utime + stime from /proc over the run) and Redis's (the `usec` of INFO commandstats over the
# run, commands run by scripts included), and the Redis commands it took. `op=delete` is the
# control: a filter the index does not serve, so it examines 10,000 records as every search
# did before the index. Needs redis-server and python3.
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-target/release/namelist}
TOOLS=target/release/namelist-tools
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
echo "binary $BIN, redis-server $(redis-server --version | grep -o 'v=[0-9.]*'), default settings"
python3 - "$SPORT" "$RPORT" "$SVC" <<'PY'
import http.client, json, os, subprocess, sys, time
sport, rport, pid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", sport)
def call(method, path, body=None):
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers={"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    assert r.status == 200, (path, r.status, data)
    return json.loads(data)
t = time.time()
for b in range(100):
    entries = [{"dimension": "phone", "value": "+8613%09d" % (b * 1000 + i), "reason": "load %d" % b,
                "ttl_seconds": 86400 * 30} for i in range(1000)]
    call("POST", "/v1/lists/black/entries", {"entries": entries})
print("100 upserts of 1,000 entries: %.2f s" % (time.time() - t))
def redis(*args):
    return subprocess.run(["redis-cli", "-p", str(rport), *args], check=True,
                          capture_output=True, text=True).stdout
def stats():
    text = redis("INFO", "commandstats")
    calls, usec = {}, 0
    for line in text.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            kv = dict(p.split("=") for p in rest.split(","))
            calls[name] = int(kv["calls"])
            if not name.startswith(("info", "config")):
                usec += int(kv["usec"])
    return calls, usec
def cpu():
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
for name, path in [("page of 100", "/v1/audit?limit=100"),
                   ("who=nobody", "/v1/audit?who=nobody"),
                   ("who (1,000 of a batch)", "/v1/audit?who=anonymous&limit=1000"),
                   ("value", "/v1/audit?dimension=phone&value=%2B8613000050007"),
                   ("op=delete (scan: control)", "/v1/audit?op=delete")]:
    redis("CONFIG", "RESETSTAT")
    c0, lat, end = cpu(), [], time.time() + 10
    while time.time() < end:
        t = time.perf_counter()
        body = call("GET", path)
        lat.append(time.perf_counter() - t)
    calls, usec = stats()
    n = len(lat)
    lat.sort()
    shown = {k: v // n for k, v in sorted(calls.items())
             if not k.startswith(("info", "config", "client", "ping", "hget", "publish", "dump"))}
    print("%-26s %5d calls  avg %7.2f ms  p99 %7.2f ms  service CPU %6.2f ms  Redis %6.2f ms  "
          "%d records  per call: %s" % (name, n, 1e3 * sum(lat) / n, 1e3 * lat[int(0.99 * (n - 1))],
          1e3 * (cpu() - c0) / n, usec / n / 1e3, len(body["records"]), shown))
PY
