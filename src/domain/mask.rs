//! How a value appears to an operator in the audit trail: enough to recognise it, never enough
//! to recover it. Raw personal identifiers never leave the process in logs or audit records.
//!
//! | dimension  | shown                                  | example            |
//! |------------|----------------------------------------|--------------------|
//! | phone      | first 3 and last 4 digits (+ kept); a valid E.164 number (rules 2) its country code, then the national number's first 3 and last 4 | `138****0000`, `+86138****0000` |
//! | id_card    | first 4 and last 4                     | `1101**********002X` |
//! | imei       | first 6 (part of the model code), last 2 | `490154*******18` |
//! | wifi_mac   | the vendor (OUI) half                  | `aa:bb:cc:**:**:**` |
//! | ip         | IPv4 without its last octet, IPv6 /48; a range of at most /24 (/48) as is | `10.1.2.*` |
//! | phone segment | the first 3 digits (+ kept), each further digit `*`, then its `*` | `170*`, `+861***` (`+86170*`) |
//! | email      | the local part's first character and `***` (whatever its length), the domain | `j***@example.com` |
//! | email domain entry | as is: it names an organisation's domain, as a /24 names a network | `@example.com` |
//! | others     | first 2 and last 2 characters of 8 or more, else all masked | `u1****89` |
//!
//! A segment of 3 digits or fewer is thus shown whole: it lists at least 10^8 numbers of an
//! 11-digit plan. A longer one shows no more of itself than a phone's mask shows of a phone.

use super::dimension::Dimension;
use super::value::Value;

fn keep_ends(s: &str, head: usize, tail: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= head + tail {
        return "*".repeat(chars.len());
    }
    let mut out: String = chars[..head].iter().collect();
    out.extend(std::iter::repeat_n('*', chars.len() - head - tail));
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// The operator-facing masked form of a normalised value.
pub fn mask_value(dimension: &Dimension, value: &Value) -> String {
    match (dimension, value) {
        (_, Value::Ip(ip)) => {
            use std::net::IpAddr;
            match ip.addr() {
                IpAddr::V4(_) if ip.prefix() <= 24 => ip.to_string(),
                IpAddr::V4(a) => {
                    let o = a.octets();
                    format!("{}.{}.{}.*", o[0], o[1], o[2])
                }
                IpAddr::V6(_) if ip.prefix() <= 48 => ip.to_string(),
                IpAddr::V6(_) => format!("{}/48*", ip.within(48).addr()),
            }
        }
        (_, Value::PhoneSegment(s)) => {
            let (plus, digits) = s.strip_prefix('+').map_or(("", s.as_str()), |d| ("+", d));
            let shown = digits.len().min(3);
            format!(
                "{plus}{}{}*",
                &digits[..shown],
                "*".repeat(digits.len() - shown)
            )
        }
        (_, Value::EmailDomain(_)) => value.to_string(),
        (Dimension::Email, Value::Text(s)) => match s.rsplit_once('@') {
            Some((local, domain)) => {
                let first: String = local.chars().take(1).collect();
                format!("{first}***@{domain}")
            }
            None => keep_ends(s, 2, 2),
        },
        (Dimension::Phone, Value::Text(s)) => {
            let (plus, digits) = s.strip_prefix('+').map_or(("", s.as_str()), |d| ("+", d));
            // A valid E.164 number: its country code shown, its national number as a
            // national number's mask (so `+8613800000000` shows what `13800000000` did).
            let code = (!plus.is_empty())
                .then(|| phonenumber::parse(None, s).ok())
                .flatten()
                .filter(phonenumber::is_valid)
                .map(|n| n.code().value().to_string())
                .filter(|c| digits.starts_with(c.as_str()));
            match code {
                Some(c) => format!("+{c}{}", keep_ends(&digits[c.len()..], 3, 4)),
                None => format!("{plus}{}", keep_ends(digits, 3, 4)),
            }
        }
        (Dimension::IdCard, Value::Text(s)) => keep_ends(s, 4, 4),
        (Dimension::Imei, Value::Text(s)) => keep_ends(s, 6, 2),
        (Dimension::WifiMac, Value::Text(s)) => format!("{}:**:**:**", &s[..8.min(s.len())]),
        (_, Value::Text(s)) if s.chars().count() >= 8 => keep_ends(s, 2, 2),
        (_, Value::Text(s)) => "*".repeat(s.chars().count()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(d: Dimension, raw: &str) -> String {
        let v = Value::parse_entry_with(&d, raw, crate::domain::Norm::V1).unwrap();
        mask_value(&d, &v)
    }

    #[test]
    fn masks() {
        use Dimension::*;
        for (d, raw, masked) in [
            (Phone, "13800000000", "138****0000"),
            (Phone, "+86 138 0000 1234", "+86138****1234"),
            (Phone, "+861380000", "+861**0000"), // not a valid number
            (IdCard, "11010519491231002X", "1101**********002X"),
            (Imei, "490154203237518", "490154*******18"),
            (WifiMac, "AA-BB-CC-DD-EE-FF", "aa:bb:cc:**:**:**"),
            (Ip, "10.1.2.3", "10.1.2.*"),
            (Ip, "10.1.0.0/16", "10.1.0.0/16"),
            (Ip, "2001:db8:1:2::1", "2001:db8:1::/48*"),
            (Uid, "user-123456789", "us**********89"),
            (Device, "d1", "**"),
            (Phone, "170*", "170*"),
            (Phone, "1703*", "170**"),
            (Phone, "+86 170*", "+861***"),
            (Phone, "1*", "1*"),
            (Email, "John.Smith+news@Example.COM", "j***@example.com"),
            (Email, "Élodie@example.fr", "é***@example.fr"),
            (Email, "@Example.com", "@example.com"),
            (Email, "a@example.com", "a***@example.com"), // length hidden
        ] {
            assert_eq!(m(d, raw), masked, "{raw}");
        }
        // Rules 2 write every valid phone in E.164: the national number's mask after +86.
        let e164 = Value::parse_entry(&Phone, "13800001234").unwrap();
        assert_eq!(mask_value(&Phone, &e164), "+86138****1234");
    }
}
