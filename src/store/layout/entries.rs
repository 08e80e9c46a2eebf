//! Entries: where an entry lives (its bucket and its field), the canonical bytes it is hashed
//! from, and the meta hash that fixes the bucket count and names the keyspace. `PRF` is the
//! format's function (the table at the top of `layout`).
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
//! On a cluster the meta hash lives on one shard: another shard restarted without its data
//! (or flushed, or failed over to an empty replica) would leave it in place and read as empty
//! buckets. So a cluster keyspace also has a **shard marker** in every hash slot,
//! `<prefix>{<tag>}shard` (`tag` = `slot_tags()[slot]`), a hash holding the same
//! `keyspace_id` (16,384 small hashes: 2.8 MB of `used_memory` for the cluster), written
//! when the keyspace is made or first opened by a build that knows them, which records
//! `shard_markers` = 1 in the meta hash. A read on a cluster carries, after its commands, `HGET <marker> keyspace_id`
//! for every slot it read; a write's step checks the markers of its slots inside its own
//! `MULTI`; a metric script call checks its slot's marker before it writes. A marker missing
//! is that slot's data lost, handled as a lost keyspace.

use serde::{Deserialize, Serialize};

use super::{Layout, MAX_MEAN_FILL};
use crate::domain::{Dimension, ListName, Sandbox, Value};
use crate::store::expiry::ExpiryCode;

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

impl Layout {
    /// The bucket count for a new keyspace expected to hold `expected_entries`.
    pub fn buckets_for(expected_entries: u64) -> u32 {
        let n = expected_entries.div_ceil(MAX_MEAN_FILL).max(1);
        u32::try_from(n).unwrap_or(u32::MAX)
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

    /// The shard marker of hash `slot` (see *The keyspace id*): `<prefix>{<tag>}shard`, in
    /// that slot.
    pub fn shard_marker_key(&self, slot: u16) -> String {
        let tags = super::slot_tags();
        format!(
            "{}{{{}}}shard",
            self.prefix,
            tags[usize::from(slot) % tags.len()]
        )
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::layout::tests::keyed;

    #[test]
    fn only_exact_bucket_keys_of_this_keyspace() {
        let l = Layout::new("nl:", 10, crate::store::fingerprint::Hashing::Unkeyed);
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
}
