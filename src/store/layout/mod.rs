//! Storage layout, formats 1 and 2: exactly what goes into Redis, and why. Both stores, the
//! service and the operator tools derive every key, field and message from this module.
//!
//! The two formats differ only in how values are hashed (`fingerprint`): format 2, what every
//! new keyspace gets, uses pseudo-random functions under the secret fingerprint key; format 1,
//! still read, used unkeyed xxh3 and crc32. In every part, `PRF` is the format's function:
//!
//! | use | format 2 (keyed) | format 1 (unkeyed) |
//! |---|---|---|
//! | field | low 64 bits of SipHash-2-4-128(k_entry, canonical) | xxh3_64(canonical) |
//! | bucket | high 64 bits of the same, mod N | crc32(canonical) mod N |
//! | velocity entity, metric | 72 and 48 bits (layout 1: 96) of SipHash-2-4-128(k_metric, …) | the same bits of xxh3_128(…) |
//! | distinct member | SipHash-2-4(k_member, value) | xxh3_64(value) |
//! | event hash | SipHash-2-4(k_event, type, id) | xxh3_64(type, id) |
//!
//! Each part of the layout is written down, byte by byte, beside the code that derives it:
//!
//! | part | file |
//! |---|---|
//! | *Entries*, *The bucket count N and the key*, *The keyspace id*: buckets, fields, expiry codes, the meta hash | `entries` |
//! | *Matching entries*: IP ranges, phone segments, e-mail domains and the registries of their lengths | `prefix` |
//! | *Velocity metrics*, *Event ids*: metric keys, event-id buckets, definitions | `velocity` |
//! | *Audit trail*, *The audit index*: the trail's parts, their index, the audit summary | `audit` |
//! | *Invalidation*: the message every write publishes | `invalidation` |
//! | *The lists' counts*: the counts' keys, members and page ranges | `counts` |
//!
//! This file keeps what every part shares: the [`Layout`] of one keyspace (prefix, bucket
//! count, hashing, velocity layout, rules), [`Scope`], the cluster's [`key_slot`].

mod audit;
mod counts;
mod entries;
mod invalidation;
mod prefix;
mod velocity;

use serde::{Deserialize, Serialize};

pub use self::audit::{
    AUDIT_INDEX_ID_LEN, AUDIT_PARTS, AuditOp, AuditRecord, AuditSummary, AuditTerm, audit_index_id,
    audit_index_term, parse_audit_index_id,
};
pub use self::counts::{COUNT_CHUNK, CountRange, CountsQuery};
pub use self::entries::{EntryKey, canonical, write_canonical};
pub use self::invalidation::Invalidation;
pub use self::prefix::{PrefixKind, PrefixLen};
pub use self::velocity::{DEFAULT_EXPECTED_EVENT_IDS, VELOCITY_LAYOUT};
pub use super::fingerprint::{FORMAT_KEYED, FORMAT_UNKEYED, Hashing};
use crate::domain::{ListName, Sandbox};

/// Mean fields per bucket the bucket count is sized for.
pub const MAX_MEAN_FILL: u64 = 200;

/// Hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16_384;

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

/// For each hash slot, the smallest decimal number whose slot it is: a hash tag that puts a
/// key in that slot (the shard markers', `entries`, *The keyspace id*; the audit parts' are
/// the smallest of each part's 256). Computed once (109,758 numbers are tried before every
/// slot has one); `tests::slot_tags_are_stable` pins some, since a different tag would be a
/// different key.
pub fn slot_tags() -> &'static [u32] {
    static TAGS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; usize::from(CLUSTER_SLOTS)];
        let mut left = tags.len();
        let mut text = String::new();
        let mut n = 0u32;
        while left > 0 {
            use std::fmt::Write;
            text.clear();
            let _ = write!(text, "{n}");
            let slot = usize::from(key_slot(text.as_bytes()));
            if tags[slot] == u32::MAX {
                tags[slot] = n;
                left -= 1;
            }
            n += 1;
        }
        tags
    })
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

/// Key names and the hashing of one keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    prefix: String,
    buckets: u32,
    hashing: Hashing,
    /// How velocity entities are keyed (see `velocity`, *Velocity metrics*): 1 one hash
    /// tag per (metric, entity), 2 one per entity.
    velocity: u32,
    /// Buckets of remembered event ids (see `velocity`, *Event ids*).
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

    /// How values are hashed: the layout format.
    pub fn hashing(&self) -> &Hashing {
        &self.hashing
    }

    /// The layout format (1 unkeyed, 2 keyed).
    pub fn format(&self) -> u32 {
        self.hashing.format()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn buckets(&self) -> u32 {
        self.buckets
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fingerprint::FingerprintKey;

    #[test]
    fn slot_tags_are_stable() {
        let tags = slot_tags();
        assert_eq!(tags.len(), usize::from(CLUSTER_SLOTS));
        for (slot, tag) in tags.iter().enumerate() {
            assert_eq!(usize::from(key_slot(tag.to_string().as_bytes())), slot);
        }
        let l = Layout::new("nl:", 10, Hashing::Unkeyed);
        for slot in [0, 1, 5460, 5461, 10922, 16383] {
            let key = l.shard_marker_key(slot);
            assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        }
        // Pinned: these are key names in existing keyspaces.
        assert_eq!(l.shard_marker_key(0), "nl:{3560}shard");
        assert_eq!(l.shard_marker_key(16383), "nl:{39296}shard");
    }

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

    /// A keyed hashing (format 2) under a fixed test key, for the tests of every part.
    pub(super) fn keyed() -> Hashing {
        Hashing::Keyed(
            FingerprintKey::from_hex(
                "7f3a9c2e5b7d4f10aa55e0c1d2b3a49586f7e8d9cabbccddeeff001122334455",
                "test",
            )
            .unwrap(),
        )
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
}
