//! Velocity metrics and event ids: the key of each metric entity, the buckets that remember
//! applied events, and the hashes of metric and rule definitions.
//!
//! # Velocity metrics
//! One entity of one metric version is one key. In velocity layouts 2 and 3 (3 is what every
//! new keyspace gets, its meta hash records `velocity`; 3 differs from 2 only in the names of a
//! HyperLogLog's sub-window keys, three bytes shorter), the key is
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
//! | APPROX_COUNT_DISTINCT | one HyperLogLog per sub-window, `<key><i>` with `i` in base64 (layout 3; `<key>:<i>` in decimal before: `Layout::metric_sub_key`) (elements: the same member hash) | counted with one multi-key `PFCOUNT` |
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
//! (`ceil(dedupe_expected_ids / 50)`, `EVENT_IDS_PER_BUCKET`; 100 in keyspaces made on
//! 2026-11-28, 200 in those made before; fixed when first recorded): each slot has
//! `ceil(n / 16384)` buckets. The check and the record are in the same atomic script call as
//! the event's updates. On a single node that is one call per event: bucket `h mod n` (slot
//! `i mod min(n, 16384)`, `b = i / min(n, 16384)`), whatever keys the event updates. On a
//! cluster, one call per slot the event's keys live in, each remembering the event in a
//! bucket of that slot (`b = (h >> 14) mod ceil(n / 16384)`): an event updating metrics of
//! three entities is remembered three times. A remembered id whose code has passed counts as
//! absent (the lazy rule); a bucket past 1.28× the live ids it is sized for (64 fields; 128 or
//! 256 in a keyspace sized for 100 or 200) drops its expired ones, looked at by one new id in 25;
//! `namelist-tools sweep` deletes the expired ids of the buckets nobody writes (one walk of
//! `<prefix>[be][:{]*`: list buckets and event-id buckets). Definitions live in the hashes
//! `<prefix>defs:metric` and `<prefix>defs:rule`: field = id, value =
//! `<version>\n<fingerprint>\n<JSON>` (a deleted one keeps `<version>\n\n` so a re-created
//! metric never reuses an old version's counts).

use super::{CLUSTER_SLOTS, Layout, key_slot};

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
pub const VELOCITY_LAYOUT: u32 = 3;

/// Event ids a keyspace's buckets are sized for when nothing is configured.
pub const DEFAULT_EXPECTED_EVENT_IDS: u64 = 10_000_000;

/// Live event ids a bucket is sized for. An event's check and record (`HSETNX`) scans its
/// bucket's listpack, so it costs with the fill: counted under callgrind, an event's Redis
/// instructions are 152,900 with its bucket nearly empty, 156,400 at 32 ids, 160,600 at 50,
/// 174,200 at 100; memory per id is ~19.5 B at 50 against ~18.7 B at 100
/// (docs/performance.md, *Event-id buckets of 50*). Keyspaces made before keep the count
/// they recorded (100 a bucket from 2026-11-28, 200 before).
pub const EVENT_IDS_PER_BUCKET: u64 = 50;

impl Layout {
    /// The same keyspace with velocity layout `velocity` (1 to 3) and `event_buckets`
    /// buckets of event ids, as its meta hash records them.
    pub fn with_velocity(mut self, velocity: u32, event_buckets: u32) -> Self {
        assert!(event_buckets > 0, "event ids need at least one bucket");
        self.velocity = velocity;
        self.event_buckets = event_buckets;
        self
    }

    /// The velocity layout (1 to 3).
    pub fn velocity(&self) -> u32 {
        self.velocity
    }

    /// Buckets of remembered event ids.
    pub fn event_buckets(&self) -> u32 {
        self.event_buckets
    }

    /// The number of event-id buckets for `expected_ids` ids remembered at once.
    pub fn event_buckets_for(expected_ids: u64) -> u32 {
        let n = expected_ids.div_ceil(EVENT_IDS_PER_BUCKET).max(1);
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The key of one entity of one metric version (see the module docs). Built in place: it
    /// is made for every metric an event updates or a request reads.
    pub fn metric_key(&self, metric: &str, version: u64, group_values: &[&str]) -> String {
        use std::io::Write;
        // The bytes hashed for the entity (writing to a Vec cannot fail).
        let mut h: Vec<u8> = Vec::with_capacity(64);
        if self.velocity == 1 {
            write!(h, "{metric}\n{version}\n").expect("writing to a Vec");
        } else {
            // NUL starts neither a metric id nor a length: layout 2's parts never meet layout
            // 1's bytes.
            h.extend_from_slice(b"\0entity\n");
        }
        for v in group_values {
            // Length-prefixed: values may hold any byte.
            write!(h, "{}:", v.len()).expect("writing to a Vec");
            h.extend_from_slice(v.as_bytes());
        }
        let mut key = String::with_capacity(self.prefix.len() + 24);
        key.push_str(&self.prefix);
        key.push_str("v{");
        if self.velocity == 1 {
            push_base64_bits(&mut key, self.hashing.metric_entity(&h), 16);
            key.push('}');
            return key;
        }
        push_base64_bits(&mut key, self.hashing.metric_entity(&h), 12);
        key.push('}');
        h.clear();
        write!(h, "\0metric\n{metric}\n{version}").expect("writing to a Vec");
        push_base64_bits(&mut key, self.hashing.metric_entity(&h), 8);
        key
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

    /// The key of one sub-window of an APPROX_COUNT_DISTINCT entity: in layout 3 the
    /// entity's key then the sub-window index in URL-safe base64, least significant digit
    /// first and no longer than it needs (hourly sub-windows of today take 4 characters);
    /// before, `:` and the index in decimal (7). Unambiguous either way: the entity's key has
    /// a fixed length, and no two indices share their digits. Three bytes shorter keep the
    /// default prefix's keys within 30 bytes, one allocation class less: a sparse
    /// HyperLogLog of 20 elements takes 168 B against 184 B (`MEMORY USAGE`).
    pub fn metric_sub_key(&self, base: &str, sub: i64) -> String {
        if self.velocity < 3 {
            return format!("{base}:{sub}");
        }
        let mut key = String::with_capacity(base.len() + 6);
        key.push_str(base);
        // Sub-window indices count from the epoch: never negative for a time the service
        // accepts; a negative one keeps the decimal form, still distinct from every other.
        let Ok(mut n) = u64::try_from(sub) else {
            key.push(':');
            key.push_str(&sub.to_string());
            return key;
        };
        loop {
            push_base64_bits(&mut key, u128::from(n & 63), 1);
            n >>= 6;
            if n == 0 {
                return key;
            }
        }
    }

    /// The hash of metric (`metric`) or rule (`rule`) definitions.
    pub fn definitions_key(&self, kind: &str) -> String {
        format!("{}defs:{kind}", self.prefix)
    }
}

/// The low 96 bits of `bits` in URL-safe base64: 16 characters.
fn push_base64_bits(out: &mut String, bits: u128, chars: usize) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    out.extend((0..chars).map(|i| ALPHABET[((bits >> (6 * i)) & 63) as usize] as char));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fingerprint::Hashing;
    use crate::store::layout::tests::keyed;

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
        assert_eq!(
            l.clone().with_velocity(2, 1).metric_sub_key(&k, 17_737),
            format!("{k}:17737")
        );
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
    fn metric_key_names_are_pinned() {
        // These are key names in existing keyspaces: a change here strands their data.
        let l = Layout::new("nl:", 1, keyed());
        let unkeyed = Layout::new("nl:", 1, Hashing::Unkeyed);
        let got = [
            l.metric_key("dev_tx_7d", 1, &["d000001"]),
            l.metric_key("m", 12_345_678_901, &["a", "", "ünï\0"]),
            unkeyed.metric_key("dev_tx_7d", 1, &["d000001"]),
            l.clone()
                .with_velocity(1, 1)
                .metric_key("dev_tx_7d", 1, &["d000001"]),
            l.metric_key("no_group", 3, &[]),
        ];
        assert_eq!(
            got,
            [
                "nl:v{Qju23luj7LC_}HVWGunIN",
                "nl:v{pjGE-RMhdm5_}TA3zIwpe",
                "nl:v{ia2OaetCDKo-}e9EmY3J5",
                "nl:v{SUef1Hr8CZJMc9PR}",
                "nl:v{pRWMPQ_U5Hlh}0B-DsRMU",
            ]
        );
        // A HyperLogLog's sub-window keys: layout 3 (new keyspaces) in base64, least
        // significant digit first; layout 2 in decimal after `:`.
        let base = &got[0];
        let two = l.clone().with_velocity(2, 1);
        assert_eq!(l.velocity(), 3);
        let subs = [494_000, 0, 63, 64, -5].map(|i| {
            let (k3, k2) = (l.metric_sub_key(base, i), two.metric_sub_key(base, i));
            (k3[base.len()..].to_owned(), k2[base.len()..].to_owned())
        });
        assert_eq!(
            subs.clone().map(|(k3, _)| k3),
            ["wm4B", "A", "_", "AB", ":-5"].map(str::to_owned)
        );
        assert_eq!(
            subs.map(|(_, k2)| k2),
            [":494000", ":0", ":63", ":64", ":-5"].map(str::to_owned)
        );
        assert_eq!(
            l.metric_sub_key(base, 494_000).len(),
            30,
            "the default prefix's sub-window keys within 30 bytes"
        );
    }

    #[test]
    fn event_buckets_are_per_slot_and_recognised() {
        let l = Layout::new("nl:", 1, keyed()).with_velocity(2, 100_000);
        assert_eq!(Layout::event_buckets_for(10_000_000), 200_000);
        assert_eq!(Layout::event_buckets_for(150), 3);
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
}
