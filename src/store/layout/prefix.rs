//! Entries that match a set of values (IP ranges, phone segments, e-mail domains): how they
//! are stored like any entry, and the registry of lengths in use that makes checks find them.
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

use serde::{Deserialize, Serialize};

use super::Layout;
use crate::domain::{IpFamily, ListName, MAX_DOMAIN_LABELS, MAX_SEGMENT_DIGITS, Sandbox, Value};

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

impl Layout {
    pub fn registry_key(&self, list: &ListName, sandbox: &Sandbox) -> String {
        format!("{}p:{list}:{sandbox}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Dimension;

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
}
