//! Value normalisation: equal identities must hash equal however they were typed, so every
//! value is reduced to one canonical text before it is fingerprinted. The rules (API.md):
//!
//! | dimension            | rule                                                             | canonical form        |
//! |----------------------|------------------------------------------------------------------|-----------------------|
//! | `phone`              | trim; drop spaces, `-`, `(`, `)`; optional leading `+`; 5–20 digits | `+8613800000000`   |
//! | `id_card`            | trim; ASCII upper-case; `^[0-9A-Z]{4,32}$`                        | `11010519491231002X`  |
//! | `imei`               | trim; drop spaces and `-`; 14–16 digits                           | `490154203237518`     |
//! | `wifi_mac`           | 12 hex digits as `aa:bb:..`, `aa-bb-..`, `aabb.ccdd.eeff` or bare  | `aa:bb:cc:dd:ee:ff`   |
//! | `ip`                 | IPv4/IPv6; IPv4-mapped IPv6 becomes IPv4; entries may be CIDR ranges with host bits masked off | `10.1.2.0/24`, `2001:db8::1` |
//! | `email`              | see *E-mail* below                                               | `john@example.com`    |
//! | `uid`, `device`, custom | trim; non-empty; ≤ 256 bytes; case-sensitive                   | as trimmed            |
//!
//! The `+` of a phone number is kept: `+8613800000000` and `8613800000000` are different
//! strings as dialled, and guessing a country code would make two different numbers equal.
//! Messages never echo the raw value: they may end up in logs.
//!
//! # Entries that match more than one value
//! Entries (never checks) may list a set of values, each stored as one entry and found by a
//! probe per length in use (`store::layout`, *Matching entries*), never by a scan:
//!
//! | dimension | entry | lists | canonical form |
//! |---|---|---|---|
//! | `ip` | `10.1.2.77/24` | every address in the network | `10.1.2.0/24` |
//! | `phone` | `+86 170*`: a phone's normalisation, then 1–19 digits (after an optional `+`) and a final `*` | every phone whose canonical form starts with `+86170` | `+86170*` |
//! | `email` | `@Example.COM`: `@`, then a domain normalised as an address's | every address at that domain or any subdomain | `@example.com` |
//!
//! A segment keeps its `+` like a phone: `170*` matches `17012345678`, not `+8617012345678`.
//! A `*` anywhere but at the end, a segment of no digit or of more than 19, and a domain entry
//! of more than [`MAX_DOMAIN_LABELS`] labels (a check never probes it) are refused.
//!
//! # E-mail
//! An address is trimmed and must hold exactly one `@`; the local part (before it) is 1–64
//! bytes with no whitespace or control character; then:
//!
//! 1. the domain is mapped to its IDNA ASCII form (UTS #46 with the STD3 rules: lower-cased,
//!    Unicode mapped and Punycode-encoded: `Bücher.Example` → `xn--bcher-kva.example`), one
//!    trailing `.` dropped; it must be 1–253 bytes in that form with at least one dot, every
//!    label 1–63 bytes, no label starting or ending with `-`; `googlemail.com` is written
//!    `gmail.com`;
//! 2. a `+tag` is removed from the local part (`john+news` → `john`), and at `gmail.com` its
//!    dots too (`j.o.h.n` → `john`);
//! 3. the local part is lower-cased (Unicode), and must still be 1–64 bytes.
//!
//! Steps 2 and 3 run in that order so that a normalised address normalises to itself.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::code::ErrorCode;
use super::dimension::Dimension;
use super::error::ValidationError;
use super::rules::{self, Norm};

/// Longest opaque value (uid, device, custom dimensions), in bytes.
pub const MAX_TEXT_LEN: usize = 256;
/// Most digits of a phone segment (`170*`): one fewer than the longest phone.
pub const MAX_SEGMENT_DIGITS: usize = 19;
/// Most labels of a domain entry (`@a.example.com` has 3): a check probes the suffixes of an
/// address's domain of up to this many labels.
pub const MAX_DOMAIN_LABELS: usize = 10;
/// Longest local part of an address, in bytes (RFC 5321).
pub const MAX_LOCAL_LEN: usize = 64;
/// Longest domain, in bytes of its ASCII form (RFC 1035).
pub const MAX_DOMAIN_LEN: usize = 253;
/// Longest domain as typed that is converted at all: IDNA mapping may drop characters, so the
/// typed form may be longer than the ASCII one, but not without bound.
const MAX_DOMAIN_INPUT_LEN: usize = 1024;

/// A normalised value, ready to be fingerprinted. `Display` gives the canonical text, which
/// is what is hashed: the four kinds never share a canonical text within a dimension.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    Text(String),
    Ip(IpValue),
    /// A phone segment (entries only): the normalised prefix, without its `*` (shown with it).
    PhoneSegment(String),
    /// An e-mail domain entry (entries only): the ASCII domain, without its `@` (shown with it).
    EmailDomain(String),
}

/// IPv4 or IPv6.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn max_prefix(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    pub fn tag(self) -> u8 {
        match self {
            IpFamily::V4 => 4,
            IpFamily::V6 => 6,
        }
    }
}

/// An address or a network: `addr` has its host bits cleared, `prefix` is the full length for
/// a single address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpValue {
    addr: IpAddr,
    prefix: u8,
}

impl IpValue {
    /// The network of `prefix` bits containing `addr` (host bits cleared).
    pub fn network(addr: IpAddr, prefix: u8) -> Self {
        let addr = match addr {
            IpAddr::V4(a) => {
                let bits = u32::from(a);
                let mask = if prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(prefix))
                };
                IpAddr::V4(Ipv4Addr::from(bits & mask))
            }
            IpAddr::V6(a) => {
                let bits = u128::from(a);
                let mask = if prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(prefix))
                };
                IpAddr::V6(Ipv6Addr::from(bits & mask))
            }
        };
        Self { addr, prefix }
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    pub fn family(&self) -> IpFamily {
        match self.addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// A range (CIDR) rather than a single address.
    pub fn is_range(&self) -> bool {
        self.prefix < self.family().max_prefix()
    }

    /// The range of `prefix` bits that contains this address.
    pub fn within(&self, prefix: u8) -> Self {
        Self::network(self.addr, prefix)
    }
}

impl fmt::Display for IpValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_range() {
            write!(f, "{}/{}", self.addr, self.prefix)
        } else {
            write!(f, "{}", self.addr)
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Text(s) => f.write_str(s),
            Value::Ip(ip) => ip.fmt(f),
            Value::PhoneSegment(s) => write!(f, "{s}*"),
            Value::EmailDomain(d) => write!(f, "@{d}"),
        }
    }
}

fn invalid(dimension: &Dimension, why: &str) -> ValidationError {
    ValidationError::new(
        ErrorCode::InvalidValue,
        format!("invalid {dimension}: {why}"),
    )
}

impl Value {
    /// Normalises the value of a list entry under the rules of a new keyspace, phones read in
    /// the default region (tests and examples; the service uses `parse_entry_with`).
    pub fn parse_entry(dimension: &Dimension, raw: &str) -> Result<Self, ValidationError> {
        Self::parse(dimension, raw, true, Norm::LATEST)
    }

    /// Normalises a value to check under the rules of a new keyspace (see `parse_entry`).
    pub fn parse_check(dimension: &Dimension, raw: &str) -> Result<Self, ValidationError> {
        Self::parse(dimension, raw, false, Norm::LATEST)
    }

    /// Normalises the value of a list entry under `norm` (its keyspace's rules, its
    /// sandbox's phone region): IP ranges, phone segments and e-mail domains are allowed.
    pub fn parse_entry_with(
        dimension: &Dimension,
        raw: &str,
        norm: Norm,
    ) -> Result<Self, ValidationError> {
        Self::parse(dimension, raw, true, norm)
    }

    /// Normalises a value to check under `norm`: a single IP address, phone or address,
    /// never a range, segment or domain.
    pub fn parse_check_with(
        dimension: &Dimension,
        raw: &str,
        norm: Norm,
    ) -> Result<Self, ValidationError> {
        Self::parse(dimension, raw, false, norm)
    }

    fn parse(
        dimension: &Dimension,
        raw: &str,
        in_entry: bool,
        norm: Norm,
    ) -> Result<Self, ValidationError> {
        let raw = raw.trim();
        let v2 = norm.canonical_identities();
        match dimension {
            Dimension::Phone => match raw.strip_suffix('*') {
                Some(_) if !in_entry => {
                    Err("expected a single phone; segments (170*) are allowed only in entries")
                }
                Some(prefix) if v2 => phone_segment(prefix)
                    .map(|s| rules::segment_e164(s, norm.region()))
                    .and_then(|s| {
                        if s.len() - 1 > MAX_SEGMENT_DIGITS {
                            Err("a segment is at most 19 digits with its country code")
                        } else {
                            Ok(Value::PhoneSegment(s))
                        }
                    }),
                Some(prefix) => phone_segment(prefix).map(Value::PhoneSegment),
                None if v2 => {
                    phone(raw).map(|digits| Value::Text(rules::phone_e164(norm.region(), digits)))
                }
                None => phone(raw).map(Value::Text),
            },
            Dimension::Email => email(raw, in_entry),
            Dimension::IdCard if v2 => id_card(raw).and_then(rules::id_card_v2).map(Value::Text),
            Dimension::IdCard => id_card(raw).map(Value::Text),
            Dimension::Imei if v2 => imei(raw).and_then(rules::imei_v2).map(Value::Text),
            Dimension::Imei => imei(raw).map(Value::Text),
            Dimension::WifiMac => wifi_mac(raw).map(Value::Text),
            Dimension::Ip => ip(raw, in_entry).map(Value::Ip),
            Dimension::Uid | Dimension::Device | Dimension::Custom(_) => text(raw).map(Value::Text),
        }
        .map_err(|why| invalid(dimension, why))
    }

    pub fn as_ip(&self) -> Option<&IpValue> {
        match self {
            Value::Ip(ip) => Some(ip),
            _ => None,
        }
    }

    /// The segment of this phone's first `len` characters (its `+` included), if the phone is
    /// that long and the segment holds a digit: what a check probes for a segment length in
    /// use. `None` for anything but a plain value.
    pub fn phone_segment(&self, len: usize) -> Option<Value> {
        let Value::Text(phone) = self else {
            return None;
        };
        let prefix = phone.get(..len)?;
        (prefix.bytes().any(|b| b.is_ascii_digit())).then(|| Value::PhoneSegment(prefix.to_owned()))
    }

    /// The domain entry this address's domain would match with its last `labels` labels
    /// (`a@x.b.example.com`, 2 → `@example.com`), if the domain has that many: what a check
    /// probes for a domain length in use. `None` for anything but an address.
    pub fn email_domain_suffix(&self, labels: usize) -> Option<Value> {
        let Value::Text(address) = self else {
            return None;
        };
        let (_, domain) = address.rsplit_once('@')?;
        let total = domain.split('.').count();
        if labels < 2 || labels > total {
            return None;
        }
        let start = match total - labels {
            0 => 0,
            skip => domain.match_indices('.').nth(skip - 1)?.0 + 1,
        };
        let suffix = &domain[start..];
        Some(Value::EmailDomain(suffix.to_owned()))
    }
}

fn phone(raw: &str) -> Result<String, &'static str> {
    phone_digits(
        raw,
        5..=20,
        "expected 5-20 digits, optionally with a leading +, after removing spaces, -, ( and )",
    )
}

/// A phone's characters with spaces, `-`, `(` and `)` removed: an optional leading `+`, then
/// `digits` digits; `why` otherwise. A `*` is refused here: only a segment ends with one.
fn phone_digits(
    raw: &str,
    digits: std::ops::RangeInclusive<usize>,
    why: &'static str,
) -> Result<String, &'static str> {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        match c {
            ' ' | '-' | '(' | ')' => {}
            '+' if out.is_empty() => out.push('+'),
            '0'..='9' => out.push(c),
            '*' => return Err("a * may only end a segment (170*)"),
            _ => return Err(why),
        }
    }
    let n = out.len() - usize::from(out.starts_with('+'));
    if !digits.contains(&n) {
        return Err(why);
    }
    Ok(out)
}

/// The prefix of a phone segment (what precedes its `*`), normalised as a phone.
fn phone_segment(prefix: &str) -> Result<String, &'static str> {
    phone_digits(
        prefix,
        1..=MAX_SEGMENT_DIGITS,
        "a segment is 1-19 digits, optionally after a leading +, then a final * (170*, +86170*); spaces, -, ( and ) are removed",
    )
}

/// An address (`Text`) or, in entries, a domain (`@example.com`); see the module docs.
fn email(raw: &str, allow_domain: bool) -> Result<Value, &'static str> {
    if let Some(domain) = raw.strip_prefix('@') {
        if !allow_domain {
            return Err("expected an address; domains (@example.com) are allowed only in entries");
        }
        if domain.contains('@') {
            return Err("expected exactly one @");
        }
        let domain = email_domain(domain)?;
        if domain.split('.').count() > MAX_DOMAIN_LABELS {
            return Err("a domain entry has at most 10 labels (checks probe no longer suffix)");
        }
        return Ok(Value::EmailDomain(domain));
    }
    let mut parts = raw.split('@');
    let (Some(local), Some(domain), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected exactly one @");
    };
    if local.is_empty() || local.len() > MAX_LOCAL_LEN {
        return Err("the local part (before @) must be 1-64 bytes");
    }
    if local.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the local part must not hold whitespace or control characters");
    }
    let domain = email_domain(domain)?;
    let untagged = local.split('+').next().unwrap_or_default();
    let local = if domain == "gmail.com" {
        untagged.replace('.', "").to_lowercase()
    } else {
        untagged.to_lowercase()
    };
    if local.is_empty() {
        return Err("the local part is empty once its +tag (and at gmail.com its dots) is removed");
    }
    if local.len() > MAX_LOCAL_LEN {
        return Err("the local part must be 1-64 bytes");
    }
    Ok(Value::Text(format!("{local}@{domain}")))
}

/// A domain's normalised ASCII form (see the module docs).
fn email_domain(raw: &str) -> Result<String, &'static str> {
    use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};
    if raw.len() > MAX_DOMAIN_INPUT_LEN {
        return Err("the domain is longer than 253 bytes");
    }
    let raw = raw.strip_suffix('.').unwrap_or(raw);
    if raw.is_empty() {
        return Err("the domain (after @) is empty");
    }
    let ascii = Uts46::new()
        .to_ascii(
            raw.as_bytes(),
            AsciiDenyList::STD3,
            Hyphens::CheckFirstLast,
            DnsLength::Ignore,
        )
        .map_err(|_| "the domain has no IDNA ASCII form (letters, digits and - in labels, no - at either end of one)")?;
    if ascii.len() > MAX_DOMAIN_LEN {
        return Err("the domain is longer than 253 bytes");
    }
    if !ascii.contains('.') {
        return Err("the domain needs at least one dot");
    }
    if ascii.split('.').any(|l| l.is_empty() || l.len() > 63) {
        return Err("every label of the domain must be 1-63 bytes");
    }
    Ok(match &*ascii {
        "googlemail.com" => "gmail.com".to_owned(),
        _ => ascii.into_owned(),
    })
}

fn id_card(raw: &str) -> Result<String, &'static str> {
    let up = raw.to_ascii_uppercase();
    if (4..=32).contains(&up.len())
        && up
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    {
        Ok(up)
    } else {
        Err("expected 4-32 characters of 0-9 and A-Z")
    }
}

fn imei(raw: &str) -> Result<String, &'static str> {
    let out: String = raw.chars().filter(|&c| c != ' ' && c != '-').collect();
    if (14..=16).contains(&out.len()) && out.bytes().all(|b| b.is_ascii_digit()) {
        Ok(out)
    } else {
        Err("expected 14-16 digits after removing spaces and -")
    }
}

fn wifi_mac(raw: &str) -> Result<String, &'static str> {
    const WHY: &str = "expected 12 hex digits as aa:bb:cc:dd:ee:ff, aa-bb-cc-dd-ee-ff, aabb.ccdd.eeff or aabbccddeeff";
    let groups: Vec<&str> = if raw.contains(':') {
        raw.split(':').collect()
    } else if raw.contains('-') {
        raw.split('-').collect()
    } else if raw.contains('.') {
        raw.split('.').collect()
    } else {
        vec![raw]
    };
    let group_len = 12 / groups.len().max(1);
    let shape_ok = match groups.len() {
        1 => true,
        3 => raw.contains('.'),
        6 => !raw.contains('.'),
        _ => false,
    };
    if !shape_ok
        || groups
            .iter()
            .any(|g| g.len() != group_len || !g.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err(WHY);
    }
    let hex: Vec<u8> = groups.concat().to_ascii_lowercase().into_bytes();
    let mut out = String::with_capacity(17);
    for (i, pair) in hex.chunks(2).enumerate() {
        if i > 0 {
            out.push(':');
        }
        out.push(pair[0] as char);
        out.push(pair[1] as char);
    }
    Ok(out)
}

fn ip(raw: &str, allow_range: bool) -> Result<IpValue, &'static str> {
    let (addr_text, prefix_text) = match raw.split_once('/') {
        Some(_) if !allow_range => {
            return Err("expected a single address; ranges are allowed only in entries");
        }
        Some((a, p)) => (a, Some(p)),
        None => (raw, None),
    };
    let addr: IpAddr = addr_text
        .parse()
        .map_err(|_| "expected an IPv4 or IPv6 address (or, in entries, a CIDR range)")?;
    let max = match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    let prefix = match prefix_text {
        None => max,
        Some(p) => {
            if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err("expected a prefix length after /");
            }
            let p: u8 = p.parse().map_err(|_| "expected a prefix length after /")?;
            if p > max {
                return Err("prefix length longer than the address");
            }
            p
        }
    };
    // IPv4-mapped IPv6 (::ffff:a.b.c.d) is the IPv4 address; a mapped range of at least /96
    // is the IPv4 range of prefix - 96.
    if let IpAddr::V6(v6) = addr
        && let Some(v4) = v6.to_ipv4_mapped()
        && prefix >= 96
    {
        return Ok(IpValue::network(IpAddr::V4(v4), prefix - 96));
    }
    Ok(IpValue::network(addr, prefix))
}

fn text(raw: &str) -> Result<String, &'static str> {
    if raw.is_empty() {
        return Err("must not be empty");
    }
    if raw.len() > MAX_TEXT_LEN {
        return Err("longer than 256 bytes");
    }
    Ok(raw.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The table of the module docs: rules 1 (`domain::rules` has rules 2's own tests).
    fn v1_entry(d: &Dimension, raw: &str) -> Result<Value, ValidationError> {
        Value::parse_entry_with(d, raw, Norm::V1)
    }

    fn v1_check(d: &Dimension, raw: &str) -> Result<Value, ValidationError> {
        Value::parse_check_with(d, raw, Norm::V1)
    }

    fn entry(d: Dimension, raw: &str) -> Result<String, ValidationError> {
        v1_entry(&d, raw).map(|v| v.to_string())
    }

    #[test]
    fn table() {
        use Dimension::*;
        let cases: &[(Dimension, &str, Option<&str>)] = &[
            (Phone, "+86 138-0000-0000", Some("+8613800000000")),
            (Phone, " (010) 1234-5678 ", Some("01012345678")),
            (Phone, "(+86) 138-0000-0000", Some("+8613800000000")),
            (Phone, "1+2345678", None),
            (Phone, "++12345678", None),
            (Phone, "1234", None),
            (Phone, "12+345678", None),
            (Phone, "123456789012345678901", None),
            (Phone, "138 0000 000a", None),
            (IdCard, " 11010519491231002x ", Some("11010519491231002X")),
            (IdCard, "abc", None),
            (IdCard, "1101-0519", None),
            (Imei, "49-015420-323751-8", Some("490154203237518")),
            (Imei, "4901542032375", None),
            (Imei, "49015420323751x", None),
            (WifiMac, "AA-BB-CC-DD-EE-FF", Some("aa:bb:cc:dd:ee:ff")),
            (WifiMac, "aabb.ccdd.eeff", Some("aa:bb:cc:dd:ee:ff")),
            (WifiMac, "AABBCCDDEEFF", Some("aa:bb:cc:dd:ee:ff")),
            (WifiMac, "aa:bb:cc:dd:ee", None),
            (WifiMac, "aa:bb-cc:dd:ee:ff", None),
            (WifiMac, "gg:bb:cc:dd:ee:ff", None),
            (Ip, "10.1.2.3", Some("10.1.2.3")),
            (Ip, "10.1.2.77/24", Some("10.1.2.0/24")),
            (Ip, "10.1.2.3/32", Some("10.1.2.3")),
            (Ip, "0.0.0.0/0", Some("0.0.0.0/0")),
            (Ip, "2001:DB8:0:0::1", Some("2001:db8::1")),
            (Ip, "2001:db8:1:2::/48", Some("2001:db8:1::/48")),
            (Ip, "::ffff:10.1.2.3", Some("10.1.2.3")),
            (Ip, "::ffff:10.1.2.3/120", Some("10.1.2.0/24")),
            (Ip, "10.1.2.3/33", None),
            (Ip, "10.1.2.3/", None),
            (Ip, "10.1.2.3/+8", None),
            (Ip, "010.1.2.3", None),
            (Ip, "fe80::1%eth0", None),
            (Uid, "  u1 ", Some("u1")),
            (Uid, "   ", None),
            (Device, &"d".repeat(257), None),
            (Custom("merchant".into()), "商户 42", Some("商户 42")),
            // Phone segments (entries only).
            (Phone, "170*", Some("170*")),
            (Phone, " +86 (170) *", Some("+86170*")),
            (Phone, "1*", Some("1*")),
            (Phone, "1234567890123456789*", Some("1234567890123456789*")),
            (Phone, "12345678901234567890*", None),
            (Phone, "*", None),
            (Phone, "+*", None),
            (Phone, "1*2", None),
            (Phone, "17**", None),
            (Phone, "17a*", None),
            // E-mail addresses and domains.
            (
                Email,
                " John.Smith@Example.COM ",
                Some("john.smith@example.com"),
            ),
            (Email, "john+news@example.com", Some("john@example.com")),
            (Email, "J.O.H.N+x@GoogleMail.com", Some("john@gmail.com")),
            (Email, "j.o.h.n@gmail.com.", Some("john@gmail.com")),
            (
                Email,
                "j.o.h.n@mail.gmail.com",
                Some("j.o.h.n@mail.gmail.com"),
            ),
            (
                Email,
                "user@Bücher.Example",
                Some("user@xn--bcher-kva.example"),
            ),
            (
                Email,
                "user@xn--bcher-kva.example",
                Some("user@xn--bcher-kva.example"),
            ),
            (Email, "ÉLODIE@example.fr", Some("élodie@example.fr")),
            (Email, "@Example.com", Some("@example.com")),
            (
                Email,
                "@a.b.c.d.e.f.g.h.example.com",
                Some("@a.b.c.d.e.f.g.h.example.com"),
            ),
            (Email, "@a.b.c.d.e.f.g.h.i.example.com", None),
            (Email, "@googlemail.com", Some("@gmail.com")),
            (Email, "a@b@example.com", None),
            (Email, "@b@example.com", None),
            (Email, "john.example.com", None),
            (Email, "john@localhost", None),
            (Email, "@com", None),
            (Email, "@", None),
            (Email, "john@", None),
            (Email, "@.", None),
            (Email, "+tag@example.com", None),
            (Email, "...@gmail.com", None),
            (Email, "jo hn@example.com", None),
            (Email, "john@exa mple.com", None),
            (Email, "john@-example.com", None),
            (Email, "john@example..com", None),
            (Email, "john@[10.1.2.3]", None),
            (Email, "john@exa_mple.com", None),
            (
                Email,
                &format!("{}@example.com", "a".repeat(64)),
                Some(&*format!("{}@example.com", "a".repeat(64))),
            ),
            (Email, &format!("{}@example.com", "a".repeat(65)), None),
            (Email, &format!("{}+tag@example.com", "a".repeat(61)), None),
            (
                Email,
                &format!("a@{}.com", "b".repeat(63)),
                Some(&*format!("a@{}.com", "b".repeat(63))),
            ),
            (Email, &format!("a@{}.com", "b".repeat(64)), None),
            (
                Email,
                &format!("a@{}com", "b.".repeat(125)),
                Some(&*format!("a@{}com", "b.".repeat(125))),
            ),
            (Email, &format!("a@{}com", "b.".repeat(126)), None),
            (Email, "a@xn--a.com", None),
        ];
        for (d, raw, want) in cases {
            let got = entry(d.clone(), raw);
            match want {
                Some(w) => assert_eq!(got.as_deref(), Ok(*w), "{d} {raw:?}"),
                None => assert!(got.is_err(), "{d} {raw:?} should be rejected, got {got:?}"),
            }
        }
    }

    #[test]
    fn checks_reject_segments_and_domains() {
        for (d, raw, what) in [
            (Dimension::Phone, "170*", "segments"),
            (Dimension::Email, "@example.com", "domains"),
        ] {
            let err = v1_check(&d, raw).unwrap_err();
            assert_eq!(err.code, "invalid_value");
            assert!(err.message.contains(what), "{}", err.message);
            assert!(v1_entry(&d, raw).is_ok());
        }
    }

    #[test]
    fn segment_and_domain_probes() {
        let phone = v1_check(&Dimension::Phone, "+8617012345678").unwrap();
        assert_eq!(phone.phone_segment(6).unwrap().to_string(), "+86170*");
        assert_eq!(
            phone.phone_segment(14).unwrap().to_string(),
            "+8617012345678*"
        );
        assert_eq!(phone.phone_segment(15), None, "longer than the phone");
        assert_eq!(phone.phone_segment(1), None, "a + alone is no segment");
        let plain = v1_check(&Dimension::Phone, "17012345678").unwrap();
        assert_eq!(plain.phone_segment(1).unwrap().to_string(), "1*");

        let address = v1_check(&Dimension::Email, "j@a.b.example.com").unwrap();
        let suffixes: Vec<String> = (0..=6)
            .filter_map(|n| address.email_domain_suffix(n))
            .map(|v| v.to_string())
            .collect();
        assert_eq!(
            suffixes,
            ["@example.com", "@b.example.com", "@a.b.example.com"],
            "two labels and up, never the top-level domain alone"
        );
        // A probe is exactly the entry that lists it.
        for s in &suffixes {
            assert_eq!(v1_entry(&Dimension::Email, s).unwrap().to_string(), *s);
        }
        assert_eq!(Value::Text("x".into()).email_domain_suffix(2), None);
    }

    #[test]
    fn checks_reject_ranges() {
        let err = v1_check(&Dimension::Ip, "10.0.0.0/8").unwrap_err();
        assert_eq!(err.code, "invalid_value");
        assert!(err.message.contains("ranges"), "{}", err.message);
        assert!(v1_check(&Dimension::Ip, "10.0.0.1").is_ok());
    }

    #[test]
    fn range_probe() {
        let Value::Ip(ip) = v1_check(&Dimension::Ip, "2001:db8:1:2::9").unwrap() else {
            panic!()
        };
        assert_eq!(ip.within(48).to_string(), "2001:db8:1::/48");
        assert_eq!(ip.within(0).to_string(), "::/0");
        assert!(!ip.is_range());
    }

    #[test]
    fn errors_do_not_echo_the_value() {
        let err = v1_entry(&Dimension::Phone, "secret-13800000000x").unwrap_err();
        assert!(!err.message.contains("13800000000"), "{}", err.message);
        assert!(err.message.starts_with("invalid phone"), "{}", err.message);
    }
}
