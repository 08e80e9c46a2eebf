//! Every Lua script the Redis store runs, in one place: the keyspace's opening, the entry
//! scripts (removal, compare-and-delete, the audit's expiry count), the lists' counts (change,
//! page, and the fold of the older layout's parts), the metric families, the definitions and
//! the audit trail's index (append and trim, catch-up).
//!
//! Invariant: the "still live" rule is written once in Lua (`ENTRY_PREAMBLE`'s `live_code`,
//! the twin of `ExpiryCode::is_live`, which a test in `expiry` checks against the same
//! arithmetic), and every entry script that judges expiry starts with that preamble and takes
//! "now" as `ExpiryCode::script_now`. Entry scripts touch one bucket (`KEYS[1]`), so each runs
//! on the node that owns it, in a cluster too; the counts' scripts touch the keys of one hash
//! tag. Likewise the index of an audit record is
//! written, and removed, only by `AUDIT_PREAMBLE`'s `members` (the twin of
//! `AuditRecord::terms` and `layout::audit_index_term`), from the record's own fields, and
//! every audit script touches one stream and its index, which share a hash tag. Scripts are
//! called by SHA (`EVALSHA`) and loaded again after a `NOSCRIPT` (`is_noscript`), except the
//! definitions' small ones and the audit append, sent whole (`EVAL`): the append runs inside
//! a write's `MULTI`, where a `NOSCRIPT` (a failover to a node that never loaded it) would
//! fail that one command after the entries before it were written; and the counts' fold, run
//! once at start-up through `Script::invoke_async` (which loads it when missing).

use std::sync::LazyLock;

use redis::{ErrorKind, RedisError, Script, ServerErrorKind};

/// The start of every entry script that judges expiry: `live_code(c, now)` is whether an entry
/// with code `c` is still live at `now` (ms since 2020: `ExpiryCode::script_now`); `0` never
/// expires.
pub const ENTRY_PREAMBLE: &str = r"
local function live_code(c, now)
  return c == 0 or c * 1000 > now
end
";

/// Opens the keyspace. KEYS: the meta hash, the lost marker (one slot). Creates the meta hash
/// if it is missing and ARGV[1] (the format to create) is not empty, with ARGV[4] the key id
/// ('' in format 1) and ARGV[5] a new random keyspace id; but not where the lost marker
/// stands (a running instance saw this keyspace vanish) unless ARGV[6] is '1' (the explicit
/// `namelist-tools keyspace create`), which also removes the marker. A keyspace found without
/// an id (made before ids) is given ARGV[5]. Returns (format, buckets, created, key id,
/// keyspace id), created being 1 (created now), 0 (found), -1 (missing, and nothing to create
/// it with) or -2 (missing where the lost marker stands; the keyspace id is the lost one's).
pub(super) const OPEN_KEYSPACE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  if ARGV[1] == '' then return {false, false, -1, false, false} end
  if ARGV[6] ~= '1' and redis.call('EXISTS', KEYS[2]) == 1 then
    return {false, false, -2, false, redis.call('GET', KEYS[2])}
  end
  redis.call('HSET', KEYS[1], 'format', ARGV[1], 'buckets', ARGV[2], 'created_ms', ARGV[3],
    'keyspace_id', ARGV[5])
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'key_id', ARGV[4]) end
  redis.call('DEL', KEYS[2])
  return {ARGV[1], ARGV[2], 1, ARGV[4], ARGV[5]}
end
redis.call('HSETNX', KEYS[1], 'keyspace_id', ARGV[5])
local m = redis.call('HMGET', KEYS[1], 'format', 'buckets', 'key_id', 'keyspace_id')
return {m[1], m[2], 0, m[3], m[4]}
";

/// A write's `PUBLISH`, only while the keyspace is the one the writer opened: KEYS[1] the
/// meta hash, ARGV the keyspace id, the channel, the message. Sent inside a write's `MULTI`
/// on one node, so that a write that reached a keyspace lost meanwhile (and is answered
/// `keyspace_lost`, never acknowledged) is announced to no instance. Returns 1 if published.
pub(super) const GUARDED_PUBLISH: &str = r"
if redis.call('HGET', KEYS[1], 'keyspace_id') ~= ARGV[1] then return 0 end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
";

/// Deletes fields of one bucket; per field 1 if it was present and live at ARGV[1]
/// (`ExpiryCode::script_now`), 2 if present but expired, 0 if absent.
const REMOVE: &str = r"
local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  local live = 0
  if v then
    redis.call('HDEL', KEYS[1], ARGV[i])
    local c = tonumber(v)
    if live_code(c, now) then live = 1 else live = 2 end
  end
  out[#out + 1] = live
end
return out
";

/// The start of every metric script. ARGV: 1 update sub-window (or ''), 2 value, 3 read_hi,
/// 4 slots, 5 trim_hi, 6 expire_at, 7 '1' to read the value back, 8 the event's hash (or ''),
/// 9 family-specific. KEYS[1] is the entity's key, KEYS[2] its set of applied events. An
/// event already applied to this entity is not applied again (`dup` = 1): checked and recorded
/// in the same atomic call as the update, so a retry after any failure or timeout applies each
/// update exactly once.
const METRIC_PREAMBLE: &str = r"
local function extend(k, at)
  local cur = redis.call('PEXPIRETIME', k)
  if cur < 0 or cur < at then redis.call('PEXPIREAT', k, at) end
end
local n = tonumber(ARGV[4])
local floor = tonumber(ARGV[5]) - n + 1
local at = tonumber(ARGV[6])
local hi = tonumber(ARGV[3])
local lo = hi - n + 1
local read = ARGV[7] == '1'
local update = ARGV[1] ~= ''
local dup = 0
if update and ARGV[8] ~= '' then
  if redis.call('ZSCORE', KEYS[2], ARGV[8]) then
    dup = 1
    update = false
  else
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[8])
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. floor)
    extend(KEYS[2], at)
  end
end
-- Field f of a hash holds sub-window floor(f / width). Once the hash holds more fields than
-- the window needs, drops those of sub-windows that left it.
local function trim(k, width)
  if redis.call('HLEN', k) > width * n then
    for _, f in ipairs(redis.call('HKEYS', k)) do
      if math.floor(tonumber(f) / width) < floor then redis.call('HDEL', k, f) end
    end
  end
end
-- Appends to out the values (and, with fields, each value's field first) of the read window.
local function read_window(k, width, out, fields)
  local all = redis.call('HGETALL', k)
  for i = 1, #all, 2 do
    local s = math.floor(tonumber(all[i]) / width)
    if s >= lo and s <= hi then
      if fields then out[#out + 1] = all[i] end
      out[#out + 1] = all[i + 1]
    end
  end
end
";

/// COUNT and SUM: a hash of sub-window → total. Returns {dup, totals read...} (exact i64
/// strings, summed by the caller).
const METRIC_SUM: &str = r"
local k = KEYS[1]
if update then
  redis.call('HINCRBY', k, ARGV[1], ARGV[2])
  trim(k, 1)
  extend(k, at)
end
local out = {dup}
if read then read_window(k, 1, out, false) end
return out
";

/// AVG: fields 2i (sum) and 2i+1 (count). Returns {dup, field, value, ...} of the window.
const METRIC_AVG: &str = r"
local k = KEYS[1]
if update then
  local f = tonumber(ARGV[1]) * 2
  redis.call('HINCRBY', k, f, ARGV[2])
  redis.call('HINCRBY', k, f + 1, 1)
  trim(k, 2)
  extend(k, at)
end
local out = {dup}
if read then read_window(k, 2, out, true) end
return out
";

/// MIN and MAX (ARGV[9] 'min' or 'max'): a hash of sub-window → extreme. Returns {dup,
/// per-sub-window extremes read...}.
const METRIC_EXTREME: &str = r"
local k = KEYS[1]
if update then
  local cur = redis.call('HGET', k, ARGV[1])
  local v = tonumber(ARGV[2])
  if not cur or (ARGV[9] == 'min' and v < tonumber(cur)) or (ARGV[9] == 'max' and v > tonumber(cur)) then
    redis.call('HSET', k, ARGV[1], ARGV[2])
  end
  trim(k, 1)
  extend(k, at)
end
local out = {dup}
if read then read_window(k, 1, out, false) end
return out
";

/// COUNT_DISTINCT: a sorted set of member (ARGV[2]) → last sub-window seen, capped at
/// ARGV[9]. Returns {dup, count, capped}.
const METRIC_DISTINCT: &str = r"
local k = KEYS[1]
local cap = tonumber(ARGV[9])
if update then
  redis.call('ZADD', k, 'GT', ARGV[1], ARGV[2])
  redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. floor)
  local card = redis.call('ZCARD', k)
  if card > cap then redis.call('ZPOPMIN', k, card - cap) end
  extend(k, at)
end
if not read then return {dup} end
local capped = 0
if redis.call('ZCARD', k) >= cap then capped = 1 end
return {dup, redis.call('ZCOUNT', k, lo, hi), capped}
";

/// APPROX_COUNT_DISTINCT: one HyperLogLog per sub-window. KEYS[1] the updated sub-window's,
/// KEYS[2] the applied events, then those of every sub-window read, counted with one
/// multi-key PFCOUNT (no temporary key). Returns {dup, count}.
const METRIC_APPROX: &str = r"
if update then
  redis.call('PFADD', KEYS[1], ARGV[2])
  extend(KEYS[1], at)
end
if not read or #KEYS < 3 then return {dup, 0} end
return {dup, redis.call('PFCOUNT', unpack(KEYS, 3))}
";

/// Stores a definition. KEYS[1] the definitions hash; ARGV: id, fingerprint, body, channel,
/// message. Values are `<version>\n<fingerprint>\n<body>`. Returns the version.
pub(super) const PUT_DEFINITION: &str = r"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ver, fp = 0, ''
if cur then
  local a = string.find(cur, '\n', 1, true)
  local b = string.find(cur, '\n', a + 1, true)
  ver = tonumber(string.sub(cur, 1, a - 1))
  fp = string.sub(cur, a + 1, b - 1)
end
if fp == '' or fp ~= ARGV[2] then ver = ver + 1 end
redis.call('HSET', KEYS[1], ARGV[1], ver .. '\n' .. ARGV[2] .. '\n' .. ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return ver
";

/// Deletes a definition, keeping its version as a tombstone. Returns 1 if it existed.
pub(super) const DELETE_DEFINITION: &str = r"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
local a = string.find(cur, '\n', 1, true)
local b = string.find(cur, '\n', a + 1, true)
if b == a + 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], string.sub(cur, 1, a - 1) .. '\n\n')
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
";

/// Changes the lists' counts (`layout`, *The lists' counts*). KEYS: the counts, the last
/// changes, the index by list, the index by sandbox (one hash tag). ARGV: (list, sandbox,
/// delta, Unix ms) per pair. A pair at 0 or below leaves all four keys; otherwise its time
/// goes up to the given one and it is in both indexes. Returns how many pairs are left
/// with a positive count among those given.
pub(super) const COUNT_CHANGES: &str = r"
local left = 0
for i = 1, #ARGV, 4 do
  local list, sandbox = ARGV[i], ARGV[i + 1]
  local m = list .. '\0' .. sandbox
  if redis.call('HINCRBY', KEYS[1], m, ARGV[i + 2]) <= 0 then
    redis.call('HDEL', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
    redis.call('ZREM', KEYS[3], m)
    redis.call('ZREM', KEYS[4], sandbox .. '\0' .. list)
  else
    left = left + 1
    local cur = tonumber(redis.call('HGET', KEYS[2], m))
    if not cur or cur < tonumber(ARGV[i + 3]) then
      redis.call('HSET', KEYS[2], m, ARGV[i + 3])
    end
    redis.call('ZADD', KEYS[3], 0, m)
    redis.call('ZADD', KEYS[4], 0, sandbox .. '\0' .. list)
  end
end
return left
";

/// One page of the lists' counts (`Layout::count_range`). KEYS: the counts, the last
/// changes, the index to range over. ARGV: min, max, how many, '1' when the index is the one
/// by sandbox (members `<sandbox> 00 <list>`). Returns (member by list, count, time) per
/// pair, flat, in the index's order; read only, O(log n + how many).
pub(super) const COUNTS_PAGE: &str = r"#!lua flags=no-writes
local members = redis.call('ZRANGE', KEYS[3], ARGV[1], ARGV[2], 'BYLEX', 'LIMIT', 0, ARGV[3])
if #members == 0 then return {} end
local fields = members
if ARGV[4] == '1' then
  fields = {}
  for i, m in ipairs(members) do
    local z = string.find(m, '\0', 1, true)
    fields[i] = string.sub(m, z + 1) .. '\0' .. string.sub(m, 1, z - 1)
  end
end
local counts = redis.call('HMGET', KEYS[1], unpack(fields))
local times = redis.call('HMGET', KEYS[2], unpack(fields))
local out = {}
for i, f in ipairs(fields) do
  out[#out + 1] = f
  out[#out + 1] = counts[i]
  out[#out + 1] = times[i]
end
return out
";

/// Takes pairs out of one part of the counts as older builds kept them
/// (`Layout::old_counts_key`). KEYS[1] the part; ARGV the pairs' fields (`<list>|<sandbox>`).
/// Reads and deletes each pair's count `f` and time `f|t`; returns (count, time) per pair,
/// flat (nil where a field was absent: another opener took it first).
pub(super) const TAKE_OLD_COUNTS: &str = r"
local out = {}
for i = 1, #ARGV do
  local f = ARGV[i]
  out[#out + 1] = redis.call('HGET', KEYS[1], f)
  out[#out + 1] = redis.call('HGET', KEYS[1], f .. '|t')
  redis.call('HDEL', KEYS[1], f, f .. '|t')
end
return out
";

/// The start of every audit script (see `layout`, *Audit trail*). `members` appends to `out`
/// (after its first `n`, with a score 0 before each when `scored`) the index members of the
/// record at stream id `id` whose fields are `t[a..b]`: `<tag><escaped field>\0<id as 19 hex
/// digits>` for the first `vfp` (if 16 lower-case hex digits), `who` and `list` it has; `esc`
/// writes `\0` as `\1\1` and `\1` as `\1\2`. Members go to Redis `FLUSH_AT` arguments at a
/// time (`flush`: one `ZADD` or `ZREM` for many records, within what `unpack` may spread).
/// `catch_up` indexes the records after the mark KEYS[3] (every record without one), at most
/// `limit`, moves the mark to the last and says whether none is left.
const AUDIT_PREAMBLE: &str = r"
local FLUSH_AT = 3000
local function esc(s)
  if not string.find(s, '[%z\1]') then return s end
  return (string.gsub(s, '[%z\1]', function(c)
    if c == '\0' then return '\1\1' end
    return '\1\2'
  end))
end
local function members(out, n, id, t, a, b, scored)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  local fid = string.format('\0%011x%08x', ms, seq)
  local v, w, l = true, true, true
  for j = a, b - 1, 2 do
    local name, value, m = t[j], t[j + 1], nil
    if name == 'who' then
      if w then w = false; m = 'w:' .. esc(value) .. fid end
    elseif name == 'list' then
      if l then l = false; m = 'l:' .. esc(value) .. fid end
    elseif name == 'vfp' and v then
      v = false
      if #value == 16 and not string.find(value, '[^0-9a-f]') then m = 'v:' .. value .. fid end
    end
    if m then
      if scored then n = n + 1; out[n] = 0 end
      n = n + 1
      out[n] = m
    end
  end
  return n
end
local function flush(cmd, key, args, n)
  if n > 0 then redis.call(cmd, key, unpack(args, 1, n)) end
  return 0
end
local function catch_up(stream, ix, mark, limit)
  local h = redis.call('GET', mark)
  local from = '-'
  if h then from = '(' .. h end
  local recs = redis.call('XRANGE', stream, from, '+', 'COUNT', limit)
  local args, n = {}, 0
  for _, r in ipairs(recs) do
    n = members(args, n, r[1], r[2], 1, #r[2], true)
    if n >= FLUSH_AT then n = flush('ZADD', ix, args, n) end
  end
  flush('ZADD', ix, args, n)
  if #recs > 0 then redis.call('SET', mark, recs[#recs][1]) end
  return #recs < limit, #recs
end
";

/// Appends a write's records to one audit part and indexes them; then, past the cap, removes
/// the oldest records and their index members. KEYS: the part, its index, its mark. ARGV: 1
/// the cap, 2 how many records an older build left unindexed to catch up on first, then each
/// record as its field count and its fields. The part is trimmed, once it holds more than the
/// cap, to the cap less a sixteenth (at most 1,000 records a call), so trimming is paid once
/// every `cap / 16` records and the part never holds more than the cap for long: the members
/// removed are computed from the removed records themselves, so the index holds exactly the
/// records the part holds. Returns the part's length before trimming.
const AUDIT_APPEND: &str = r"
local stream, ix, mark = KEYS[1], KEYS[2], KEYS[3]
local cap = tonumber(ARGV[1])
local caught = catch_up(stream, ix, mark, tonumber(ARGV[2]))
local args, n, i, last = {}, 0, 3, nil
while i <= #ARGV do
  local k = tonumber(ARGV[i])
  last = redis.call('XADD', stream, '*', unpack(ARGV, i + 1, i + k))
  n = members(args, n, last, ARGV, i + 1, i + k, true)
  if n >= FLUSH_AT then n = flush('ZADD', ix, args, n) end
  i = i + k + 1
end
flush('ZADD', ix, args, n)
if caught and last then redis.call('SET', mark, last) end
local len = redis.call('XLEN', stream)
if len > cap then
  local drop = math.min(len - cap + math.floor(cap / 16), 1000)
  local old = redis.call('XRANGE', stream, '-', '+', 'COUNT', drop + 1)
  n = 0
  for k = 1, drop do
    n = members(args, n, old[k][1], old[k][2], 1, #old[k][2], false)
    if n >= FLUSH_AT then n = flush('ZREM', ix, args, n) end
  end
  flush('ZREM', ix, args, n)
  redis.call('XTRIM', stream, 'MINID', old[drop + 1][1])
end
return len
";

/// Indexes an audit stream's records written without an index (an older build's, or before
/// the index existed), at most ARGV[1] a call. KEYS as `AUDIT_APPEND`. With ARGV[2] = '1',
/// first drops an index that holds more than 3 members a record (members of records another
/// build trimmed away) with its mark, so it is built again. Returns {done, indexed, dropped}.
const AUDIT_CATCH_UP: &str = r"
local dropped = 0
if ARGV[2] == '1' and redis.call('ZCARD', KEYS[2]) > 3 * redis.call('XLEN', KEYS[1]) then
  redis.call('DEL', KEYS[2], KEYS[3])
  dropped = 1
end
local done, n = catch_up(KEYS[1], KEYS[2], KEYS[3], tonumber(ARGV[1]))
if done then return {1, n, dropped} end
return {0, n, dropped}
";

/// The text of the audit append (see `AUDIT_APPEND`), preamble included: sent whole (`EVAL`).
pub static AUDIT_APPEND_LUA: LazyLock<String> =
    LazyLock::new(|| format!("{AUDIT_PREAMBLE}{AUDIT_APPEND}"));

/// The text of the audit catch-up (see `AUDIT_CATCH_UP`), preamble included.
pub static AUDIT_CATCH_UP_LUA: LazyLock<String> =
    LazyLock::new(|| format!("{AUDIT_PREAMBLE}{AUDIT_CATCH_UP}"));

/// The metric scripts, one per family (MIN and MAX share one).
pub(super) struct MetricScripts {
    pub sum: Script,
    pub avg: Script,
    pub extreme: Script,
    pub distinct: Script,
    pub approx: Script,
}

impl MetricScripts {
    pub fn new() -> Self {
        let with_extend = |body: &str| Script::new(&format!("{METRIC_PREAMBLE}{body}"));
        Self {
            sum: with_extend(METRIC_SUM),
            avg: with_extend(METRIC_AVG),
            extreme: with_extend(METRIC_EXTREME),
            distinct: with_extend(METRIC_DISTINCT),
            approx: with_extend(METRIC_APPROX),
        }
    }

    pub fn all(&self) -> [&Script; 5] {
        [
            &self.sum,
            &self.avg,
            &self.extreme,
            &self.distinct,
            &self.approx,
        ]
    }
}

/// Compare-and-delete over one bucket. KEYS[1] = the bucket; ARGV = field1, expected1,
/// field2, expected2, ...: deletes each field only if it still holds its expected value (an
/// entry refreshed since it was read survives). Returns {deleted, refreshed}: refreshed =
/// present with another value (left alone); the rest were already gone. Lazy expiry (one
/// field) and the sweep (many) both call it.
pub const COMPARE_AND_DELETE: &str = r"
local deleted, refreshed = 0, 0
for i = 1, #ARGV, 2 do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v == ARGV[i + 1] then
    deleted = deleted + redis.call('HDEL', KEYS[1], ARGV[i])
  elseif v then
    refreshed = refreshed + 1
  end
end
return {deleted, refreshed}
";

/// Counts a bucket's expired fields, fields that never expire and values that are not
/// integers. ARGV[1] = now (`ExpiryCode::script_now`). Read-only; O(fields).
const COUNT_EXPIRED: &str = r"
local now = tonumber(ARGV[1])
local expired, never, unreadable = 0, 0, 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  local c = tonumber(v)
  if c == nil then
    unreadable = unreadable + 1
  elseif c == 0 then
    never = never + 1
  elseif not live_code(c, now) then
    expired = expired + 1
  end
end
return {expired, never, unreadable}
";

/// Deletes fields of one bucket (see `REMOVE`).
pub fn remove() -> Script {
    Script::new(&format!("{ENTRY_PREAMBLE}{REMOVE}"))
}

/// The compare-and-delete script (see `COMPARE_AND_DELETE`).
pub static COMPARE_AND_DELETE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(COMPARE_AND_DELETE));

/// The text of the audit's read-only expiry count (see `COUNT_EXPIRED`), preamble included:
/// what `SCRIPT LOAD` sends to every primary.
pub static COUNT_EXPIRED_LUA: LazyLock<String> =
    LazyLock::new(|| format!("{ENTRY_PREAMBLE}{COUNT_EXPIRED}"));

/// The audit's read-only expiry count.
pub static COUNT_EXPIRED_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&COUNT_EXPIRED_LUA));

/// Whether a call failed because the server does not have the script (a restart, a
/// failover, `SCRIPT FLUSH`): load it and call again.
pub fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
