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
/// ('' in format 1), ARGV[5] a new random keyspace id and ARGV[7] the number of event-id
/// buckets, in velocity layout ARGV[9] (`VELOCITY_LAYOUT`); but not where the lost marker stands (a running instance
/// saw this keyspace vanish) unless ARGV[6] is '1' (the explicit `namelist-tools keyspace
/// create`), which also removes the marker. A keyspace found without an id (made before ids)
/// is given ARGV[5]; one found without a velocity layout (made before layout 2) is given
/// layout 1, one without event-id buckets ARGV[7], and one without normalisation rules rules 1
/// (a new one records ARGV[8], `domain::LATEST_RULES`). Returns (format, buckets, created, key
/// id, keyspace id, velocity layout, event-id buckets, rules), created being 1 (created now), 0
/// (found), -1 (missing, and nothing to create it with) or -2 (missing where the lost marker
/// stands; the keyspace id is the lost one's).
pub(super) const OPEN_KEYSPACE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  if ARGV[1] == '' then return {false, false, -1, false, false, false, false, false} end
  if ARGV[6] ~= '1' and redis.call('EXISTS', KEYS[2]) == 1 then
    return {false, false, -2, false, redis.call('GET', KEYS[2]), false, false, false}
  end
  redis.call('HSET', KEYS[1], 'format', ARGV[1], 'buckets', ARGV[2], 'created_ms', ARGV[3],
    'keyspace_id', ARGV[5], 'velocity', ARGV[9], 'event_buckets', ARGV[7], 'rules', ARGV[8])
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'key_id', ARGV[4]) end
  redis.call('DEL', KEYS[2])
  return {ARGV[1], ARGV[2], 1, ARGV[4], ARGV[5], ARGV[9], ARGV[7], ARGV[8]}
end
redis.call('HSETNX', KEYS[1], 'keyspace_id', ARGV[5])
redis.call('HSETNX', KEYS[1], 'velocity', '1')
redis.call('HSETNX', KEYS[1], 'event_buckets', ARGV[7])
redis.call('HSETNX', KEYS[1], 'rules', '1')
local m = redis.call('HMGET', KEYS[1], 'format', 'buckets', 'key_id', 'keyspace_id', 'velocity',
  'event_buckets', 'rules')
return {m[1], m[2], 0, m[3], m[4], m[5], m[6], m[7]}
";

/// Takes back a meta hash an open just made (`shards::refuse_other_keyspace`): KEYS[1],
/// while it still holds this open's id (ARGV[1]) and no instance recorded its markers
/// (ARGV[3]); and leaves the lost marker (KEYS[2]) holding the other keyspace's id (ARGV[2]).
/// Returns 1 if it did.
pub(super) const RETIRE_NEW_META: &str = r"
if redis.call('HGET', KEYS[1], 'keyspace_id') ~= ARGV[1] then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[3]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
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

/// The metric script: every update and read that events make on the keys of one hash slot
/// (on one node, where a script may touch keys of any slot, several events: as many as fit
/// `METRIC_OPS_PER_CALL`; on a cluster one event's, per slot), or a chunk of id-less updates
/// or of reads, in one call. Written as a
/// body shared by the writing script (`METRIC_WRITE`) and the read-only one (`METRIC_READ`,
/// `no-writes`: it may run on a replica), after `ENTRY_PREAMBLE` (`live_code`).
///
/// The call is a sequence of groups, each an event's ops (or a chunk of id-less ones). KEYS,
/// per group: the event's deduplication bucket (any key of the slot when there is no event),
/// then the ops' keys in order: one each, and for an APPROX_COUNT_DISTINCT read its window's
/// `slots` sub-window keys after it; after the last group, the guard's key (below). ARGV[1]
/// is a sequence of MessagePack values, not an
/// array (unpacked in C by `cmsgpack`: ~60 separate arguments cost Redis more than the
/// updates themselves, and each value costs, so an op carries only what it uses; in the
/// script value i is `A[i + 1]`, `A[1]` being the unpacker's offset): now
/// (`ExpiryCode::script_now`), a random number 0–7 (`seed`), then per group: the event's
/// field (its 64-bit keyed hash as a decimal string; '' without an event), the expiry code
/// until which the event is remembered (a string), the fill from which the bucket drops its
/// expired ids (`velocity::purge_from`) when this new id is one to look at the bucket's
/// length (one in `velocity::PURGE_EVERY`, chosen by the caller from the hash), else 0, the
/// group's number of ops, then per op (`velocity::pack_op`):
/// - its head: the family (1 COUNT/SUM, 2 AVG, 3 MIN, 4 MAX, 5 COUNT_DISTINCT,
///   6 APPROX_COUNT_DISTINCT) + 8 if it updates + 16 if it reads back;
/// - COUNT_DISTINCT: the member cap;
/// - an update: its sub-window as a string (AVG: the sum's field `2i`, then the count's
///   `2i+1`), the value (a string), expire_at (a string), then but for
///   APPROX_COUNT_DISTINCT the window's slots and trim_hi;
/// - a read: read_hi, slots.
///
/// Whatever goes to a Redis command is a string: a Lua number would be formatted by `%.17g`
/// on every call (and a 64-bit hash does not fit a double); numbers are only what the script
/// computes with.
///
/// Deduplication: an event already remembered live in its bucket is not applied again
/// (`dup` = 1), checked and recorded in the same atomic call as its updates, so a retry
/// after any failure or timeout applies each update exactly once. A remembered event whose
/// code has passed counts as absent and is overwritten (the lazy rule); one new id in
/// `velocity::PURGE_EVERY` (by its hash) reads the bucket's length, and a bucket past `velocity::purge_from`
/// fields then drops its expired ones (bounded work, amortised to a fraction of a field read
/// per event); the sweep reclaims the rest. The common path is one `HSETNX`.
///
/// Expiry and trimming cost one command on the common path, and only when an update opened
/// a new sub-window (a new field, member or HyperLogLog): a plain `PEXPIREAT` to
/// `expire_at`, which the caller makes `(max(i, trim_hi) + F + W/r)·r` (`F` sub-windows
/// covering events up to `MAX_FUTURE_MARGIN_MS` ahead, `MetricOp::key_expire_at`): never
/// before the newest data any caller may have written leaves the window, whatever order the
/// calls come in, with no read of the current expiry. One hash update in eight also reads
/// the hash's length, and a hash holding more fields than the window needs is trimmed by its
/// field names (a few more than `2 · slots` small integers). A COUNT_DISTINCT set drops the
/// members that left the window when it reaches its cap, before evicting any of the
/// window's.
///
/// Guard: with an ARGV[2] (updates), the last key is the meta hash on one node, the slot's
/// shard marker on a cluster (`shards`), and ARGV[2] the keyspace id as opened; a hash
/// without it (Redis or the shard restarted empty, flushed, failed over to an empty node)
/// fails the call with `NAMELIST_LOST` before anything is written or recorded, so an event
/// refused then is neither counted nor remembered, and its retry once the keyspace is
/// restored counts.
///
/// Several events in one call cost Redis one call's dispatch, argument and guard, not one
/// each; each is deduplicated on its own (a replay of an id earlier in the same call is a
/// replay), so a call of many events applies each exactly once as a call of one would.
///
/// Returns, per group, {dup, bucket length (0 without an event), then per op: n, n values}: COUNT/SUM,
/// MIN/MAX the values of the read window's sub-windows; AVG (field, value) pairs; the
/// distinct families {count, capped}. n is 0 for an op that reads nothing.
const METRIC_BODY: &str = r"
-- Globals are looked up through a metatable in Redis 7's scripts: locals halve the work.
local call, tonumber, floor, KEYS = redis.call, tonumber, math.floor, KEYS
if ARGV[2] and call('HGET', KEYS[#KEYS], 'keyspace_id') ~= ARGV[2] then
  return redis.error_reply('NAMELIST_LOST the keyspace id is not in its meta hash')
end
-- The values come as a sequence, not an array: unpacked onto the stack and into a table
-- made at its size once (an array is built one `lua_settable` at a time, rehashing as it
-- grows: a third of the unpacking). At most 1,000 at a time (the stack holds ~8,000): an
-- event with more (over ~150 metrics) comes in parts. A[1] is where the next part starts
-- (-1: none), so the values start at A[2].
local A = {cmsgpack.unpack_limit(ARGV[1], 1000, 0)}
while A[1] >= 0 do
  local more = {cmsgpack.unpack_limit(ARGV[1], 1000, A[1])}
  A[1] = more[1]
  for i = 2, #more do A[#A + 1] = more[i] end
end
local now, seed = A[2], A[3]
-- One hash update in eight (every eighth op of the call from a random start, `seed`)
-- also reads the hash's length; one holding more fields than its window needs is trimmed
-- by its field names. So a hash holds a few sub-windows more than it needs at most, and
-- the common path reads nothing.
local function trim(k, width, n, trim_hi)
  if call('HLEN', k) > width * n then
    local lo = trim_hi - n + 1
    for _, f in ipairs(call('HKEYS', k)) do
      if floor(tonumber(f) / width) < lo then call('HDEL', k, f) end
    end
  end
end
local function read_window(k, width, lo, hi, out, fields)
  local all, n, at = call('HGETALL', k), 0, #out + 1
  out[at] = 0
  for i = 1, #all, 2 do
    local s = floor(tonumber(all[i]) / width)
    if s >= lo and s <= hi then
      if fields then out[#out + 1] = all[i]; n = n + 1 end
      out[#out + 1] = all[i + 1]
      n = n + 1
    end
  end
  out[at] = n
end
-- An event's id: whether it is remembered live in its bucket (a replay: dup = 1), else
-- remembered now; and, for the ids the caller chose, the bucket's length, past which its
-- expired ids go.
local function remember(bucket, event, until_code, purge)
  if call('HSETNX', bucket, event, until_code) == 0 then
    if live_code(tonumber(call('HGET', bucket, event)), now) then return 1, 0 end
    call('HSET', bucket, event, until_code)
  elseif purge > 0 then
    local fill = call('HLEN', bucket)
    if fill >= purge then
      local all, gone = call('HGETALL', bucket), {}
      for i = 1, #all, 2 do
        if not live_code(tonumber(all[i + 1]), now) then gone[#gone + 1] = all[i] end
      end
      for i = 1, #gone, 1000 do
        call('HDEL', bucket, unpack(gone, i, math.min(i + 999, #gone)))
      end
      fill = fill - #gone
    end
    return 0, fill
  end
  return 0, 0
end
local out = {}
local a, ki, i = 4, 1, 0
-- Each group: an event's ops (or a chunk of id-less ones), after its head.
while a <= #A do
  local event, until_code, purge, n = A[a], A[a + 1], A[a + 2], A[a + 3]
  local dup, fill = 0, 0
  if event ~= '' then dup, fill = remember(KEYS[ki], event, until_code, purge) end
  out[#out + 1] = dup
  out[#out + 1] = fill
  a, ki = a + 4, ki + 1
  for _ = 1, n do
    local h = A[a]
    local fam, k, cap = h % 8, KEYS[ki], 0
    a, ki = a + 1, ki + 1
    if fam == 5 then cap, a = A[a], a + 1 end
    if h % 16 >= 8 then
      local sub, sub2 = A[a], ''
      if fam == 2 then sub2, a = A[a + 1], a + 1 end
      local v, at, slots, trim_hi = A[a + 1], A[a + 2], 0, 0
      a = a + 3
      if fam ~= 6 then slots, trim_hi, a = A[a], A[a + 1], a + 2 end
      -- A replay's values are read past, and nothing is applied.
      if dup == 0 then
        -- A new field is a new sub-window: the only update that may move the key's expiry.
        if fam == 1 then
          if call('HINCRBY', k, sub, v) == tonumber(v) then call('PEXPIREAT', k, at) end
        elseif fam == 2 then
          call('HINCRBY', k, sub, v)
          if call('HINCRBY', k, sub2, 1) == 1 then call('PEXPIREAT', k, at) end
        elseif fam == 3 or fam == 4 then
          local cur = call('HGET', k, sub)
          local x = tonumber(v)
          if not cur then
            call('HSET', k, sub, v)
            call('PEXPIREAT', k, at)
          elseif (fam == 3 and x < tonumber(cur)) or (fam == 4 and x > tonumber(cur)) then
            call('HSET', k, sub, v)
          end
        elseif fam == 5 then
          if call('ZADD', k, 'GT', 'CH', sub, v) == 1 then
            call('PEXPIREAT', k, at)
            local card = call('ZCARD', k)
            -- Members that left the window go when the set reaches its cap, before any
            -- member of the window would.
            if card >= cap then
              call('ZREMRANGEBYSCORE', k, '-inf', '(' .. (trim_hi - slots + 1))
              card = call('ZCARD', k)
              if card > cap then call('ZPOPMIN', k, card - cap) end
            end
          end
        elseif call('PFADD', k, v) == 1 then
          -- One HyperLogLog per sub-window: its expiry is that sub-window's.
          call('PEXPIREAT', k, at)
        end
        if (seed + i) % 8 == 0 and fam < 5 then
          local width = 1
          if fam == 2 then width = 2 end
          trim(k, width, slots, trim_hi)
        end
      end
    end
    if h < 16 then
      out[#out + 1] = 0
    else
      local hi, slots = A[a], A[a + 1]
      local lo = hi - slots + 1
      a = a + 2
      if fam == 1 or fam == 3 or fam == 4 then
        read_window(k, 1, lo, hi, out, false)
      elseif fam == 2 then
        read_window(k, 2, lo, hi, out, true)
      elseif fam == 5 then
        local capped = 0
        if call('ZCARD', k) >= cap then capped = 1 end
        out[#out + 1] = 2
        out[#out + 1] = call('ZCOUNT', k, lo, hi)
        out[#out + 1] = capped
      else
        -- The window's sub-window keys follow the op's own.
        out[#out + 1] = 1
        if slots > 0 then
          out[#out + 1] = call('PFCOUNT', unpack(KEYS, ki, ki + slots - 1))
        else
          out[#out + 1] = 0
        end
        ki = ki + slots
      end
    end
    i = i + 1
  end
end
return out
";

/// The start of the definition scripts: KEYS[2] is the meta hash on one node, the shard
/// marker of the definitions' slot on a cluster, and the last ARGV the keyspace id as opened;
/// without it there (the keyspace or that shard restarted empty, flushed) the call fails
/// with `NAMELIST_LOST` before anything is written or published, as `METRIC_BODY`'s guard.
pub(super) const DEFINITION_GUARD: &str = r"
if redis.call('HGET', KEYS[2], 'keyspace_id') ~= ARGV[#ARGV] then
  return redis.error_reply('NAMELIST_LOST the keyspace id is not where the definitions are')
end
";

/// Stores a definition (after `DEFINITION_GUARD`). KEYS[1] the definitions hash; ARGV: id,
/// fingerprint, body, channel, message. Values are `<version>\n<fingerprint>\n<body>`.
/// Returns the version.
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

/// Deletes a definition (after `DEFINITION_GUARD`), keeping its version as a tombstone.
/// KEYS[1] the definitions hash; ARGV: id, channel, message. Returns 1 if it existed.
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

/// The metric scripts (see `METRIC_BODY`): the one that writes, and the read-only one.
pub(super) struct MetricScripts {
    pub write: Script,
    pub read: Script,
}

impl MetricScripts {
    pub fn new() -> Self {
        Self {
            write: Script::new(&format!("{ENTRY_PREAMBLE}{METRIC_BODY}")),
            read: Script::new(&format!(
                "#!lua flags=no-writes\n{ENTRY_PREAMBLE}{METRIC_BODY}"
            )),
        }
    }

    pub fn all(&self) -> [&Script; 2] {
        [&self.write, &self.read]
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

/// Whether `e` is a script's guard finding the keyspace lost (`METRIC_BODY`,
/// `DEFINITION_GUARD`).
pub fn is_lost(e: &RedisError) -> bool {
    e.code() == Some("NAMELIST_LOST")
}
