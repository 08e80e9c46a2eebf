"""What issue 27's option (b) would save: an event's five metric updates (as in
benches/velocity_engine.sh: COUNT 1h by device, SUM and AVG 1d by user, COUNT_DISTINCT 30d
of users by device, APPROX_COUNT_DISTINCT 1d of devices by IP) and its event id, sent to
Redis three ways, measured by Redis's own CPU (`INFO cpu`) per event:

* `lua`: one script call per 9 events (a shared call's size), each event checked and
  recorded in its id bucket (`HSETNX`) and applied only if new, each key's expiry moved only
  when an update opened a new sub-window or member: the metric script's work, without its
  MessagePack argument, keyspace guard, trimming or replies;
* `multi`: the same commands sent plainly in a `MULTI`/`EXEC` per 9 events: no script, so
  nothing conditional: every update applied (no exactly-once) and every key's expiry set;
* `plain`: the same without `MULTI`;
* `merged`: `lua` with the user's SUM and AVG in one hash (fields `s<i>`, `a<2i>`,
  `a<2i+1>`): a price for option (c), fewer keys per entity.

Then (`bridge`) what one `redis.call` costs Redis beyond its command: 200 `HINCRBY`s in one
script call against the same pipelined plainly.

Each mode runs on a fresh redis-server twice: 200,000 events over 200,000 entities from an
empty keyspace, then as many again over the same entities (warm). Calls are pipelined 20 at
a time on one connection, so the network costs Redis little: this prices the commands and
the script bridge, not the service. Needs redis-server and PyPI's `redis` (the venv
`benches/velocity_redis_cost.sh` makes):

    target/bench-venv/bin/python benches/velocity_plain_commands.py [ROUNDS]
"""
import random
import socket
import subprocess
import sys
import tempfile
import time

import redis

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
N, ENTITIES, GROUP = 200_000, 200_000, 9
# Per event: its id bucket, then COUNT, SUM, AVG, COUNT_DISTINCT and the HyperLogLog keys.
LUA = """
local j = 1
for e = 1, #KEYS, 6 do
  local c, d, dd, user, dev, amt, until_code, id = ARGV[j], ARGV[j+1], ARGV[j+2], ARGV[j+3],
    ARGV[j+4], ARGV[j+5], ARGV[j+6], ARGV[j+7]
  local at_c, at_d, at_dd = ARGV[j+8], ARGV[j+9], ARGV[j+10]
  j = j + 11
  if redis.call('HSETNX', KEYS[e], id, until_code) == 1 then
    if redis.call('HINCRBY', KEYS[e+1], c, 1) == 1 then redis.call('PEXPIREAT', KEYS[e+1], at_c) end
    if redis.call('HINCRBY', KEYS[e+2], d, amt) == tonumber(amt) then
      redis.call('PEXPIREAT', KEYS[e+2], at_d)
    end
    redis.call('HINCRBY', KEYS[e+3], d * 2, amt)
    if redis.call('HINCRBY', KEYS[e+3], d * 2 + 1, 1) == 1 then redis.call('PEXPIREAT', KEYS[e+3], at_d) end
    if redis.call('ZADD', KEYS[e+4], 'GT', 'CH', dd, user) == 1 then
      redis.call('PEXPIREAT', KEYS[e+4], at_dd)
      redis.call('ZCARD', KEYS[e+4])
    end
    if redis.call('PFADD', KEYS[e+5], dev) == 1 then redis.call('PEXPIREAT', KEYS[e+5], at_d) end
  end
end
return 1
"""
# `LUA` with the user's SUM and AVG in one hash (KEYS[e+3] unused).
MERGED = LUA.replace("""    if redis.call('HINCRBY', KEYS[e+2], d, amt) == tonumber(amt) then
      redis.call('PEXPIREAT', KEYS[e+2], at_d)
    end
    redis.call('HINCRBY', KEYS[e+3], d * 2, amt)
    if redis.call('HINCRBY', KEYS[e+3], d * 2 + 1, 1) == 1 then redis.call('PEXPIREAT', KEYS[e+3], at_d) end""",
"""    redis.call('HINCRBY', KEYS[e+2], 's' .. d, amt)
    redis.call('HINCRBY', KEYS[e+2], 'a' .. d * 2, amt)
    if redis.call('HINCRBY', KEYS[e+2], 'a' .. d * 2 + 1, 1) == 1 then redis.call('PEXPIREAT', KEYS[e+2], at_d) end""")
assert MERGED != LUA


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start():
    """A fresh redis-server, and a client of it once it answers."""
    port, d = free_port(), tempfile.mkdtemp()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", d], stdout=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    return proc, r


def redis_cpu(r):
    i = r.info("cpu")
    return i["used_cpu_user"] + i["used_cpu_sys"]


def bridge(calls=200, rounds=500):
    """One command from a script against the same sent plainly: `calls` HINCRBYs on one small
    hash, in one script call or pipelined, `rounds` times on fresh keys. Prints Redis's CPU per
    HINCRBY both ways, and the script's time per HINCRBY beside the command's own."""
    proc, r = start()
    sha = r.script_load("for i = 1, tonumber(ARGV[1]) do "
                        "redis.call('HINCRBY', KEYS[1], 'f' .. (i % 50), 1) end")
    for mode in ("script", "plain"):
        r.config_resetstat()
        c0 = redis_cpu(r)
        for k in range(rounds):
            if mode == "script":
                r.evalsha(sha, 1, "b%d" % k, calls)
                continue
            p = r.pipeline(transaction=False)
            for i in range(1, calls + 1):
                p.hincrby("b%d" % k, "f%d" % (i % 50), 1)
            p.execute()
        n = calls * rounds
        stats = r.info("commandstats")
        own = stats["cmdstat_hincrby"]["usec"] / n
        line = "bridge %-6s Redis CPU %.2f us a HINCRBY (the command itself %.2f us)" % (
            mode, (redis_cpu(r) - c0) / n * 1e6, own)
        if mode == "script":
            line += "; the script %.2f us a HINCRBY: %.2f us a redis.call beyond the command" % (
                stats["cmdstat_evalsha"]["usec"] / n, stats["cmdstat_evalsha"]["usec"] / n - own)
        print(line)
    proc.terminate()
    proc.wait()


def measure(mode):
    proc, r = start()
    sha = r.script_load(MERGED if mode == "merged" else LUA)
    rnd = random.Random(27)
    now = int(time.time() * 1000)
    c, dsub, dd = now // 120_000, now // 3_600_000, now // 86_400_000
    until = str(now // 1000 + 86_400)
    at = [str((c + 31) * 120_000), str((dsub + 25) * 3_600_000), str((dd + 31) * 86_400_000)]
    out = []
    for label in ("empty", "warm"):
        c0 = redis_cpu(r)
        p, pending = r.pipeline(transaction=False), 0
        for _ in range(0, N, GROUP):
            keys, argv = [], []
            if mode == "multi":
                p.execute_command("MULTI")
            for _ in range(GROUP):
                dev, user, ip = (rnd.randrange(ENTITIES) for _ in range(3))
                eid, amt = str(rnd.getrandbits(63)), str(rnd.randrange(1, 100_000))
                k = ["e{%d}" % (int(eid) % ENTITIES), "v{d%d}c" % dev, "v{u%d}s" % user,
                     "v{u%d}a" % user, "v{d%d}u" % dev, "v{i%d}h:%d" % (ip, dsub)]
                if mode in ("lua", "merged"):
                    keys += k
                    argv += [c, dsub, dd, "u%d" % user, "d%d" % dev, amt, until, eid] + at
                    continue
                for cmd in (("HSETNX", k[0], eid, until), ("HINCRBY", k[1], c, 1), ("PEXPIREAT", k[1], at[0]),
                            ("HINCRBY", k[2], dsub, amt), ("PEXPIREAT", k[2], at[1]),
                            ("HINCRBY", k[3], dsub * 2, amt), ("HINCRBY", k[3], dsub * 2 + 1, 1),
                            ("PEXPIREAT", k[3], at[1]), ("ZADD", k[4], "GT", "CH", dd, "u%d" % user),
                            ("PEXPIREAT", k[4], at[2]), ("PFADD", k[5], "d%d" % dev), ("PEXPIREAT", k[5], at[1])):
                    p.execute_command(*cmd)
            if mode in ("lua", "merged"):
                p.evalsha(sha, len(keys), *keys, *argv)
            elif mode == "multi":
                p.execute_command("EXEC")
            pending += 1
            if pending >= 20:
                p.execute()
                pending = 0
        p.execute()
        cpu = redis_cpu(r) - c0
        out.append("%s %.1f" % (label, cpu / N * 1e6))
    proc.terminate()
    proc.wait()
    print("%-5s Redis CPU per event: %s us" % (mode, ", ".join(out)))


print("%d events over %d entities, %d a call or MULTI, %d rounds" % (N, ENTITIES, GROUP, ROUNDS))
for _ in range(ROUNDS):
    for mode in ("lua", "multi", "plain", "merged"):
        measure(mode)
    bridge()
