//! Storage layout, formats 1 and 2: exactly what goes into Redis, and why. Both stores, the
//! service and the operator tools derive every key, field and message from this module.
//!
//! The two formats differ only in how values are hashed (`fingerprint`): format 2, what every
//! new keyspace gets, uses pseudo-random functions under the secret fingerprint key; format 1,
//! still read, used unkeyed xxh3 and crc32. Below, `PRF` is the format's function:
//!
//! | use | format 2 (keyed) | format 1 (unkeyed) |
//! |---|---|---|
//! | field | low 64 bits of SipHash-2-4-128(k_entry, canonical) | xxh3_64(canonical) |
//! | bucket | high 64 bits of the same, mod N | crc32(canonical) mod N |
//! | velocity entity, metric | 72 and 48 bits (layout 1: 96) of SipHash-2-4-128(k_metric, …) | the same bits of xxh3_128(…) |
//! | distinct member | SipHash-2-4(k_member, value) | xxh3_64(value) |
//! | event hash | SipHash-2-4(k_event, type, id) | xxh3_64(type, id) |
//!
//! # Entries
//! An entry (list, dimension, value, sandbox) is reduced to its *canonical bytes*
//!
//! ```text
//! <list> "\n" <dimension> "\n" <sandbox> "\n" <normalised value>
//! ```
//!
//! The first three have alphabets without `\n` and the value comes last, so the join is
//! unambiguous whatever bytes the value holds.
//!
//! | what   | Redis                                  | why |
//! |--------|----------------------------------------|-----|
//! | key    | `<prefix>b:<bucket PRF(canonical) % N>` | ~200 entries per hash so Redis keeps it a listpack |
//! | field  | 64 bits of `PRF(canonical)` as a **signed** decimal i64 | an integer listpack element: 10 B, where the unsigned text would be a 22 B string |
//! | value  | expiry in whole seconds since 2020-01-01T00:00:00Z, rounded up; `0` = never | a 32-bit integer element: 6 B until 2088 (ms would be 10 B) |
//!
//! The bucket number is keyed too in format 2: `crc32(phone) % N` is ~log2(N) bits of an
//! unkeyed hash of the phone, enough with the audit trail's mask to single it out.
//!
//! So an entry costs 16 B of listpack, plus the bucket's share of allocator rounding and of
//! the key itself. With a mean of 200 entries a bucket is ~3.2 KB; jemalloc rounds it to the
//! next size class (3 KiB, 3.5 KiB or 4 KiB), which adds ~1.3 B per entry, and the key, its
//! object and dict entry add ~0.3 B per entry: ~17.6 B per entry (docs/performance.md, *Memory per entry*).
//!
//! Why 200 and not more: a lookup of a field is a linear scan of its bucket's listpack
//! (`lpFind`), and a check's misses scan the whole bucket. With 400 per bucket Redis spent 89 %
//! of its CPU in that scan and a check's p99 at 5,000 misses/s on 2 cores was 2–11 ms; with
//! 200 it is 1.7–2.6 ms (run-to-run noise: 3 processes on 2 cores), for +0.1 B per entry
//! (docs/performance.md, *Load*). Fewer per bucket costs more memory: 100 gives ~17.9 B (more key
//! overhead, finer but proportionally larger rounding).
//! Two different entries share a slot only if both their bucket and 64-bit field collide:
//! about n²/2⁶⁵ over n entries in one bucket, i.e. never in practice.
//!
//! # The bucket count N and the key
//! `N = ceil(expected_entries / 200)`, fixed when the keyspace is created and recorded in
//! `<prefix>meta` (a hash: `format`, `buckets`, `created_ms`, and in format 2 `key_id`, the
//! fingerprint key's public id). With a mean of 200 fields, a
//! bucket reaching Redis's default `hash-max-listpack-entries` of 512 is a 22σ event: it
//! takes 2.5 times the expected entries before the mean reaches the limit. A
//! service whose configured N disagrees with the recorded one refuses to start: the same
//! entry would hash to a different bucket and silently vanish. So does one whose key has
//! another id than the recorded one, or none (see `fingerprint` for every start-up outcome).
//!
//! # The keyspace id: a lost keyspace is noticed
//! `<prefix>meta` also holds `keyspace_id`, 32 random hex digits made when the keyspace is
//! created (and given once to a keyspace made before ids). Redis restarted without its data,
//! a `FLUSHALL` or a failover to an empty node all look alike from a client: an empty
//! keyspace, no error. The id tells "lost" from "new": every read pipeline of a check or of
//! the local tier carries `HGET <prefix>meta keyspace_id`, so no answer is ever built from a
//! keyspace that is not the one opened; a write on one node reads it inside its `MULTI` (and
//! publishes only if it matches, `GUARDED_PUBLISH`); every instance checks it every second.
//! An instance that finds it missing or changed leaves the marker `<prefix>{<prefix>meta}lost`
//! (the lost id, in the meta hash's slot); while it stands, no instance or tool creates a
//! keyspace at the prefix but `namelist-tools keyspace create`, which removes it.
//!
//! # Matching entries: IP ranges, phone segments, e-mail domains
//! An entry that lists a set of values is still one entry, a field like any other: its
//! canonical value is the set's normalised text, which no exact value can have:
//!
//! | entry | canonical value (last line of the canonical bytes) | lists |
//! |---|---|---|
//! | IP range | the masked network, `10.1.2.0/24` (a single address has no `/len`) | every address in it |
//! | phone segment | the normalised prefix and a `*`, `+86170*` (a phone has no `*`) | every phone starting with `+86170` |
//! | e-mail domain | `@` and the ASCII domain, `@example.com` (an address has a local part) | every address at it or below it |
//!
//! So the bucket, field and value of such an entry are exactly those of any entry: a keyed
//! 64-bit field and a 32-bit expiry code, 16 B of listpack. What makes them findable is a
//! registry per (list, sandbox) of the lengths in use, the set `<prefix>p:<list>:<sandbox>`,
//! one member per length ([`PrefixLen::member`]), written in the same transaction as the
//! entry (`SADD`) and only ever added to:
//!
//! | member | meaning | a check of … probes |
//! |---|---|---|
//! | `4/24`, `6/48` | an IPv4 (IPv6) range of that prefix length | an address: its network of that length |
//! | `phone/6` | a phone segment of 6 characters, the `+` counted (`+86170*`; 1–20) | a phone: its first 6 characters and `*`, if it is that long |
//! | `email/3` | an e-mail domain entry of 3 labels (`@a.example.com`; 2–10) | an address: its domain's last 3 labels, if it has that many |
//!
//! A check of a value thus costs the exact probe plus one probe per length in use of its
//! kind in each list checked (at most 20 for phones, 9 for addresses): never a scan, and the
//! same whatever the number of entries. A length with no entries left costs one extra probe.
//! Members are ASCII strings of a handful of characters in a small set, and say only which
//! lengths are in use, never a value. An older build skips members it does not know
//! (`parse_member`), so during a rolling deploy it simply does not probe segments or domains.
//!
//! # Velocity metrics
//! One entity of one metric version is one key. In velocity layout 2, what every new
//! keyspace gets (its meta hash records `velocity`), the key is
//!
//! ```text
//! <prefix>v{<entity>}<metric>
//! ```
//!
//! where `entity` is 72 bits of the format's entity hash of the group-by values and `metric`
//! 48 bits of the same hash of (metric id, version), both in URL-safe base64 (12 and 8
//! characters): short whatever the values (seed 002: hash non-ASCII values, keep keys short),
//! keyed (a group-by value is often a phone or a device), and with the *entity* as the hash
//! tag, so every metric of one entity (`COUNT(1h) BY device_id` and
//! `COUNT_DISTINCT(30d, userid) BY device_id`) lives in one cluster slot and one script call
//! updates them all. A keyspace made before layout 2 (its meta hash has no `velocity` field;
//! it is given `velocity = 1` when first opened) keeps layout 1, `<prefix>v{<h>}` with `h` 96
//! bits of the hash of (metric id, version, values): its counts stay where they are, each
//! metric in a slot of its own. A new version is a new key: old counts are never read again
//! and expire on their own.
//!
//! | aggregation | Redis | fields |
//! |---|---|---|
//! | COUNT, SUM | hash | sub-window index → count or sum (amounts × 10,000) |
//! | AVG | hash | `2i` → sum, `2i+1` → count |
//! | MIN, MAX | hash | sub-window index → min or max |
//! | COUNT_DISTINCT | sorted set | member: the format's distinct-member hash of the value → score = last sub-window seen; capped |
//! | APPROX_COUNT_DISTINCT | one HyperLogLog per sub-window, `<key>:<i>` (elements: the same member hash) | counted with one multi-key `PFCOUNT` |
//!
//! Integer fields and values keep the hashes as compact listpacks; the sub-window that left
//! the window is deleted when an update opens a new one, and every key expires when its
//! newest data can no longer be read (`PEXPIREAT (i + W/r)·r`): `scripts::METRIC_BODY`.
//!
//! # Event ids
//! An event with an id is applied once: its 64-bit keyed event hash (of type and id) is
//! remembered in a bucket of event ids, a hash of *field* = the hash as a signed decimal i64,
//! *value* = the expiry code (as an entry's: whole seconds since 2020) until which it is
//! remembered, `min(now + dedupe_window, ts + the longest window (plus one sub-window) of
//! the metrics it updates)`: after that a replay is late for every metric anyway, or, past
//! `dedupe_window`, counted again. 16 B of listpack per id, like an entry; ~18 B with the
//! bucket's share of its key and rounding. Buckets are
//!
//! ```text
//! <prefix>e{<tag>}<b>
//! ```
//!
//! where `tag` is the smallest decimal number whose cluster slot is `s` (`event_tags`), so
//! that every slot has buckets of its own. The keyspace records `event_buckets` = `n`
//! (`ceil(dedupe_expected_ids / 200)`, fixed when first recorded): each slot has
//! `ceil(n / 16384)` buckets. The check and the record are in the same atomic script call as
//! the event's updates. On a single node that is one call per event: bucket `h mod n` (slot
//! `i mod min(n, 16384)`, `b = i / min(n, 16384)`), whatever keys the event updates. On a
//! cluster, one call per slot the event's keys live in, each remembering the event in a
//! bucket of that slot (`b = (h >> 14) mod ceil(n / 16384)`): an event updating metrics of
//! three entities is remembered three times. A remembered id whose code has passed counts as
//! absent (the lazy rule); a bucket past 256 fields drops its expired ones every 32 new ids;
//! `namelist-tools sweep` deletes the expired ids of the buckets nobody writes (one walk of
//! `<prefix>[be][:{]*`: list buckets and event-id buckets). Definitions live in the hashes
//! `<prefix>defs:metric` and `<prefix>defs:rule`: field = id, value =
//! `<version>\n<fingerprint>\n<JSON>` (a deleted one keeps `<version>\n\n` so a re-created
//! metric never reuses an old version's counts).
//!
//! # Audit trail and invalidation
//! Every upsert and delete appends one record per entry to the audit trail: when, who, op,
//! list, dimension, sandbox, expiry, reason, the fingerprint (the field, as 16 hex digits:
//! keyed in format 2), the `bucket` number (keyed in format 2 too; what makes the trail the
//! change log an instance catches up from, `changelog`), the value fingerprint `vfp` and the
//! masked value; never the raw value, nor anything else derived from it. `vfp` is the format's `audit-value` function
//! (`fingerprint`: SipHash-2-4 under its own subkey in format 2, xxh3-64 in format 1) of
//!
//! ```text
//! <dimension> "\n" <normalised value>
//! ```
//!
//! as 16 lower-case hex digits: without list and sandbox, so that one index term finds a
//! value's records in every list and sandbox (`fingerprint`, which has them, differs in each).
//! It also lets a reader of the trail see that two records of different lists or sandboxes
//! name one value, which the read role, reading the whole trail, could see by value search
//! anyway; without the key it names nothing.
//!
//! The trail is split in [`AUDIT_PARTS`] (64) capped streams `<prefix>audit:{<tag>}`, each
//! holding at most `ceil(audit_max_len / 64)` records, so no write depends on one shard: part
//! `i`'s hash tag is the smallest decimal number whose slot lies in the `i`-th 256 slots, so
//! the parts spread evenly over any even split of the 16,384 slots (every primary of a
//! 3-to-64-primary cluster holds some). A write puts each entry's record in a part on the
//! *same primary* as the entry's bucket (`parts on that primary[bucket % their count]`, from
//! the replica monitor's slot map), so it depends only on its own entries' shards (a primary
//! holding no part, or an unknown map, falls back to part `bucket % 64`). Records are written
//! after the entries and before the write is acknowledged: an acknowledged write always has
//! its records (a write answered 503 may have landed without them). Readers merge the parts
//! newest first by stream id (server time, then sequence), together with the single stream
//! `<prefix>audit` of keyspaces written before the split (read, never written). Read cost of
//! a page of the `n` newest records: 65 `XREVRANGE … COUNT n`, sent as one round trip per
//! primary (concurrent), returning at most 65·n records to merge. The alternative, a record
//! in the same slot and transaction as its entry, would be atomic but leave up to 16,384
//! streams to merge on read.
//!
//! ## The audit index
//! So that a search by value, `who` or `list` reads the records it returns and not the trail,
//! every stream has an index beside it, in its slot: the sorted set `<stream>:ix`
//! (`<prefix>audit:{<tag>}:ix`), every member of score 0, one per *term* of each record it
//! holds, and nothing else:
//!
//! ```text
//! member = <term> 0x00 <ms: 11 lower-case hex digits> <seq: 8 lower-case hex digits>
//! term   = "v:" <vfp> | "w:" <who> | "l:" <list>     (the record's first field of each name;
//!                                                    vfp only if 16 lower-case hex digits)
//!          with 0x00 written 0x01 0x01 and 0x01 written 0x01 0x02
//! e.g.     "w:risk-loader" 0x00 "18bcfe5684d" "00000003"   (stream id 1700000000077-3)
//! ```
//!
//! At most three members a record (a `vfp`, a `who`, a `list`; an import's record has a
//! `who` only). The escape keeps every term free of the `0x00` that ends it, so the members of
//! one term are exactly those starting with `<term> 0x00`, and no other term's lie between
//! them (`w:n` and `w:n\0…` stay apart); the fixed-width id makes their byte order the stream
//! order. A read of one stream through the index is `ZRANGE <ix> (<term> 0x00 <before>
//! [<term> 0x00 BYLEX REV LIMIT 0 <n>` (`(<term> 0x01` without a bound), then `XRANGE
//! <stream> <id> <id>` for each member, each step for every stream at once in one round trip
//! per primary: O(log m + n) for `n` records out of `m` members. A search thus costs its
//! records plus one probe of each of the 65 indexes. Not one script doing both, to save the
//! round trip: measured (`benches/audit_search.sh`), a record fetched inside a script cost
//! Redis ~30 µs (its reply made a Lua table, then a reply again), where the client's `XRANGE`
//! costs ~8.
//!
//! Writes keep the index exact with the stream. A write's records go to each part in one
//! `EVAL` of `scripts::AUDIT_APPEND` (inside the write's `MULTI` on one node; in the per-slot
//! step on a cluster, as the `XADD`s were): `XADD` each record, `ZADD` its members, and once
//! the part holds more than its cap, take the oldest records down to the cap less a sixteenth
//! (at most 1,000 a call), `ZREM` their members, computed from their own fields, and
//! `XTRIM MINID` the first record kept: trimming costs one call every `cap / 16` records, and
//! the index never holds a record the stream does not. `EVAL`, the script sent whole (~2 KB a
//! part written), not `EVALSHA`: inside a `MULTI` a `NOSCRIPT` (a failover to a replica that
//! never loaded it) fails that command only, after the entries before it were written.
//! `namelist-tools import`'s record goes the same way (`RedisStore::append_audit`).
//!
//! `<stream>:ixm` (a string) is the *mark*: the id of the newest record known indexed. An
//! older build writes records with a plain `XADD … MAXLEN ~` (a rolling deploy), which no
//! index holds; so every append first indexes up to 100 records after the mark, and moves it
//! to its last record when none was left. At open the store runs the same catch-up
//! (`scripts::AUDIT_CATCH_UP`) on every stream, 1,000 records a call, every stream at once
//! per round trip, until none is left: the first open after an upgrade indexes the records
//! written before the index existed (by `who` and `list`: they have no `vfp`, so a search by
//! value does not find them), every later one finds nothing to do in one round trip. Records
//! an older build trims away leave their members behind: reads skip a member whose record is
//! gone, and an open that finds an index of more than 3 members a record drops it and its
//! mark and builds it again (searches may miss a stream's older records for the few ms that
//! takes). The unsplit stream `<prefix>audit` is indexed once the same way into
//! `<prefix>audit:ix{<prefix>audit}` and `<prefix>audit:ixm{<prefix>audit}` (its key has no
//! tag, so the whole key is theirs: the same slot; a prefix holds no braces); it is never
//! written, so that index never changes again.
//!
//! Memory, measured (`tests/integration/audit_index.rs`, `measure_bytes_per_record`: 100,000 records of
//! a phone upsert with a reason under the default cap, 96,649 kept; `MEMORY USAGE … SAMPLES
//! 0`; Redis 7.0): the stream 164 B a record (140 without the `vfp`), the index 425 B a record
//! (3 members of 142 B: a part's set holds ~4,700 members, far past the 128 that Redis keeps
//! as a listpack, so each member is a skiplist node, a dict entry and its string), the marks
//! 6.6 KB in all: ~590 B a record, ~57 MB at the default cap (~14 MB before the index).
//! Time, measured by the same test (`INFO commandstats`, the 2-core machine under other
//! builds): an append costs ~30 µs of Redis time a record (the `XADD`, 3 skiplist inserts and
//! the Lua that builds the members; trims included; ~22 µs for records without a `vfp`), where
//! a plain `XADD … MAXLEN ~` cost ~3 µs. A write's `MULTI` grows by that much per entry: ~0.3 s
//! for the 10,000 entries a request may hold (bulk loads belong to `namelist-tools import`,
//! one record a run).
//! Considered and not taken: binary ids and `vfp`s would shorten members by 17 B but save only
//! ~7 % (jemalloc's size classes); a stream per (part, who or list) would cost a few bytes a
//! record, but would need a key per value for `vfp`, and more keys to trim; indexing after the
//! `EXEC` (the mark's catch-up makes it safe) would keep a write's `MULTI` as short as before,
//! at the price of a moment when a record is in its stream but not yet in its index.
//!
//! Every write publishes an [`Invalidation`] on the channel `<prefix>inv` so every instance
//! brings what it holds locally up to date. The message is a version byte (1), then the
//! postcard encoding of the message as builds before the local tier defined it (`Keys`,
//! `Scopes`, `Bulk`, `Definitions`), then, for a write of entries, a trailer:
//!
//! ```text
//! 01 <postcard Keys(fields changed)> [ <tag> <postcard Vec<Option<u32>>: each field's new code, None = removed> ]
//! ```
//!
//! The tag says whether the message was published atomically with the write (2: an upsert on
//! one node, one `MULTI` with its `PUBLISH`) or not (1: deletes, whose script runs before the
//! `PUBLISH`, and every write on a cluster): two writers' non-atomic messages may arrive in
//! the other order than their writes, which the receiver must allow for (`cache`).
//!
//! Why a trailer and not a new variant: postcard decodes a known prefix and ignores what
//! follows, so an instance of an older build (during a rolling deploy) reads the message as
//! the `Keys` it always understood and drops those fields, while a new one reads the new codes
//! and updates its copy of each bucket in place. A new variant would decode as nothing on an
//! old instance, which would then keep answering from a stale cache until its TTL. A `Keys`
//! without a trailer (from an older writer) tells a new instance only that the fields changed:
//! it refetches their buckets.
//!
//! The audit tool (`namelist-tools audit`) leaves its last summary in the hash
//! `<prefix>audit:last` ([`AuditSummary`]); every service instance reads it periodically and
//! exports it as gauges (buckets near and over the listpack limit, bytes per entry).
//!
//! # The lists' counts
//! `GET /v1/lists` pages through the (list, sandbox) pairs holding entries, each with an
//! approximate entry count and its last change, kept on write (`EntryStore::count_changes`,
//! never by scanning buckets). All four keys share the hash tag `{<prefix>}` (a prefix holds
//! no braces), so one script updates them atomically, on one slot of a cluster:
//!
//! | key | Redis | content |
//! |---|---|---|
//! | `<prefix>lists{<prefix>}:n` | hash | `<list> 00 <sandbox>` → count, always > 0 |
//! | `<prefix>lists{<prefix>}:t` | hash | `<list> 00 <sandbox>` → last change, Unix ms |
//! | `<prefix>lists{<prefix>}:l` | sorted set, every score 0 | `<list> 00 <sandbox>`: the index by list |
//! | `<prefix>lists{<prefix>}:s` | sorted set, every score 0 | `<sandbox> 00 <list>`: the index by sandbox |
//!
//! `00` is one NUL byte. It sorts below every byte of both alphabets, so the byte order of
//! the index by list (what `ZRANGE … BYLEX` follows) is exactly (list, sandbox) order, a
//! shorter name first (`a` before `a-b`), and that of the index by sandbox (sandbox, list).
//!
//! A change is one script call (`COUNT_CHANGES`) per [`COUNT_CHUNK`] pairs, all in one round
//! trip: per pair, `HINCRBY` the count; at 0 or below the pair is deleted from all four keys;
//! otherwise its time goes up to the change's (never down) and it is added (`ZADD`, a no-op
//! when present) to both indexes. So a pair is in all four keys or in none, and only while
//! its count is positive: a list emptied by deletes leaves nothing behind.
//!
//! A page (`COUNTS_PAGE`, a read-only script) is one `ZRANGE <index> <min> <max> BYLEX LIMIT
//! 0 <limit + 1>` and one `HMGET` of the page's pairs in each hash: O(log n + limit) whatever
//! the number n of pairs, and whatever the filter ([`Layout::count_range`]):
//!
//! | filter | index | min | max |
//! |---|---|---|---|
//! | none | by list | `-` | `+` |
//! | `list` = L | by list | `[L 00` | `(L 01` |
//! | `list` = L, `sandbox` = S | by list | `[L 00 S` | `[L 00 S` |
//! | `sandbox` = S | by sandbox | `[S 00` | `(S 01` |
//!
//! A cursor `(al, as)` (pairs strictly after it) raises the index by list's min to
//! `(al 00 as` when that is not below it, and the index by sandbox's to `[S 00 al` when
//! S > as, else `(S 00 al` (a min above the max reads nothing). The `limit + 1`-th pair
//! only says that there is more. The names of the lists of one sandbox
//! (`lookup_everywhere`) are the same page of the index by sandbox.
//!
//! Cost per pair, `MEMORY USAGE … SAMPLES 0` over 20,000 pairs of 9–12-byte members (every
//! key past its listpack limit; `tests/integration/list_counts.rs` prints it): 61 B in `:n`, 69 B in
//! `:t`, 113 B in each index, 356 B in all; a member's bytes count about four times. A
//! handful of pairs (listpacks) cost 1,120 B for 10. Nothing bounds the number of pairs but
//! the entries written (a pair is a (list, sandbox) holding at least one): the bound is on
//! what a request reads, a page of at most 1,000 pairs.
//!
//! On a cluster the counts live on the one primary of that slot: while it is down, count
//! changes fail (logged and counted in `namelist_list_count_errors_total`; the write they
//! follow stands) and `GET /v1/lists` answers 503.
//!
//! Builds before this layout kept the counts in 64 hashes `<prefix>lists:{<tag>}` (the audit
//! parts' tags; `Layout::old_counts_key`), a change in any part, a read summing all of them.
//! Every start of the service folds any such part into the keys above
//! (`RedisStore::fold_old_counts`; the operator tools do not, so that the audit stays read
//! only), [`COUNT_CHUNK`] fields at a time: a script on the part's slot takes a chunk's pairs (reads and deletes `f` and
//! `f|t`, atomically), then `COUNT_CHANGES` adds them (count summed, latest time kept); a part
//! left empty no longer exists. Each pair is taken by one opener only, so instances starting
//! together count it once; a process killed between a take and its add loses that chunk's
//! counts (at most [`COUNT_CHUNK`] pairs, undercounted). Why take then add, and not add then
//! delete the part: the parts and the counts are on different slots, so neither order is
//! atomic, and the instances of a rolling deploy start together: two that each added a part
//! before either deleted it would count it twice, every time, where the take loses counts
//! only to a crash inside one chunk. A field that is not a pair this
//! layout wrote is left where it is. During a rolling deploy the old instances keep adding
//! to the parts (and read only the parts: they undercount until they are replaced); the next
//! start of a new instance folds what they added.

use serde::{Deserialize, Serialize};

use super::CountsQuery;
use super::expiry::ExpiryCode;
pub use super::fingerprint::{FORMAT_KEYED, FORMAT_UNKEYED, Hashing};
use crate::domain::{
    Dimension, IpFamily, ListName, MAX_DOMAIN_LABELS, MAX_SEGMENT_DIGITS, Sandbox, Value,
};

/// The version byte of an [`Invalidation`] message: the message encoding, not the layout
/// format, so instances of either format (and of older builds) still understand each other.
const MESSAGE_VERSION: u8 = 1;

/// Mean fields per bucket the bucket count is sized for.
pub const MAX_MEAN_FILL: u64 = 200;

/// Hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// Parts of the audit trail (see the module docs).
pub const AUDIT_PARTS: usize = 64;

/// Most pairs of the lists' counts one script call changes or takes (see the module docs):
/// each call holds Redis for a bounded time.
pub const COUNT_CHUNK: usize = 1_000;

/// Redis Cluster's hash slot of a key: CRC16/XMODEM of its hash tag (the first non-empty
/// `{…}`) or else of the whole key, modulo 16,384.
pub fn key_slot(key: &[u8]) -> u16 {
    const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    CRC16.checksum(tagged.unwrap_or(key)) % CLUSTER_SLOTS
}

/// The hash tags of the audit parts: for part `i`, the smallest decimal number whose slot is
/// in `[256·i, 256·(i+1))`. Computed once; `tests::audit_tags_are_stable` pins them, since a
/// different tag would be a different key.
fn audit_tags() -> &'static [u32; AUDIT_PARTS] {
    static TAGS: std::sync::OnceLock<[u32; AUDIT_PARTS]> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        let width = u32::from(CLUSTER_SLOTS) / AUDIT_PARTS as u32;
        let mut tags = [u32::MAX; AUDIT_PARTS];
        let mut left = AUDIT_PARTS;
        let mut n = 0u32;
        while left > 0 {
            let part = (u32::from(key_slot(n.to_string().as_bytes())) / width) as usize;
            if tags[part] == u32::MAX {
                tags[part] = n;
                left -= 1;
            }
            n += 1;
        }
        tags
    })
}

/// The hash tags of the event-id buckets: for slot `s`, the smallest decimal number whose
/// slot is `s`. Computed once (~170,000 CRC16s of short strings, a few milliseconds);
/// `tests::event_tags_are_stable` pins some, since a different tag would be another key.
fn event_tags() -> &'static [u32] {
    static TAGS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; usize::from(CLUSTER_SLOTS)];
        let mut left = tags.len();
        let mut n = 0u32;
        while left > 0 {
            let slot = usize::from(key_slot(n.to_string().as_bytes()));
            if tags[slot] == u32::MAX {
                tags[slot] = n;
                left -= 1;
            }
            n += 1;
        }
        tags
    })
}

/// The velocity layout every new keyspace gets (see the module docs).
pub const VELOCITY_LAYOUT: u32 = 2;

/// Event ids a keyspace's buckets are sized for when nothing is configured.
pub const DEFAULT_EXPECTED_EVENT_IDS: u64 = 10_000_000;

/// Where one entry lives: its bucket and its field in that bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EntryKey {
    pub bucket: u32,
    pub field: i64,
}

impl EntryKey {
    /// The fingerprint shown in logs and the audit trail instead of the value: the field as 16
    /// hex digits. In format 2 it is keyed, so it cannot be turned back into the value without
    /// the fingerprint key; in format 1 it is an unkeyed hash, which brute force reverses for
    /// low-entropy values such as phone numbers.
    pub fn fingerprint(&self) -> String {
        format!("{:016x}", self.field as u64)
    }
}

/// A (list, sandbox) pair: the scope of a prefix-length registry, of a list's counts and
/// hits. Serialised (the embedded store's snapshot, postcard) as the pair it once was: list,
/// then sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Scope {
    pub list: ListName,
    pub sandbox: Sandbox,
}

impl Scope {
    pub fn new(list: &ListName, sandbox: &Sandbox) -> Self {
        Self {
            list: list.clone(),
            sandbox: sandbox.clone(),
        }
    }
}

/// What a registered length measures: the prefix bits of an IPv4 or IPv6 network, the
/// characters of a phone segment (its `+` included), or the labels of an e-mail domain entry.
///
/// Serialised (the embedded store's snapshot, postcard) by variant index: never reorder;
/// new kinds go at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PrefixKind {
    V4,
    V6,
    PhoneSegment,
    EmailDomain,
}

impl From<IpFamily> for PrefixKind {
    fn from(f: IpFamily) -> Self {
        match f {
            IpFamily::V4 => PrefixKind::V4,
            IpFamily::V6 => PrefixKind::V6,
        }
    }
}

impl PrefixKind {
    /// The registry member's tag.
    fn tag(self) -> &'static str {
        match self {
            PrefixKind::V4 => "4",
            PrefixKind::V6 => "6",
            PrefixKind::PhoneSegment => "phone",
            PrefixKind::EmailDomain => "email",
        }
    }

    /// The lengths an entry of this kind may have.
    fn lengths(self) -> std::ops::RangeInclusive<u8> {
        match self {
            // A full-length network is a single address, not a range.
            PrefixKind::V4 => 0..=31,
            PrefixKind::V6 => 0..=127,
            // 1-19 digits, plus an optional `+`.
            PrefixKind::PhoneSegment => 1..=(MAX_SEGMENT_DIGITS as u8 + 1),
            PrefixKind::EmailDomain => 2..=MAX_DOMAIN_LABELS as u8,
        }
    }
}

/// One length in use in a scope: an IP network's prefix length, a phone segment's length or
/// an e-mail domain entry's label count. A check probes one field per length in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PrefixLen {
    pub kind: PrefixKind,
    pub len: u8,
}

impl PrefixLen {
    /// The length an entry's value must have registered for checks to find it, if any: a
    /// range, a segment or a domain. Exact values need none.
    pub fn of(value: &Value) -> Option<Self> {
        let (kind, len) = match value {
            Value::Ip(ip) if ip.is_range() => (ip.family().into(), ip.prefix()),
            Value::PhoneSegment(s) => (PrefixKind::PhoneSegment, u8::try_from(s.len()).ok()?),
            Value::EmailDomain(d) => (
                PrefixKind::EmailDomain,
                u8::try_from(d.split('.').count()).ok()?,
            ),
            _ => return None,
        };
        Some(Self { kind, len })
    }

    /// The registry member: `4/24`, `6/48`, `phone/6`, `email/2`.
    pub fn member(&self) -> String {
        format!("{}/{}", self.kind.tag(), self.len)
    }

    /// Parses a registry member; `None` for anything this version did not write (an older
    /// build reads `phone/…` and `email/…` members as such and skips them).
    pub fn parse_member(s: &str) -> Option<Self> {
        let (tag, len) = s.split_once('/')?;
        let kind = [
            PrefixKind::V4,
            PrefixKind::V6,
            PrefixKind::PhoneSegment,
            PrefixKind::EmailDomain,
        ]
        .into_iter()
        .find(|k| k.tag() == tag)?;
        let n: u8 = len.parse().ok()?;
        (n.to_string() == len && kind.lengths().contains(&n)).then_some(Self { kind, len: n })
    }
}

/// Key names and the hashing of one keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
    buckets: u32,
    hashing: Hashing,
    /// How velocity entities are keyed (see the module docs, *Velocity metrics*): 1 one hash
    /// tag per (metric, entity), 2 one per entity.
    velocity: u32,
    /// Buckets of remembered event ids (see the module docs, *Event ids*).
    event_buckets: u32,
    /// The normalisation rules its fingerprints were made under (`domain::rules`).
    rules: u32,
}

impl Layout {
    pub fn new(prefix: impl Into<String>, buckets: u32, hashing: Hashing) -> Self {
        assert!(buckets > 0, "a keyspace needs at least one bucket");
        Self {
            prefix: prefix.into(),
            buckets,
            hashing,
            velocity: VELOCITY_LAYOUT,
            event_buckets: Self::event_buckets_for(DEFAULT_EXPECTED_EVENT_IDS),
            rules: crate::domain::LATEST_RULES,
        }
    }

    /// The same keyspace under normalisation rules `rules`, as its meta records them (a new
    /// keyspace gets `domain::LATEST_RULES`).
    pub fn with_rules(mut self, rules: u32) -> Self {
        self.rules = rules;
        self
    }

    /// The normalisation rules its fingerprints were made under.
    pub fn rules(&self) -> u32 {
        self.rules
    }

    /// The same keyspace with velocity layout `velocity` (1 or 2) and `event_buckets`
    /// buckets of event ids, as its meta hash records them.
    pub fn with_velocity(mut self, velocity: u32, event_buckets: u32) -> Self {
        assert!(event_buckets > 0, "event ids need at least one bucket");
        self.velocity = velocity;
        self.event_buckets = event_buckets;
        self
    }

    /// The velocity layout (1 or 2).
    pub fn velocity(&self) -> u32 {
        self.velocity
    }

    /// Buckets of remembered event ids.
    pub fn event_buckets(&self) -> u32 {
        self.event_buckets
    }

    /// The number of event-id buckets for `expected_ids` ids remembered at once.
    pub fn event_buckets_for(expected_ids: u64) -> u32 {
        let n = expected_ids.div_ceil(MAX_MEAN_FILL).max(1);
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// How values are hashed: the layout format.
    pub fn hashing(&self) -> &Hashing {
        &self.hashing
    }

    /// The layout format (1 unkeyed, 2 keyed).
    pub fn format(&self) -> u32 {
        self.hashing.format()
    }

    /// The bucket count for a new keyspace expected to hold `expected_entries`.
    pub fn buckets_for(expected_entries: u64) -> u32 {
        let n = expected_entries.div_ceil(MAX_MEAN_FILL).max(1);
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn buckets(&self) -> u32 {
        self.buckets
    }

    /// Where the entry (list, dimension, sandbox, value) lives.
    pub fn entry_key(
        &self,
        list: &ListName,
        dimension: &Dimension,
        sandbox: &Sandbox,
        value: &Value,
    ) -> EntryKey {
        self.key_of(&canonical(list, dimension, sandbox, value))
    }

    /// Where the entry with these canonical bytes lives.
    pub fn key_of(&self, canonical: &[u8]) -> EntryKey {
        let (bucket, field) = self.hashing.entry(canonical, self.buckets);
        EntryKey { bucket, field }
    }

    pub fn bucket_key(&self, bucket: u32) -> String {
        format!("{}b:{bucket}", self.prefix)
    }

    /// The bucket whose key is exactly `key`: `bucket_key(n)` for a bucket `n` of this
    /// keyspace (`n < buckets`), byte for byte (no sign, no leading zero, nothing after). What
    /// a tool may touch: a key that merely looks like a bucket is not one of ours.
    pub fn parse_bucket_key(&self, key: &[u8]) -> Option<u32> {
        self.bucket_number(key).filter(|&n| n < self.buckets)
    }

    /// The number of a key shaped exactly like `bucket_key(n)` for any `n`, in range or not:
    /// for the audit, which reports bucket keys a keyspace of more buckets left behind.
    pub fn bucket_number(&self, key: &[u8]) -> Option<u32> {
        let digits = key
            .strip_prefix(self.prefix.as_bytes())?
            .strip_prefix(b"b:")?;
        let n: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        (n.to_string().as_bytes() == digits).then_some(n)
    }

    /// A bucket's (field, value) if both are exactly what this layout writes: a canonical
    /// decimal i64 field and a canonical decimal u32 expiry code. Anything else (another
    /// writer's data) is not an entry and must be left alone.
    pub fn parse_entry(field: &[u8], value: &[u8]) -> Option<(i64, ExpiryCode)> {
        let f: i64 = std::str::from_utf8(field).ok()?.parse().ok()?;
        let code: u32 = std::str::from_utf8(value).ok()?.parse().ok()?;
        (f.to_string().as_bytes() == field && code.to_string().as_bytes() == value)
            .then_some((f, ExpiryCode::new(code)))
    }

    pub fn meta_key(&self) -> String {
        Self::meta_key_of(&self.prefix)
    }

    /// The meta hash of the keyspace at `prefix`: read before its hashing, hence its layout,
    /// is known.
    pub fn meta_key_of(prefix: &str) -> String {
        format!("{prefix}meta")
    }

    /// The marker a running instance leaves when it sees its keyspace vanish:
    /// `<prefix>{<prefix>meta}lost`, the lost keyspace's id, in the meta hash's slot. While it
    /// stands, nothing creates a new keyspace at this prefix but the explicit
    /// `namelist-tools keyspace create` (see `store::redis`, *A lost keyspace*).
    pub fn lost_marker_key_of(prefix: &str) -> String {
        format!("{prefix}{{{prefix}meta}}lost")
    }

    pub fn registry_key(&self, list: &ListName, sandbox: &Sandbox) -> String {
        format!("{}p:{list}:{sandbox}", self.prefix)
    }

    /// The audit stream of keyspaces written before the trail was split in parts: read,
    /// never written.
    pub fn audit_key(&self) -> String {
        format!("{}audit", self.prefix)
    }

    /// Audit part `part` (`0..AUDIT_PARTS`; taken modulo).
    pub fn audit_part_key(&self, part: usize) -> String {
        format!(
            "{}audit:{{{}}}",
            self.prefix,
            audit_tags()[part % AUDIT_PARTS]
        )
    }

    /// Part `part` of the lists' counts as builds before the paged counts kept them
    /// (`<prefix>lists:{<tag>}`, a hash of `<list>|<sandbox>` → count and
    /// `<list>|<sandbox>|t` → last change, with the audit parts' tags): never written, only
    /// folded into the keys of `counts_keys` when a store opens (see the module docs).
    pub fn old_counts_key(&self, part: usize) -> String {
        format!(
            "{}lists:{{{}}}",
            self.prefix,
            audit_tags()[part % AUDIT_PARTS]
        )
    }

    /// The lists' counts (see the module docs), all on the hash tag `{<prefix>}`: the counts,
    /// the last changes, the index by list and the index by sandbox, in that order.
    pub fn counts_keys(&self) -> [String; 4] {
        let base = format!("{p}lists{{{p}}}", p = self.prefix);
        [
            format!("{base}:n"),
            format!("{base}:t"),
            format!("{base}:l"),
            format!("{base}:s"),
        ]
    }

    /// A pair's field in the count hashes and its member of the index by list:
    /// `<list> 00 <sandbox>`. With the arguments swapped, its member of the index by sandbox.
    pub fn count_member(first: &str, second: &str) -> Vec<u8> {
        let mut m = Vec::with_capacity(first.len() + 1 + second.len());
        m.extend_from_slice(first.as_bytes());
        m.push(0);
        m.extend_from_slice(second.as_bytes());
        m
    }

    /// The two names of a count member (in the member's order), if it is one.
    pub fn parse_count_member(member: &[u8]) -> Option<(String, String)> {
        let at = member.iter().position(|&b| b == 0)?;
        let first = std::str::from_utf8(&member[..at]).ok()?;
        let second = std::str::from_utf8(&member[at + 1..]).ok()?;
        Some((first.to_owned(), second.to_owned()))
    }

    /// Which index a page of counts reads and its `ZRANGE … BYLEX` bounds (module docs):
    /// the members in `[min, max]` are exactly the pairs `query` selects, in its order.
    pub fn count_range(query: &CountsQuery) -> CountRange {
        let incl = |m: Vec<u8>| [&b"["[..], &m].concat();
        let excl = |m: Vec<u8>| [&b"("[..], &m].concat();
        if let (None, Some(sandbox)) = (&query.list, &query.sandbox) {
            // The lists of one sandbox, from the index by sandbox: `(l, S) > (al, as)` is
            // `l > al`, or `l = al` when `S > as`.
            let s = sandbox.as_str();
            let min = match &query.after {
                None => incl(Self::count_member(s, "")),
                Some(Scope {
                    list: al,
                    sandbox: r#as,
                }) if s > r#as.as_str() => incl(Self::count_member(s, al.as_str())),
                Some(Scope { list: al, .. }) => excl(Self::count_member(s, al.as_str())),
            };
            return CountRange {
                by_sandbox: true,
                min,
                max: excl([s.as_bytes(), &[1]].concat()),
            };
        }
        // From the index by list: everything, one list's sandboxes, or one pair.
        let (from, max) = match (&query.list, &query.sandbox) {
            (Some(l), Some(s)) => {
                let m = Self::count_member(l.as_str(), s.as_str());
                (Some(m.clone()), incl(m))
            }
            (Some(l), None) => (
                Some(Self::count_member(l.as_str(), "")),
                excl([l.as_str().as_bytes(), &[1]].concat()),
            ),
            _ => (None, b"+".to_vec()),
        };
        let after = query
            .after
            .as_ref()
            .map(|a| Self::count_member(a.list.as_str(), a.sandbox.as_str()));
        let min = match (from, after) {
            (Some(from), Some(after)) if after >= from => excl(after),
            (Some(from), _) => incl(from),
            (None, Some(after)) => excl(after),
            (None, None) => b"-".to_vec(),
        };
        CountRange {
            by_sandbox: false,
            min,
            max,
        }
    }

    /// The hash slot of audit part `part` (the same for every prefix: it is the tag's).
    pub fn audit_part_slot(part: usize) -> u16 {
        key_slot(audit_tags()[part % AUDIT_PARTS].to_string().as_bytes())
    }

    /// Every key the audit trail may be in: the parts, then the unsplit stream.
    pub fn audit_keys(&self) -> Vec<String> {
        (0..AUDIT_PARTS)
            .map(|i| self.audit_part_key(i))
            .chain([self.audit_key()])
            .collect()
    }

    /// The index of audit stream `i` of [`Layout::audit_keys`] (a part, or the unsplit stream
    /// last) and its mark, the id of the newest record known indexed: `<stream>:ix` and
    /// `<stream>:ixm` for a part (its hash tag), `<prefix>audit:ix{<prefix>audit}` and
    /// `<prefix>audit:ixm{<prefix>audit}` for the unsplit stream, whose key has no tag: the
    /// tag is the whole key, so both share its slot (a prefix holds no braces).
    pub fn audit_index_keys(&self, i: usize) -> (String, String) {
        if i < AUDIT_PARTS {
            let part = self.audit_part_key(i);
            (format!("{part}:ix"), format!("{part}:ixm"))
        } else {
            let single = self.audit_key();
            (
                format!("{single}:ix{{{single}}}"),
                format!("{single}:ixm{{{single}}}"),
            )
        }
    }

    /// An audit record's value fingerprint (its `vfp` field): the format's `audit-value`
    /// function of `<dimension> "\n" <normalised value>`, without list or sandbox, so that
    /// one index term finds a value wherever it was written.
    pub fn audit_value(&self, dimension: &Dimension, value: &Value) -> u64 {
        let mut bytes = Vec::with_capacity(48);
        {
            use std::io::Write;
            write!(bytes, "{dimension}\n{value}").expect("writing to a Vec cannot fail");
        }
        self.hashing.audit_value(&bytes)
    }

    /// The hash holding the last audit's [`AuditSummary`].
    pub fn audit_summary_key(&self) -> String {
        format!("{}audit:last", self.prefix)
    }

    pub fn channel(&self) -> String {
        format!("{}inv", self.prefix)
    }

    /// The key of one entity of one metric version (see the module docs).
    pub fn metric_key(&self, metric: &str, version: u64, group_values: &[&str]) -> String {
        let mut values = Vec::with_capacity(64);
        for v in group_values {
            // Length-prefixed: values may hold any byte.
            values.extend_from_slice(v.len().to_string().as_bytes());
            values.push(b':');
            values.extend_from_slice(v.as_bytes());
        }
        if self.velocity == 1 {
            let mut h = Vec::with_capacity(64);
            for part in [metric, &version.to_string()] {
                h.extend_from_slice(part.as_bytes());
                h.push(b'\n');
            }
            h.extend_from_slice(&values);
            return format!(
                "{}v{{{}}}",
                self.prefix,
                base64_bits(self.hashing.metric_entity(&h), 16)
            );
        }
        // NUL starts neither a metric id nor a length: these never meet format 1's bytes.
        let mut entity = b"\0entity\n".to_vec();
        entity.extend_from_slice(&values);
        let which = format!("\0metric\n{metric}\n{version}");
        format!(
            "{}v{{{}}}{}",
            self.prefix,
            base64_bits(self.hashing.metric_entity(&entity), 12),
            base64_bits(self.hashing.metric_entity(which.as_bytes()), 8)
        )
    }

    /// The bucket remembering the event with hash `event`: on a single node (`slot` None)
    /// one of all `event_buckets`; on a cluster, one of those in `slot` (the slot of the
    /// keys the event's call updates), so the check and the updates are one atomic call.
    pub fn event_bucket_key(&self, event: i64, slot: Option<u16>) -> String {
        let n = u64::from(self.event_buckets);
        let h = event as u64;
        let (slot, b) = match slot {
            Some(s) => {
                let per_slot = n.div_ceil(u64::from(CLUSTER_SLOTS));
                (s, (h >> 14) % per_slot)
            }
            None => {
                let i = h % n;
                let slots = n.min(u64::from(CLUSTER_SLOTS));
                ((i % slots) as u16, i / slots)
            }
        };
        format!("{}e{{{}}}{b}", self.prefix, event_tags()[usize::from(slot)])
    }

    /// Whether `key` names a bucket of event ids this keyspace may write (on a single node
    /// or a cluster), byte for byte: what the sweep recognises.
    pub fn is_event_bucket(&self, key: &[u8]) -> bool {
        let Some(rest) = key
            .strip_prefix(self.prefix.as_bytes())
            .and_then(|r| r.strip_prefix(b"e{"))
        else {
            return false;
        };
        let Some(close) = rest.iter().position(|&b| b == b'}') else {
            return false;
        };
        let (tag, b) = (&rest[..close], &rest[close + 1..]);
        let canonical = |d: &[u8]| {
            !d.is_empty() && d.iter().all(u8::is_ascii_digit) && (d == b"0" || d[0] != b'0')
        };
        if !canonical(tag) || !canonical(b) {
            return false;
        }
        let (Some(tag), Some(b)) = (
            std::str::from_utf8(tag)
                .ok()
                .and_then(|t| t.parse::<u32>().ok()),
            std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.parse::<u64>().ok()),
        ) else {
            return false;
        };
        let slot = key_slot(tag.to_string().as_bytes());
        let n = u64::from(self.event_buckets);
        // Per slot: `ceil(n / 16384)` buckets, on a single node as on a cluster.
        event_tags()[usize::from(slot)] == tag && b < n.div_ceil(u64::from(CLUSTER_SLOTS))
    }

    /// The COUNT_DISTINCT (and APPROX_COUNT_DISTINCT) member standing for a counted value.
    pub fn distinct_member(&self, value: &str) -> i64 {
        self.hashing.distinct_member(value.as_bytes())
    }

    /// What a metric entity remembers of an applied event (type and id).
    pub fn event_hash(&self, event_type: &str, id: &str) -> i64 {
        let mut h = Vec::with_capacity(event_type.len() + id.len() + 1);
        h.extend_from_slice(event_type.as_bytes());
        h.push(b'\n');
        h.extend_from_slice(id.as_bytes());
        self.hashing.event(&h)
    }

    /// The key of one sub-window of an APPROX_COUNT_DISTINCT entity.
    pub fn metric_sub_key(base: &str, sub: i64) -> String {
        format!("{base}:{sub}")
    }

    /// The hash of metric (`metric`) or rule (`rule`) definitions.
    pub fn definitions_key(&self, kind: &str) -> String {
        format!("{}defs:{kind}", self.prefix)
    }
}

/// The index a page of counts ranges over and its `BYLEX` bounds (`Layout::count_range`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountRange {
    /// The index by sandbox (members `<sandbox> 00 <list>`), else the index by list.
    pub by_sandbox: bool,
    /// `-`, or `[`/`(` and a member (inclusive, exclusive).
    pub min: Vec<u8>,
    /// `+`, or `[`/`(` and a member.
    pub max: Vec<u8>,
}

/// What the last audit found, as the audit tool leaves it in `<prefix>audit:last` for the
/// service's gauges. With `sampled`, the bucket counts are scaled from the sample to every
/// bucket found.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditSummary {
    /// When the audit started, Unix ms.
    pub at_ms: i64,
    pub sampled: bool,
    /// Bucket keys found.
    pub buckets: u64,
    pub entries: u64,
    pub bytes_per_entry: f64,
    /// `hash-max-listpack-entries` (the lowest over the nodes), if known.
    pub listpack_limit: Option<u64>,
    /// Buckets at 90 % of the limit or more, but not over it.
    pub near_limit: u64,
    pub over_limit: u64,
    pub hashtable: u64,
    /// Entries past their expiry, not yet swept.
    pub expired: u64,
    /// The fill histogram: (from, to, buckets) with `from <= fill < to`, in order (the last
    /// bin may be wider). Empty from an audit that wrote none.
    pub fill_histogram: Vec<(u64, u64, u64)>,
}

impl AuditSummary {
    /// The hash fields, as written.
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("at_ms", self.at_ms.to_string()),
            ("sampled", u8::from(self.sampled).to_string()),
            ("buckets", self.buckets.to_string()),
            ("entries", self.entries.to_string()),
            ("bytes_per_entry", format!("{:.3}", self.bytes_per_entry)),
            (
                "listpack_limit",
                self.listpack_limit
                    .map_or_else(String::new, |l| l.to_string()),
            ),
            ("near_limit", self.near_limit.to_string()),
            ("over_limit", self.over_limit.to_string()),
            ("hashtable", self.hashtable.to_string()),
            ("expired", self.expired.to_string()),
            (
                "fill_histogram",
                self.fill_histogram
                    .iter()
                    .map(|(from, to, n)| format!("{from}-{to}:{n}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]
    }

    /// Reads the hash back; `None` if a field is missing or unreadable (an older or foreign
    /// writer), so a gauge never shows a made-up number.
    pub fn from_fields(fields: &std::collections::HashMap<String, String>) -> Option<Self> {
        fn get<T: std::str::FromStr>(
            f: &std::collections::HashMap<String, String>,
            k: &str,
        ) -> Option<T> {
            f.get(k)?.parse().ok()
        }
        Some(Self {
            at_ms: get(fields, "at_ms")?,
            sampled: get::<u8>(fields, "sampled")? == 1,
            buckets: get(fields, "buckets")?,
            entries: get(fields, "entries")?,
            bytes_per_entry: get(fields, "bytes_per_entry")?,
            listpack_limit: get(fields, "listpack_limit"),
            near_limit: get(fields, "near_limit")?,
            over_limit: get(fields, "over_limit")?,
            hashtable: get(fields, "hashtable")?,
            expired: get(fields, "expired")?,
            // Optional: audits before the console wrote none.
            fill_histogram: fields
                .get("fill_histogram")
                .map(|h| {
                    h.split(',')
                        .filter(|b| !b.is_empty())
                        .filter_map(|b| {
                            let (range, n) = b.split_once(':')?;
                            let (from, to) = range.split_once('-')?;
                            Some((from.parse().ok()?, to.parse().ok()?, n.parse().ok()?))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// The low 96 bits of `bits` in URL-safe base64: 16 characters.
fn base64_bits(bits: u128, chars: usize) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    (0..chars)
        .map(|i| ALPHABET[((bits >> (6 * i)) & 63) as usize] as char)
        .collect()
}

/// The canonical bytes of an entry (see the module docs).
pub fn canonical(
    list: &ListName,
    dimension: &Dimension,
    sandbox: &Sandbox,
    value: &Value,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_canonical(&mut out, list, dimension, sandbox, value);
    out
}

/// Replaces `out` with the canonical bytes of an entry (reuses its allocation).
pub fn write_canonical(
    out: &mut Vec<u8>,
    list: &ListName,
    dimension: &Dimension,
    sandbox: &Sandbox,
    value: &Value,
) {
    use std::io::Write;
    out.clear();
    for part in [list.as_str(), dimension.as_str(), sandbox.as_str()] {
        out.extend_from_slice(part.as_bytes());
        out.push(b'\n');
    }
    write!(out, "{value}").expect("writing to a Vec cannot fail");
}

/// What a write tells every instance about what it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// These entries changed, to values not said (an older writer's message).
    Keys(Vec<EntryKey>),
    /// These entries now hold these codes (`None`: removed), in the order written: for a key
    /// given twice, the last one holds. `atomic`: published in one step with the write itself,
    /// so it cannot arrive in another order than the write relative to other writers.
    Changes {
        changes: Vec<(EntryKey, Option<u32>)>,
        atomic: bool,
    },
    /// The prefix-length registries of these scopes changed.
    Scopes(Vec<(String, String)>),
    /// Entries were written in bulk (import): anything held locally may be out of date.
    Bulk,
    /// Metric or rule definitions changed: reload them.
    Definitions,
}

/// The message as every build since the version byte encodes it: never reorder or change
/// these variants (older instances decode them by position).
#[derive(Serialize, Deserialize)]
enum Wire {
    Keys(Vec<EntryKey>),
    Scopes(Vec<(String, String)>),
    Bulk,
    Definitions,
}

/// The tags of the trailer that carries the new codes of a `Keys` message: published apart
/// from the write, or atomically with it.
const TRAILER_CODES: u8 = 1;
const TRAILER_CODES_ATOMIC: u8 = 2;

impl Invalidation {
    /// The message of an upsert: each entry now holds its code. `atomic` when it is
    /// published in one transaction with the write.
    pub fn upserted(entries: &[(EntryKey, u32)], atomic: bool) -> Self {
        Invalidation::Changes {
            changes: entries.iter().map(|(k, c)| (*k, Some(*c))).collect(),
            atomic,
        }
    }

    /// The message of a delete: each entry is gone (whether it was there or not). Never
    /// atomic: the deleting script runs before the `PUBLISH`.
    pub fn removed(keys: &[EntryKey]) -> Self {
        Invalidation::Changes {
            changes: keys.iter().map(|k| (*k, None)).collect(),
            atomic: false,
        }
    }

    /// The message body: the version byte, postcard, and for `Changes` the codes trailer.
    pub fn encode(&self) -> Vec<u8> {
        let (wire, codes) = match self {
            Invalidation::Keys(keys) => (Wire::Keys(keys.clone()), None),
            Invalidation::Changes { changes, atomic } => (
                Wire::Keys(changes.iter().map(|(k, _)| *k).collect()),
                Some((
                    if *atomic {
                        TRAILER_CODES_ATOMIC
                    } else {
                        TRAILER_CODES
                    },
                    changes.iter().map(|(_, c)| *c).collect::<Vec<_>>(),
                )),
            ),
            Invalidation::Scopes(s) => (Wire::Scopes(s.clone()), None),
            Invalidation::Bulk => (Wire::Bulk, None),
            Invalidation::Definitions => (Wire::Definitions, None),
        };
        let mut out = vec![MESSAGE_VERSION];
        out.extend(postcard::to_stdvec(&wire).expect("encoding to a Vec cannot fail"));
        if let Some((tag, codes)) = codes {
            out.push(tag);
            out.extend(postcard::to_stdvec(&codes).expect("encoding to a Vec cannot fail"));
        }
        out
    }

    /// Decodes a message body; `None` for a message this version cannot read. A `Keys`
    /// whose trailer is missing, unknown or does not match is read as plain `Keys`.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (&version, rest) = bytes.split_first()?;
        if version != MESSAGE_VERSION {
            return None;
        }
        let (wire, trailer) = postcard::take_from_bytes::<Wire>(rest).ok()?;
        Some(match wire {
            Wire::Keys(keys) => {
                let codes = match trailer.split_first() {
                    Some((&tag, body)) if tag == TRAILER_CODES || tag == TRAILER_CODES_ATOMIC => {
                        postcard::from_bytes::<Vec<Option<u32>>>(body)
                            .ok()
                            .map(|c| (c, tag == TRAILER_CODES_ATOMIC))
                    }
                    _ => None,
                };
                match codes {
                    Some((codes, atomic)) if codes.len() == keys.len() => Invalidation::Changes {
                        changes: keys.into_iter().zip(codes).collect(),
                        atomic,
                    },
                    _ => Invalidation::Keys(keys),
                }
            }
            Wire::Scopes(s) => Invalidation::Scopes(s),
            Wire::Bulk => Invalidation::Bulk,
            Wire::Definitions => Invalidation::Definitions,
        })
    }
}

/// The width of a stream id in an index member: 11 hex digits of ms (until the year 2527),
/// 8 of sequence.
pub const AUDIT_INDEX_ID_LEN: usize = 19;

/// A stream id `(ms, seq)` as an index member ends with it: fixed width, lower-case hex, so
/// that members of one term sort by id. `None` past what the width holds (no stream id this
/// service writes before the year 2527).
pub fn audit_index_id(ms: u64, seq: u64) -> Option<String> {
    (ms < 1 << 44 && seq <= u64::from(u32::MAX)).then(|| format!("{ms:011x}{seq:08x}"))
}

/// The inverse of [`audit_index_id`]: exactly 19 lower-case hex digits.
pub fn parse_audit_index_id(id: &str) -> Option<(u64, u64)> {
    if id.len() != AUDIT_INDEX_ID_LEN
        || !id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    Some((
        u64::from_str_radix(&id[..11], 16).ok()?,
        u64::from_str_radix(&id[11..], 16).ok()?,
    ))
}

/// The bytes of an index term, as members start with them: `v:`, `w:` or `l:` and the field
/// as stored (`vfp` as 16 hex digits), with `\0` written `\1\1` and `\1` written `\1\2` so
/// that no term holds the `\0` that ends it (the Lua twin is `AUDIT_PREAMBLE`'s `esc`).
pub fn audit_index_term(term: &super::AuditTerm) -> Vec<u8> {
    let (tag, text) = match term {
        super::AuditTerm::Value(v) => ("v:", std::borrow::Cow::Owned(format!("{v:016x}"))),
        super::AuditTerm::Who(w) => ("w:", std::borrow::Cow::Borrowed(w.as_str())),
        super::AuditTerm::List(l) => ("l:", std::borrow::Cow::Borrowed(l.as_str())),
    };
    let mut out = Vec::with_capacity(tag.len() + text.len());
    out.extend_from_slice(tag.as_bytes());
    for &b in text.as_bytes() {
        match b {
            0 => out.extend_from_slice(&[1, 1]),
            1 => out.extend_from_slice(&[1, 2]),
            b => out.push(b),
        }
    }
    out
}

/// One audit record: ordered (name, value) pairs, as they go into the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub fields: Vec<(String, String)>,
}

impl AuditRecord {
    /// The record of one upserted or deleted entry. `value_fingerprint` is
    /// `Layout::audit_value` of its dimension and value; `value_masked` must already be
    /// masked.
    #[allow(clippy::too_many_arguments)]
    pub fn entry(
        at_ms: i64,
        actor: &str,
        op: super::AuditOp,
        list: &ListName,
        dimension: &Dimension,
        sandbox: &Sandbox,
        expires_at_ms: Option<i64>,
        reason: Option<&str>,
        key: &EntryKey,
        value_fingerprint: u64,
        value_masked: String,
    ) -> Self {
        let mut fields = vec![
            ("at".to_owned(), at_ms.to_string()),
            ("who".to_owned(), actor.to_owned()),
            ("op".to_owned(), op.as_str().to_owned()),
            ("list".to_owned(), list.to_string()),
            ("dimension".to_owned(), dimension.to_string()),
            ("sandbox".to_owned(), sandbox.to_string()),
            (
                "expires_at".to_owned(),
                expires_at_ms.map_or_else(|| "never".to_owned(), |t| t.to_string()),
            ),
            ("fingerprint".to_owned(), key.fingerprint()),
            // What makes the trail the change log: the bucket the entry lives in.
            ("bucket".to_owned(), key.bucket.to_string()),
            ("vfp".to_owned(), format!("{value_fingerprint:016x}")),
            ("value".to_owned(), value_masked),
        ];
        if let Some(r) = reason {
            fields.push(("reason".to_owned(), r.to_owned()));
        }
        Self { fields }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The index terms the record is found by: its `vfp` (when it is 16 lower-case hex
    /// digits, as written), `who` and `list`, the first of each name (the index script's
    /// `members` reads the fields the same way).
    pub fn terms(&self) -> Vec<super::AuditTerm> {
        let mut out = Vec::with_capacity(3);
        if let Some(v) = self.get("vfp").filter(|v| {
            v.len() == 16
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }) && let Ok(v) = u64::from_str_radix(v, 16)
        {
            out.push(super::AuditTerm::Value(v));
        }
        if let Some(w) = self.get("who") {
            out.push(super::AuditTerm::Who(w.to_owned()));
        }
        if let Some(l) = self.get("list") {
            out.push(super::AuditTerm::List(l.to_owned()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_scope_is_encoded_as_the_pair_it_was() {
        // Embedded stores written when `Scope` was a `(ListName, Sandbox)` tuple still open.
        let (list, sandbox): (super::ListName, super::Sandbox) =
            ("black".parse().unwrap(), "loan".parse().unwrap());
        let pair = postcard::to_stdvec(&(list.clone(), sandbox.clone())).unwrap();
        let scope = super::Scope::new(&list, &sandbox);
        assert_eq!(postcard::to_stdvec(&scope).unwrap(), pair);
        assert_eq!(postcard::from_bytes::<super::Scope>(&pair).unwrap(), scope);
    }

    #[test]
    fn only_exact_bucket_keys_of_this_keyspace() {
        let l = Layout::new("nl:", 10, crate::store::Hashing::Unkeyed);
        assert_eq!(l.parse_bucket_key(b"nl:b:0"), Some(0));
        assert_eq!(l.parse_bucket_key(b"nl:b:9"), Some(9));
        assert_eq!(
            l.bucket_number(b"nl:b:12"),
            Some(12),
            "shaped like one, out of range"
        );
        assert_eq!(
            l.parse_bucket_key(b"nl:b:12"),
            None,
            "not a bucket of this keyspace"
        );
        for k in [
            &b"nl:b:10"[..],
            b"nl:b:+1",
            b"nl:b:01",
            b"nl:b:007",
            b"nl:b:",
            b"nl:b:x",
            b"nl:b:b:1",
            b"nl:b:x:b:1",
            b"nl:meta",
            b"xx:b:1",
        ] {
            let shown = String::from_utf8_lossy(k);
            assert_eq!(l.parse_bucket_key(k), None, "{shown}");
            if k != b"nl:b:10" {
                assert_eq!(l.bucket_number(k), None, "{shown}");
            }
        }
    }

    #[test]
    fn only_canonical_entries_parse() {
        assert_eq!(
            Layout::parse_entry(b"-42", b"0"),
            Some((-42, ExpiryCode::NEVER))
        );
        assert_eq!(
            Layout::parse_entry(b"9223372036854775807", b"4294967295"),
            Some((i64::MAX, ExpiryCode::new(u32::MAX)))
        );
        for (f, v) in [
            (&b"1"[..], &b"soon"[..]),
            (b"1", b"-1"),
            (b"1", b"+1"),
            (b"1", b"01"),
            (b"1", b"4294967296"),
            (b"1", b""),
            (b"x", b"1"),
            (b"+1", b"1"),
            (b"01", b"1"),
            (b"1", b"\xff"),
        ] {
            assert_eq!(Layout::parse_entry(f, v), None);
        }
    }

    use super::*;
    use crate::store::FingerprintKey;
    use proptest::prelude::*;

    fn keyed() -> Hashing {
        Hashing::Keyed(
            FingerprintKey::from_hex(
                "7f3a9c2e5b7d4f10aa55e0c1d2b3a49586f7e8d9cabbccddeeff001122334455",
                "test",
            )
            .unwrap(),
        )
    }

    fn key(layout: &Layout, list: &str, dim: &str, sandbox: &str, value: &str) -> EntryKey {
        let dim: Dimension = dim.parse().unwrap();
        let value = Value::parse_entry(&dim, value).unwrap();
        layout.entry_key(
            &list.parse().unwrap(),
            &dim,
            &sandbox.parse().unwrap(),
            &value,
        )
    }

    #[test]
    fn same_identity_same_key_however_typed() {
        let l = Layout::new("nl:", 2500, keyed());
        assert_eq!(
            key(&l, "black", "phone", "loan", "+86 138-0000-0000"),
            key(&l, "black", "phone", "loan", "+8613800000000")
        );
        assert_ne!(
            key(&l, "black", "phone", "loan", "+8613800000000"),
            key(&l, "black", "phone", "default", "+8613800000000")
        );
    }

    #[test]
    fn canonical_join_is_unambiguous() {
        let d = Dimension::Uid;
        let a = canonical(
            &"a".parse().unwrap(),
            &d,
            &"b".parse().unwrap(),
            &Value::Text("c\nd".into()),
        );
        assert_eq!(a, b"a\nuid\nb\nc\nd");
    }

    #[test]
    fn bucket_count_keeps_mean_fill_at_most_400() {
        assert_eq!(Layout::buckets_for(0), 1);
        assert_eq!(Layout::buckets_for(200), 1);
        assert_eq!(Layout::buckets_for(201), 2);
        assert_eq!(Layout::buckets_for(1_000_000), 5_000);
        assert_eq!(Layout::buckets_for(50_000_000_000), 250_000_000);
    }

    #[test]
    fn registry_members() {
        for (p, member) in [
            (
                PrefixLen {
                    kind: PrefixKind::V4,
                    len: 24,
                },
                "4/24",
            ),
            (
                PrefixLen {
                    kind: PrefixKind::V6,
                    len: 0,
                },
                "6/0",
            ),
            (
                PrefixLen {
                    kind: PrefixKind::PhoneSegment,
                    len: 20,
                },
                "phone/20",
            ),
            (
                PrefixLen {
                    kind: PrefixKind::EmailDomain,
                    len: 10,
                },
                "email/10",
            ),
        ] {
            assert_eq!(p.member(), member);
            assert_eq!(PrefixLen::parse_member(member), Some(p));
        }
        for foreign in [
            "4/32", "5/8", "4/+8", "4/024", "phone/0", "phone/21", "email/1", "email/11",
            "Phone/3", "phone/", "/3", "phone",
        ] {
            assert_eq!(PrefixLen::parse_member(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn the_length_an_entry_registers() {
        let of = |dim: &str, raw: &str| {
            let dim: Dimension = dim.parse().unwrap();
            PrefixLen::of(&Value::parse_entry(&dim, raw).unwrap()).map(|p| p.member())
        };
        assert_eq!(of("ip", "10.1.0.0/16").as_deref(), Some("4/16"));
        assert_eq!(of("ip", "10.1.0.1"), None);
        assert_eq!(of("ip", "2001:db8::/32").as_deref(), Some("6/32"));
        assert_eq!(of("phone", "+86 170*").as_deref(), Some("phone/6"));
        // Rules 2: `170*` is `+86170*`.
        assert_eq!(of("phone", "170*").as_deref(), Some("phone/6"));
        assert_eq!(of("phone", "17012345678"), None);
        assert_eq!(of("email", "@a.example.com").as_deref(), Some("email/3"));
        assert_eq!(of("email", "j@a.example.com"), None);
        assert_eq!(of("uid", "u*"), None);
    }

    #[test]
    fn metric_keys_are_short_tagged_and_distinct() {
        let l = Layout::new("nl:", 1, keyed());
        let k = l.metric_key("dev_tx_7d", 1, &["d000001"]);
        assert_eq!(k.len(), "nl:v{".len() + 12 + 1 + 8, "{k}");
        assert!(k.starts_with("nl:v{"));
        assert_ne!(
            k,
            l.metric_key("dev_tx_7d", 2, &["d000001"]),
            "versions differ"
        );
        assert_ne!(
            l.metric_key("m", 1, &["a", "bc"]),
            l.metric_key("m", 1, &["ab", "c"]),
            "values are joined unambiguously"
        );
        // Every metric of one entity shares its slot; other entities do not (in general).
        let slot = |k: &str| key_slot(k.as_bytes());
        assert_eq!(
            slot(&k),
            slot(&l.metric_key("dev_users_30d", 3, &["d000001"]))
        );
        assert_ne!(k[..17], l.metric_key("dev_tx_7d", 1, &["d000002"])[..17]);
        assert_eq!(Layout::metric_sub_key(&k, 17_737), format!("{k}:17737"));
        let unkeyed = Layout::new("nl:", 1, Hashing::Unkeyed);
        assert_ne!(
            unkeyed.metric_key("dev_tx_7d", 1, &["d000001"]),
            k,
            "the key changes the entity key"
        );
        // Layout 1 (keyspaces made before layout 2): one tag per (metric, entity), as before.
        let old = l.clone().with_velocity(1, 1);
        let k1 = old.metric_key("dev_tx_7d", 1, &["d000001"]);
        assert_eq!(k1.len(), "nl:v{".len() + 16 + 1, "{k1}");
        assert!(k1.ends_with('}'));
        assert_ne!(
            slot(&k1),
            slot(&old.metric_key("dev_users_30d", 3, &["d000001"]))
        );
    }

    #[test]
    fn event_buckets_are_per_slot_and_recognised() {
        let l = Layout::new("nl:", 1, keyed()).with_velocity(2, 100_000);
        assert_eq!(Layout::event_buckets_for(10_000_000), 50_000);
        assert_eq!(Layout::event_buckets_for(0), 1);
        // Pinned: these are key names in existing keyspaces.
        assert_eq!(event_tags()[..4], [3_560, 22_179, 48_756, 2_977]);
        assert_eq!(l.event_bucket_key(0, None), "nl:e{3560}0");
        let mut seen = std::collections::HashSet::new();
        for h in [
            0i64,
            1,
            -1,
            16_384,
            99_999,
            100_000,
            i64::MAX,
            i64::MIN,
            123_456_789,
        ] {
            let single = l.event_bucket_key(h, None);
            assert!(l.is_event_bucket(single.as_bytes()), "{single}");
            seen.insert(single);
            for slot in [0u16, 1, 9_999, 16_383] {
                let k = l.event_bucket_key(h, Some(slot));
                assert_eq!(key_slot(k.as_bytes()), slot, "{k}");
                assert!(l.is_event_bucket(k.as_bytes()), "{k}");
            }
        }
        assert!(seen.len() > 5, "ids spread over buckets: {seen:?}");
        for foreign in [
            "nl:e{3560}7",
            "nl:e{3560}07",
            "nl:e{03560}0",
            "nl:e{3560}",
            "nl:e{}0",
            "nl:b:0",
            "nl:x:e{3560}0",
        ] {
            assert!(!l.is_event_bucket(foreign.as_bytes()), "{foreign}");
        }
        // A tag of the right slot that is not the smallest one: another key.
        let other = (0u32..)
            .find(|n| event_tags()[usize::from(key_slot(n.to_string().as_bytes()))] != *n)
            .unwrap();
        assert!(!l.is_event_bucket(format!("nl:e{{{other}}}0").as_bytes()));
        // Fewer buckets than slots: one bucket in each of the first n slots on one node.
        let small = Layout::new("nl:", 1, keyed()).with_velocity(2, 3);
        let keys: std::collections::HashSet<String> = (0..100i64)
            .map(|h| small.event_bucket_key(h, None))
            .collect();
        assert_eq!(keys.len(), 3, "{keys:?}");
    }

    #[test]
    fn format_1_keys_are_what_they_always_were() {
        // Existing unkeyed keyspaces keep working only if format 1 hashes exactly as before.
        let l = Layout::new("nl:", 5000, Hashing::Unkeyed).with_velocity(1, 1);
        let bytes = b"m\n1\n1:a";
        let bits = xxhash_rust::xxh3::xxh3_128(bytes) >> 32;
        let expected: String = (0..16)
            .map(|i| {
                b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                    [((bits >> (6 * i)) & 63) as usize] as char
            })
            .collect();
        assert_eq!(l.metric_key("m", 1, &["a"]), format!("nl:v{{{expected}}}"));
        assert_eq!(
            l.distinct_member("13812345678"),
            xxhash_rust::xxh3::xxh3_64(b"13812345678") as i64
        );
        assert_eq!(
            l.event_hash("login", "e1"),
            xxhash_rust::xxh3::xxh3_64(b"login\ne1") as i64
        );
        let canonical = b"black\nphone\nloan\n13812345678";
        assert_eq!(
            l.key_of(canonical),
            EntryKey {
                bucket: crc32fast::hash(canonical) % 5000,
                field: xxhash_rust::xxh3::xxh3_64(canonical) as i64,
            }
        );
    }

    #[test]
    fn key_slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(key_slot(b"foo"), 12_182);
        assert_eq!(key_slot(b"somekey"), 11_058);
        assert_eq!(key_slot(b"nl:b:17"), key_slot(b"x{nl:b:17}y"));
        assert_eq!(key_slot(b"{user1000}.following"), 3_443);
        assert_eq!(
            key_slot(b"foo{}{bar}"),
            8_363,
            "an empty first tag: the whole key"
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), 4_015, "the tag is `{{bar`");
        assert_eq!(key_slot(b"{bar"), 4_015, "no closing brace: the whole key");
    }

    /// Redis's `ZRANGE … BYLEX` over equal scores: `-`, `+`, `[m` (inclusive), `(m`
    /// (exclusive), bytes compared as `memcmp` does.
    fn bylex(
        members: &std::collections::BTreeSet<Vec<u8>>,
        min: &[u8],
        max: &[u8],
    ) -> Vec<Vec<u8>> {
        let above = |m: &[u8]| match min.split_first() {
            Some((b'[', x)) => m >= x,
            Some((b'(', x)) => m > x,
            _ => min == b"-",
        };
        let below = |m: &[u8]| match max.split_first() {
            Some((b'[', x)) => m <= x,
            Some((b'(', x)) => m < x,
            _ => max == b"+",
        };
        members
            .iter()
            .filter(|m| above(m) && below(m))
            .cloned()
            .collect()
    }

    fn name(alphabet: &'static str) -> impl Strategy<Value = String> {
        proptest::collection::vec(proptest::sample::select(alphabet.as_bytes().to_vec()), 1..4)
            .prop_map(|b| String::from_utf8(b).unwrap())
    }

    proptest! {
        /// The range a page reads holds exactly the pairs the query selects, in (list,
        /// sandbox) order, for any filter and cursor: names drawn from the alphabets' edges
        /// (`-` `0` `_` and letters), so prefixes and "shorter first" are common.
        #[test]
        fn count_ranges_select_what_the_query_does(
            pairs in proptest::collection::btree_set((name("-0_ab"), name("-0_AZab")), 0..40),
            list in proptest::option::of(name("-0_ab")),
            sandbox in proptest::option::of(name("-0_AZab")),
            after in proptest::option::of((name("-0_ab"), name("-0_AZab"))),
        ) {
            let query = CountsQuery {
                list: list.map(|l| l.parse().unwrap()),
                sandbox: sandbox.map(|s| s.parse().unwrap()),
                after: after.map(|(l, s)| Scope {
                    list: l.parse().unwrap(),
                    sandbox: s.parse().unwrap(),
                }),
                limit: usize::MAX,
            };
            let by_list: std::collections::BTreeSet<Vec<u8>> =
                pairs.iter().map(|(l, s)| Layout::count_member(l, s)).collect();
            let by_sandbox: std::collections::BTreeSet<Vec<u8>> =
                pairs.iter().map(|(l, s)| Layout::count_member(s, l)).collect();
            let range = Layout::count_range(&query);
            let index = if range.by_sandbox { &by_sandbox } else { &by_list };
            let got: Vec<(String, String)> = bylex(index, &range.min, &range.max)
                .iter()
                .map(|m| {
                    let (a, b) = Layout::parse_count_member(m).unwrap();
                    if range.by_sandbox { (b, a) } else { (a, b) }
                })
                .collect();
            let want: Vec<(String, String)> =
                pairs.iter().filter(|(l, s)| query.selects(l, s)).cloned().collect();
            prop_assert_eq!(got, want, "{:?} read {:?}", query, range);
        }
    }

    #[test]
    fn count_keys_share_one_slot_and_start_with_the_prefix() {
        let l = Layout::new("nl:", 10, Hashing::Unkeyed);
        let keys = l.counts_keys();
        assert_eq!(keys[0], "nl:lists{nl:}:n");
        assert_eq!(keys[3], "nl:lists{nl:}:s");
        for k in &keys {
            assert!(k.starts_with("nl:"));
            assert_eq!(key_slot(k.as_bytes()), key_slot(b"nl:"), "{k}");
        }
        assert!(!keys.contains(&l.old_counts_key(0)));
        assert_eq!(
            l.old_counts_key(0),
            "nl:lists:{10}",
            "the older layout's names, pinned"
        );
    }

    #[test]
    fn audit_tags_are_stable() {
        let l = Layout::new("nl:", 10, Hashing::Unkeyed);
        // Pinned: these are key names in existing keyspaces.
        assert_eq!(l.audit_part_key(0), "nl:audit:{10}");
        assert_eq!(l.audit_part_key(3), "nl:audit:{342}");
        assert_eq!(audit_tags()[..8], [10, 18, 113, 342, 29, 21, 3, 122]);
        assert_eq!(audit_tags().iter().max(), Some(&343));
        let mut seen = std::collections::HashSet::new();
        for i in 0..AUDIT_PARTS {
            let slot = Layout::audit_part_slot(i);
            assert_eq!(usize::from(slot) / 256, i, "part {i} in its 256 slots");
            assert_eq!(key_slot(l.audit_part_key(i).as_bytes()), slot);
            assert!(seen.insert(l.audit_part_key(i)));
        }
        assert_eq!(l.audit_keys().len(), AUDIT_PARTS + 1);
        assert_eq!(l.audit_keys().last().unwrap(), "nl:audit");
    }

    #[test]
    fn audit_index_keys_share_their_stream_slot() {
        let l = Layout::new("nl:", 10, Hashing::Unkeyed);
        let streams = l.audit_keys();
        for (i, stream) in streams.iter().enumerate() {
            let (ix, mark) = l.audit_index_keys(i);
            let slot = key_slot(stream.as_bytes());
            assert_eq!(key_slot(ix.as_bytes()), slot, "{ix}");
            assert_eq!(key_slot(mark.as_bytes()), slot, "{mark}");
        }
        assert_eq!(l.audit_index_keys(3).0, "nl:audit:{342}:ix");
        assert_eq!(l.audit_index_keys(AUDIT_PARTS).0, "nl:audit:ix{nl:audit}");
        assert_eq!(l.audit_index_keys(AUDIT_PARTS).1, "nl:audit:ixm{nl:audit}");
    }

    #[test]
    fn audit_index_ids_sort_as_stream_ids() {
        let ids = [
            (0, 0),
            (0, 1),
            (0, u64::from(u32::MAX)),
            (1, 0),
            (1_764_000_000_000, 7),
            (1_764_000_000_001, 0),
            ((1 << 44) - 1, u64::from(u32::MAX)),
        ];
        let written: Vec<String> = ids
            .iter()
            .map(|&(ms, seq)| audit_index_id(ms, seq).unwrap())
            .collect();
        for (w, id) in written.iter().zip(ids) {
            assert_eq!(w.len(), AUDIT_INDEX_ID_LEN);
            assert_eq!(parse_audit_index_id(w), Some(id));
        }
        assert!(written.windows(2).all(|w| w[0] < w[1]), "{written:?}");
        // The module docs' example.
        assert_eq!(
            audit_index_id(1_700_000_000_077, 3).as_deref(),
            Some("18bcfe5684d00000003")
        );
        assert_eq!(audit_index_id(1 << 44, 0), None);
        assert_eq!(audit_index_id(0, 1 << 32), None);
        for bad in [
            "",
            "0000000000000000000 ",
            "000000000000000000A",
            "0000000000000000000x",
        ] {
            assert_eq!(parse_audit_index_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn audit_index_terms_never_hold_the_byte_that_ends_them() {
        use crate::store::AuditTerm;
        let term = |t: AuditTerm| audit_index_term(&t);
        assert_eq!(term(AuditTerm::Value(0xab)), b"v:00000000000000ab");
        assert_eq!(term(AuditTerm::Who("alice".into())), b"w:alice");
        assert_eq!(term(AuditTerm::List("black".into())), b"l:black");
        assert_eq!(
            term(AuditTerm::Who("a\0b\u{1}c".into())),
            b"w:a\x01\x01b\x01\x02c"
        );
        // Two names, one a prefix of the other with the escaped byte after it, stay apart:
        // neither term followed by `\0` is a prefix of the other's.
        let (a, b) = (
            term(AuditTerm::Who("n".into())),
            term(AuditTerm::Who("n\0".into())),
        );
        assert!(!a.contains(&0) && !b.contains(&0));
        assert!(
            ![b.clone(), vec![0]]
                .concat()
                .starts_with(&[a, vec![0]].concat())
        );
    }

    #[test]
    fn a_record_is_indexed_by_its_vfp_who_and_list() {
        use crate::store::AuditTerm;
        let r = |fields: &[(&str, &str)]| AuditRecord {
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        assert_eq!(
            r(&[
                ("who", "alice"),
                ("list", "black"),
                ("vfp", "00000000000000ff"),
                ("who", "bob"),
            ])
            .terms(),
            vec![
                AuditTerm::Value(255),
                AuditTerm::Who("alice".into()),
                AuditTerm::List("black".into()),
            ],
            "the first field of each name"
        );
        for bad in [
            "ff",
            "00000000000000FF",
            "000000000000000g",
            "000000000000000000",
        ] {
            assert_eq!(
                r(&[("vfp", bad)]).terms(),
                vec![],
                "a vfp this service did not write: {bad}"
            );
        }
        assert_eq!(
            r(&[("op", "import"), ("who", "loader")]).terms(),
            vec![AuditTerm::Who("loader".into())]
        );
    }

    #[test]
    fn the_value_fingerprint_ignores_list_and_sandbox_and_needs_the_key() {
        let keyed = Layout::new("nl:", 10, keyed());
        let dim: Dimension = "phone".parse().unwrap();
        let a = Value::parse_entry(&dim, "+86 138-0000-0000").unwrap();
        let b = Value::parse_entry(&dim, "+8613800000000").unwrap();
        assert_eq!(keyed.audit_value(&dim, &a), keyed.audit_value(&dim, &b));
        let uid: Dimension = "uid".parse().unwrap();
        let c = Value::parse_entry(&uid, "+8613800000000").unwrap();
        assert_ne!(
            keyed.audit_value(&dim, &a),
            keyed.audit_value(&uid, &c),
            "the dimension counts"
        );
        let unkeyed = Layout::new("nl:", 10, Hashing::Unkeyed);
        assert_eq!(
            unkeyed.audit_value(&dim, &a),
            xxhash_rust::xxh3::xxh3_64(format!("phone\n{a}").as_bytes())
        );
        assert_ne!(keyed.audit_value(&dim, &a), unkeyed.audit_value(&dim, &a));
    }

    #[test]
    fn invalidation_round_trip() {
        let k = |b, f| EntryKey {
            bucket: b,
            field: f,
        };
        for m in [
            Invalidation::Keys(vec![k(7, -3)]),
            Invalidation::upserted(&[(k(7, -3), 5), (k(1, i64::MIN), 0)], true),
            Invalidation::upserted(&[(k(7, -3), 5)], false),
            Invalidation::removed(&[k(2, 9)]),
            Invalidation::Changes {
                changes: vec![],
                atomic: false,
            },
            Invalidation::Scopes(vec![("black".into(), "loan".into())]),
            Invalidation::Bulk,
            Invalidation::Definitions,
        ] {
            assert_eq!(Invalidation::decode(&m.encode()), Some(m.clone()), "{m:?}");
        }
        assert_eq!(Invalidation::decode(b"\x09junk"), None);
        // A damaged or foreign trailer still says which fields changed.
        let mut bytes = Invalidation::upserted(&[(k(7, -3), 5)], true).encode();
        bytes.truncate(bytes.len() - 1);
        assert_eq!(
            Invalidation::decode(&bytes),
            Some(Invalidation::Keys(vec![k(7, -3)]))
        );
    }

    /// The decoder of the build before the local tier, verbatim in effect: a rolling deploy
    /// mixes it with this one, and it must read every write's message as the fields to drop.
    #[test]
    fn an_older_build_reads_a_new_write_message_as_its_keys() {
        #[derive(Debug, PartialEq, Deserialize)]
        enum OldInvalidation {
            Keys(Vec<EntryKey>),
            Scopes(Vec<(String, String)>),
            Bulk,
            Definitions,
        }
        fn old_decode(bytes: &[u8]) -> Option<OldInvalidation> {
            match bytes.split_first() {
                Some((&1, rest)) => postcard::from_bytes(rest).ok(),
                _ => None,
            }
        }
        let keys = vec![
            EntryKey {
                bucket: 3,
                field: 42,
            },
            EntryKey {
                bucket: 4_000_000,
                field: -42,
            },
        ];
        let upsert = Invalidation::upserted(&[(keys[0], 123_456_789), (keys[1], 0)], true);
        assert_eq!(
            old_decode(&upsert.encode()),
            Some(OldInvalidation::Keys(keys.clone()))
        );
        assert_eq!(
            old_decode(&Invalidation::removed(&keys).encode()),
            Some(OldInvalidation::Keys(keys.clone()))
        );
        assert_eq!(
            old_decode(&Invalidation::Bulk.encode()),
            Some(OldInvalidation::Bulk)
        );
        // And what the older build publishes reads here as plain `Keys`.
        let old_message = [vec![1u8], postcard::to_stdvec(&(0u8, &keys)).unwrap()].concat();
        assert_eq!(
            Invalidation::decode(&old_message),
            Some(Invalidation::Keys(keys))
        );
    }
}
