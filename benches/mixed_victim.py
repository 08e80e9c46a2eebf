"""Reads and writes at once, with a history checked (benches/cluster_reads.sh, row `mixed`):
while oha loads the instance with checks and events, a writer upserts batches of new devices
into `black` and a victim checks, one request at a time,

* a device listed before the run (must always be a hit),
* the last device the writer had been acknowledged for when the check was sent (must be a hit:
  read-your-writes, docs/behaviour.md),
* a device never listed (must never be a hit).

With WRITE_PORT the writer writes through another instance, and the victim's second device is
the last one acknowledged more than the invalidation bound (100 ms) before the check was sent,
which a non-degraded answer must reflect (docs/behaviour.md, *Degraded answers*).

Every 503 is counted apart (a store failure said as one is allowed; a wrong answer is not).
At the end every acknowledged device is checked again, 64 a request. Prints one line of
figures and exits 1 on any wrong answer.

    python3 benches/mixed_victim.py PORT SECS LISTED_DEVICE [WRITE_PORT]
"""

import http.client
import json
import sys
import threading
import time

port, secs, listed = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
write_port = int(sys.argv[4]) if len(sys.argv) > 4 else port
# How long after its acknowledgement a write must be reflected by the victim's instance.
BOUND = 0.0 if write_port == port else 0.1
BATCH, PERIOD = 20, 0.02  # 20 new devices every 20 ms: 1,000 entries/s
acked = []  # devices whose upsert was acknowledged (200), in order
acked_at = []  # (when, how many devices were acknowledged by then), per acknowledged batch
write_ms, write_statuses = [], {}
lock = threading.Lock()
stop = time.monotonic() + secs


def post(conn, path, body):
    t = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    return r.status, json.loads(data) if data else None, (time.perf_counter() - t) * 1e3


def writer():
    conn, n = http.client.HTTPConnection("127.0.0.1", write_port), 0
    while time.monotonic() < stop:
        t = time.monotonic()
        devices = ["wr%07d" % (n + i) for i in range(BATCH)]
        n += BATCH
        status, _, ms = post(conn, "/v1/lists/black/entries", {"entries": [
            {"dimension": "device", "value": d, "sandbox": "loan"} for d in devices]})
        write_ms.append(ms)
        write_statuses[status] = write_statuses.get(status, 0) + 1
        if status == 200:
            with lock:
                acked.extend(devices)
                acked_at.append((time.monotonic(), len(acked)))
        time.sleep(max(0.0, PERIOD - (time.monotonic() - t)))


def check(conn, devices):
    return post(conn, "/v1/check", {"sandbox": "loan", "lists": ["black"], "subjects": {"device": devices}})


def hits(body):
    return {h["value"] for h in body["hits"]}


w = threading.Thread(target=writer)
w.start()
conn = http.client.HTTPConnection("127.0.0.1", port)
check_ms, wrong, unavailable, degraded, i = [], [], 0, 0, 0
while time.monotonic() < stop:
    with lock:
        sent = time.monotonic()
        n = next((k for when, k in reversed(acked_at) if when <= sent - BOUND), 0)
        latest = acked[n - 1] if n else None
    never = "never%09d" % i
    i += 1
    devices = [listed, never] + ([latest] if latest else [])
    status, body, ms = check(conn, devices)
    check_ms.append(ms)
    if status == 503:
        unavailable += 1
        continue
    if status != 200:
        wrong.append((devices, status, body))
        continue
    degraded += body.get("degraded", False)
    want = {listed} | ({latest} if latest else set())
    # A degraded answer may miss what it had no fresh copy of, never invent a hit.
    if (hits(body) != want and not body.get("degraded")) or never in hits(body):
        wrong.append((devices, status, body))
w.join()
missing = []
for k in range(0, len(acked), 64):
    part = acked[k:k + 64]
    status, body, _ = check(conn, part)
    if status != 200 or hits(body) != set(part):
        missing.append((k, status))
pct = lambda v, q: sorted(v)[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
print("  victim: %d checks, p50 %.2f ms, p99 %.2f ms, max %.1f ms; 503 %d, degraded %d, WRONG %d"
      % (len(check_ms), pct(check_ms, .5), pct(check_ms, .99), max(check_ms), unavailable, degraded, len(wrong)))
print("  writer: %d upserts of %d devices (%d acknowledged), p50 %.2f ms, p99 %.2f ms; statuses %s; "
      "acknowledged but not listed after the run: %d batches of 64"
      % (len(write_ms), BATCH, len(acked), pct(write_ms, .5), pct(write_ms, .99), write_statuses, len(missing)))
for x in wrong[:5]:
    print("  wrong answer:", x)
sys.exit(1 if wrong or missing else 0)
