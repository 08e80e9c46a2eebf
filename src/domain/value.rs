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
//! | `uid`, `device`, custom | trim; non-empty; ≤ 256 bytes; case-sensitive                   | as trimmed            |
//!
//! The `+` of a phone number is kept: `+8613800000000` and `8613800000000` are different
//! strings as dialled, and guessing a country code would make two different numbers equal.
//! Messages never echo the raw value: they may end up in logs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Dimension, ErrorCode, ValidationError};

/// Longest opaque value (uid, device, custom dimensions), in bytes.
pub const MAX_TEXT_LEN: usize = 256;

/// A normalised value, ready to be fingerprinted. `Display` gives the canonical text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    Text(String),
    Ip(IpValue),
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
    /// Normalises the value of a list entry: IP ranges are allowed.
    pub fn parse_entry(dimension: &Dimension, raw: &str) -> Result<Self, ValidationError> {
        Self::parse(dimension, raw, true)
    }

    /// Normalises a value to check: a single IP address, never a range.
    pub fn parse_check(dimension: &Dimension, raw: &str) -> Result<Self, ValidationError> {
        Self::parse(dimension, raw, false)
    }

    fn parse(dimension: &Dimension, raw: &str, allow_range: bool) -> Result<Self, ValidationError> {
        let raw = raw.trim();
        match dimension {
            Dimension::Phone => phone(raw).map(Value::Text),
            Dimension::IdCard => id_card(raw).map(Value::Text),
            Dimension::Imei => imei(raw).map(Value::Text),
            Dimension::WifiMac => wifi_mac(raw).map(Value::Text),
            Dimension::Ip => ip(raw, allow_range).map(Value::Ip),
            Dimension::Uid | Dimension::Device | Dimension::Custom(_) => text(raw).map(Value::Text),
        }
        .map_err(|why| invalid(dimension, why))
    }

    pub fn as_ip(&self) -> Option<&IpValue> {
        match self {
            Value::Ip(ip) => Some(ip),
            Value::Text(_) => None,
        }
    }
}

fn phone(raw: &str) -> Result<String, &'static str> {
    const WHY: &str =
        "expected 5-20 digits, optionally with a leading +, after removing spaces, -, ( and )";
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        match c {
            ' ' | '-' | '(' | ')' => {}
            '+' if out.is_empty() => out.push('+'),
            '0'..='9' => out.push(c),
            _ => return Err(WHY),
        }
    }
    let digits = out.len() - usize::from(out.starts_with('+'));
    if !(5..=20).contains(&digits) {
        return Err(WHY);
    }
    Ok(out)
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

    fn entry(d: Dimension, raw: &str) -> Result<String, ValidationError> {
        Value::parse_entry(&d, raw).map(|v| v.to_string())
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
    fn checks_reject_ranges() {
        let err = Value::parse_check(&Dimension::Ip, "10.0.0.0/8").unwrap_err();
        assert_eq!(err.code, "invalid_value");
        assert!(err.message.contains("ranges"), "{}", err.message);
        assert!(Value::parse_check(&Dimension::Ip, "10.0.0.1").is_ok());
    }

    #[test]
    fn range_probe() {
        let Value::Ip(ip) = Value::parse_check(&Dimension::Ip, "2001:db8:1:2::9").unwrap() else {
            panic!()
        };
        assert_eq!(ip.within(48).to_string(), "2001:db8:1::/48");
        assert_eq!(ip.within(0).to_string(), "::/0");
        assert!(!ip.is_range());
    }

    #[test]
    fn errors_do_not_echo_the_value() {
        let err = Value::parse_entry(&Dimension::Phone, "secret-13800000000x").unwrap_err();
        assert!(!err.message.contains("13800000000"), "{}", err.message);
        assert!(err.message.starts_with("invalid phone"), "{}", err.message);
    }
}
