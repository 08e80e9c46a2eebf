//! What a write tells every instance about what it changed: the message on the channel
//! `<prefix>inv` and its wire encoding, which builds before and after the local tier both read.
//!
//! # Invalidation
//! Every write publishes an [`Invalidation`] on the channel `<prefix>inv` so every instance
//! brings what it holds locally up to date. The message is a version byte (1), then the
//! postcard encoding of the message as builds before the local tier defined it (`Keys`,
//! `Scopes`, `Bulk`, `Definitions`), then, for a write of entries, a trailer:
//!
//! ```text
//! 01 <postcard Keys(fields changed)> [ <tag> <postcard Vec<Option<u32>>: each field's new code, None = removed> ]
//! ```
//!
//! A put or delete of one definition names it the same way, behind `Definitions`:
//!
//! ```text
//! 01 <postcard Definitions> [ 01 <postcard (kind, id)> ]
//! ```
//!
//! so an older instance reloads every definition, as it always did, and a new one reads only
//! the one named.
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

use serde::{Deserialize, Serialize};

use super::{EntryKey, Layout};
use crate::store::DefinitionKind;

/// The version byte of an [`Invalidation`] message: the message encoding, not the layout
/// format, so instances of either format (and of older builds) still understand each other.
const MESSAGE_VERSION: u8 = 1;

impl Layout {
    pub fn channel(&self) -> String {
        format!("{}inv", self.prefix)
    }
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
    /// Metric or rule definitions changed: reload them all (an older writer's message).
    Definitions,
    /// This definition was put or deleted: read it again.
    Definition { kind: DefinitionKind, id: String },
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
/// The tag of the trailer that names the one definition a `Definitions` message is about:
/// postcard `(kind, id)`, the kind as `DefinitionKind::as_str`.
const TRAILER_DEFINITION: u8 = 1;

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

    /// The message of a put or delete of one definition.
    pub fn definition(kind: DefinitionKind, id: &str) -> Self {
        Invalidation::Definition {
            kind,
            id: id.to_owned(),
        }
    }

    /// The message body: the version byte, postcard, and for `Changes` the codes trailer, for
    /// `Definition` the one naming it.
    pub fn encode(&self) -> Vec<u8> {
        let (wire, trailer) = match self {
            Invalidation::Keys(keys) => (Wire::Keys(keys.clone()), None),
            Invalidation::Changes { changes, atomic } => (
                Wire::Keys(changes.iter().map(|(k, _)| *k).collect()),
                Some((
                    if *atomic {
                        TRAILER_CODES_ATOMIC
                    } else {
                        TRAILER_CODES
                    },
                    postcard::to_stdvec(&changes.iter().map(|(_, c)| *c).collect::<Vec<_>>())
                        .expect("encoding to a Vec cannot fail"),
                )),
            ),
            Invalidation::Scopes(s) => (Wire::Scopes(s.clone()), None),
            Invalidation::Bulk => (Wire::Bulk, None),
            Invalidation::Definitions => (Wire::Definitions, None),
            Invalidation::Definition { kind, id } => (
                Wire::Definitions,
                Some((
                    TRAILER_DEFINITION,
                    postcard::to_stdvec(&(kind.as_str(), id))
                        .expect("encoding to a Vec cannot fail"),
                )),
            ),
        };
        let mut out = vec![MESSAGE_VERSION];
        out.extend(postcard::to_stdvec(&wire).expect("encoding to a Vec cannot fail"));
        if let Some((tag, trailer)) = trailer {
            out.push(tag);
            out.extend(trailer);
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
            Wire::Definitions => match trailer.split_first() {
                Some((&TRAILER_DEFINITION, body)) => postcard::from_bytes::<(&str, String)>(body)
                    .ok()
                    .and_then(|(kind, id)| Some((DefinitionKind::parse(kind)?, id)))
                    .map_or(Invalidation::Definitions, |(kind, id)| {
                        Invalidation::Definition { kind, id }
                    }),
                _ => Invalidation::Definitions,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Invalidation::definition(DefinitionKind::Metric, "dev_tx_7d"),
            Invalidation::definition(DefinitionKind::Rule, "r"),
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
