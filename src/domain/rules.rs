//! The normalisation rules a keyspace was made under, and what they do to phones, ID cards and
//! IMEIs (issue 29). A keyspace's fingerprints were computed under its rules and cannot be
//! recomputed (the values are not stored), so the rules are a property of the keyspace,
//! recorded in its meta (`rules`), never a setting:
//!
//! * **rules 1** (keyspaces made before issue 29): exactly the rules of `value`'s table, the
//!   phone as typed (`+` kept, digits only), any ID card of 4–32 characters, any IMEI of 14–16
//!   digits;
//! * **rules 2** (every new keyspace):
//!   - **phone**: parsed with Google's libphonenumber metadata (the `phonenumber` crate) and
//!     written in E.164: `13800138000`, `+86 138 0013 8000`, `8613800138000`,
//!     `008613800138000` and `+86 (138) 0013-8000` are all `+8613800138000` when the region
//!     is CN. A number without its country code is read in the sandbox's region
//!     (`sandbox_phone_regions`, else `phone_default_region`, default `CN`). A number the
//!     parser cannot make valid keeps the rules-1 form (digits, `+` kept: nothing accepted
//!     before is refused) and is counted (`namelist_phones_not_e164_total`). A segment
//!     (`170*`) without a `+` gets the region's calling code in front (`+86170*`), one
//!     with `00` has it replaced by `+`, one with `+` is kept as typed;
//!   - **ID card** (GB 11643): 18 characters must carry the right ISO 7064 MOD 11-2 check
//!     digit (`x` read as `X`); 15 digits with a valid birth date become the 18-character form
//!     (`19` inserted after the region code, check digit computed); a wrong check digit is an
//!     invalid value; other forms (passports and the like: not 15 or 18 characters of the
//!     card's shape) keep the rules-1 rule;
//!   - **IMEI**: 15 digits must pass Luhn; the canonical form is the 14-digit body (TAC and
//!     serial number), so an IMEI, its body and its IMEISV (16 digits: the body and a 2-digit
//!     software version) are one device; a bad Luhn digit is an invalid value.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use phonenumber::PhoneNumber;
use phonenumber::country::Id as Region;

use super::names::Sandbox;

/// The rules a new keyspace records.
pub const LATEST_RULES: u32 = 2;

/// The phone region of a sandbox without one of its own, unless configured.
pub const DEFAULT_PHONE_REGION: &str = "CN";

/// Phones read under rules 2 that the parser could not make valid (kept in the rules-1 form).
static PHONES_NOT_E164: AtomicU64 = AtomicU64::new(0);

/// How many phones were kept in the rules-1 form because they are not valid numbers.
pub fn phones_not_e164() -> u64 {
    PHONES_NOT_E164.load(Ordering::Relaxed)
}

/// How one value is normalised: its keyspace's rules and, for phones, the region of its
/// sandbox. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Norm {
    rules: u32,
    region: Region,
}

impl Norm {
    /// Rules 1: the rules of keyspaces made before issue 29.
    pub const V1: Norm = Norm {
        rules: 1,
        region: Region::CN,
    };
    /// The rules of a new keyspace with the default region.
    pub const LATEST: Norm = Norm {
        rules: LATEST_RULES,
        region: Region::CN,
    };

    pub fn rules(self) -> u32 {
        self.rules
    }

    /// Rules 2 or later: phones in E.164, ID cards and IMEIs checked.
    pub fn canonical_identities(self) -> bool {
        self.rules >= 2
    }

    /// The phone region (used under rules 2 only).
    pub fn region(self) -> Region {
        self.region
    }
}

/// Regions of phone numbers written without a country code: the default and per sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhoneRegions {
    default: Region,
    sandboxes: Arc<BTreeMap<String, Region>>,
}

impl Default for PhoneRegions {
    fn default() -> Self {
        Self {
            default: Region::CN,
            sandboxes: Arc::default(),
        }
    }
}

/// An ISO 3166 region code the phone metadata knows (`CN`, `SG`, `US`...).
pub fn parse_region(code: &str) -> Result<Region, String> {
    let up = code.trim().to_ascii_uppercase();
    let region: Region = up
        .parse()
        .map_err(|_| format!("{code:?} is not an ISO 3166 region code the phone metadata knows"))?;
    if phonenumber::metadata::DATABASE.by_id(up.as_str()).is_none() {
        return Err(format!("{code:?}: no phone metadata for this region"));
    }
    Ok(region)
}

impl PhoneRegions {
    /// `default` and per-sandbox regions, as ISO 3166 codes (errors name the bad one).
    pub fn new(default: &str, sandboxes: &BTreeMap<String, String>) -> Result<Self, String> {
        let default = parse_region(default).map_err(|e| format!("phone_default_region: {e}"))?;
        let mut map = BTreeMap::new();
        for (sandbox, code) in sandboxes {
            let region =
                parse_region(code).map_err(|e| format!("sandbox_phone_regions.{sandbox}: {e}"))?;
            map.insert(sandbox.clone(), region);
        }
        Ok(Self {
            default,
            sandboxes: Arc::new(map),
        })
    }

    /// The region of `sandbox`.
    pub fn of(&self, sandbox: &Sandbox) -> Region {
        self.sandboxes
            .get(sandbox.as_str())
            .copied()
            .unwrap_or(self.default)
    }

    /// How values of `sandbox` are normalised under `rules`.
    pub fn norm(&self, rules: u32, sandbox: &Sandbox) -> Norm {
        Norm {
            rules,
            region: self.of(sandbox),
        }
    }
}

/// A keyspace's rules and the configured phone regions: how any value of any sandbox is
/// normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub version: u32,
    pub regions: PhoneRegions,
}

impl Default for Rules {
    /// A new keyspace's rules, phones read in the default region.
    fn default() -> Self {
        Self {
            version: LATEST_RULES,
            regions: PhoneRegions::default(),
        }
    }
}

impl Rules {
    /// How values of `sandbox` are normalised.
    pub fn norm(&self, sandbox: &Sandbox) -> Norm {
        self.regions.norm(self.version, sandbox)
    }
}

/// A phone under rules 2 (`fallback`: its rules-1 form, digits with the `+` kept): E.164
/// when the parser makes it a valid number in `region` (or in the region its country code
/// names), else `fallback` itself, counted.
pub(super) fn phone_e164(region: Region, fallback: String) -> String {
    // The common spellings of a region's numbers: decided without the crate (~1 µs), and
    // without the memory below, which only a number seen again would use.
    let (e164, fallback) = match super::phone::e164(region, &typed_form(&fallback)) {
        Some(decided) => (decided, fallback),
        None => {
            let key = (region, fallback);
            let known = RECENT.get(&key);
            let e164 = known.unwrap_or_else(|| {
                let e164 = parse_e164(region, &key.1);
                RECENT.insert(key.clone(), e164.clone());
                e164
            });
            (e164, key.1)
        }
    };
    e164.unwrap_or_else(|| {
        PHONES_NOT_E164.fetch_add(1, Ordering::Relaxed);
        fallback
    })
}

/// Most phones remembered by `RECENT`.
const RECENT_PHONES: u64 = 65_536;

/// The E.164 form (`None`: not a valid number) of recently read phones the fast path
/// (`domain::phone`) left to the crate, by region and rules-1 form: such a phone seen again
/// costs a lookup (~0.2 µs) instead of libphonenumber's parse and validation (3 µs alone,
/// ~22 µs with two workers taking turns at its regex cache's mutex: docs/performance.md).
/// The same function either way,
/// so the answer never depends on what is remembered; bounded at `RECENT_PHONES` entries of
/// ~100 B (a flood of new numbers only evicts).
static RECENT: std::sync::LazyLock<moka::sync::Cache<(Region, String), Option<String>>> =
    std::sync::LazyLock::new(|| moka::sync::Cache::new(RECENT_PHONES));

/// What the parser is given for a phone's rules-1 form: `00` is the international prefix of
/// most regions (CN included), so `0086…` is `+86…`.
fn typed_form(fallback: &str) -> std::borrow::Cow<'_, str> {
    match fallback.strip_prefix("00") {
        Some(rest) if !rest.starts_with('0') => format!("+{rest}").into(),
        _ => fallback.into(),
    }
}

/// `phone_e164` without the memory.
fn parse_e164(region: Region, fallback: &str) -> Option<String> {
    let typed = typed_form(fallback);
    let parsed = phonenumber::parse(Some(region), &typed)
        .ok()
        .filter(phonenumber::is_valid)
        .or_else(|| {
            // `8613800138000`: the region's own country code typed without its `+` (only
            // that one: `14323636831` is not read as the US number +1 432…).
            let code = calling_code(region)?.to_string();
            (!fallback.starts_with('+') && fallback.starts_with(&code))
                .then(|| phonenumber::parse(None, format!("+{fallback}")).ok())
                .flatten()
                .filter(|n| phonenumber::is_valid(n) && n.code().value().to_string() == code)
        });
    parsed.map(|n| e164(&n))
}

/// `+`, the country code, the national number with its leading zeros (what the crate's E.164
/// formatter writes, without its formatting machinery: a third of the cost).
fn e164(n: &PhoneNumber) -> String {
    let national = n.national();
    format!(
        "+{}{}{}",
        n.code().value(),
        "0".repeat(usize::from(national.zeros())),
        national.value()
    )
}

/// A segment's prefix under rules 2 (`digits`: its rules-1 form, `+` kept): with `+` as
/// typed; `00…` as `+…`; otherwise the region's calling code in front.
pub(super) fn segment_e164(digits: String, region: Region) -> String {
    if digits.starts_with('+') {
        return digits;
    }
    if let Some(rest) = digits.strip_prefix("00")
        && !rest.is_empty()
    {
        return format!("+{rest}");
    }
    let code = calling_code(region).unwrap_or(86);
    format!("+{code}{digits}")
}

/// The calling code of a region (`CN` → 86).
fn calling_code(region: Region) -> Option<u16> {
    phonenumber::metadata::DATABASE
        .by_id(region.as_ref())
        .map(|m| m.country_code())
}

/// The ISO 7064 MOD 11-2 check character of an ID card's first 17 digits (ASCII).
pub fn id_card_check(body: &[u8]) -> u8 {
    const WEIGHTS: [u32; 17] = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2];
    let sum: u32 = body
        .iter()
        .zip(WEIGHTS)
        .map(|(d, w)| u32::from(d - b'0') * w)
        .sum();
    b"10X98765432"[(sum % 11) as usize]
}

/// Whether `yymmdd` or `yyyymmdd` digits are a calendar date (leap years included).
fn valid_date(year: u32, month: u32, day: u32) -> bool {
    let leap = (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

fn digits_value(d: &[u8]) -> u32 {
    d.iter().fold(0, |n, b| n * 10 + u32::from(b - b'0'))
}

/// An ID card under rules 2 (`up`: trimmed and upper-cased, of 0-9 and A-Z).
pub(super) fn id_card_v2(up: String) -> Result<String, &'static str> {
    let b = up.as_bytes();
    let all_digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    if b.len() == 18 && all_digits(&b[..17]) && (b[17].is_ascii_digit() || b[17] == b'X') {
        if id_card_check(&b[..17]) != b[17] {
            return Err("the ID card's check digit (its 18th character) is wrong");
        }
        return Ok(up);
    }
    if b.len() == 15 && all_digits(b) {
        let (yy, mm, dd) = (
            digits_value(&b[6..8]),
            digits_value(&b[8..10]),
            digits_value(&b[10..12]),
        );
        if valid_date(1900 + yy, mm, dd) {
            let mut body = [0u8; 17];
            body[..6].copy_from_slice(&b[..6]);
            body[6..8].copy_from_slice(b"19");
            body[8..].copy_from_slice(&b[6..15]);
            let mut out = String::from_utf8(body.to_vec()).expect("digits");
            out.push(char::from(id_card_check(&body)));
            return Ok(out);
        }
    }
    Ok(up)
}

/// Whether 15 digits pass the Luhn check.
pub fn luhn_ok(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(d - b'0');
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 { x - 9 } else { x }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// An IMEI under rules 2 (`digits`: 14–16 digits): the 14-digit body.
pub(super) fn imei_v2(digits: String) -> Result<String, &'static str> {
    match digits.len() {
        15 if !luhn_ok(digits.as_bytes()) => {
            Err("the IMEI's check digit (its 15th, Luhn) is wrong")
        }
        14..=16 => Ok(digits[..14].to_owned()),
        _ => Err("expected 14-16 digits after removing spaces and -"),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::{Dimension, Value};

    fn sg() -> Norm {
        PhoneRegions::new("SG", &BTreeMap::new())
            .unwrap()
            .norm(2, &Sandbox::default())
    }

    fn check(norm: Norm, dimension: Dimension, raw: &str) -> Option<String> {
        Value::parse_check_with(&dimension, raw, norm)
            .ok()
            .map(|v| v.to_string())
    }

    fn entry(norm: Norm, dimension: Dimension, raw: &str) -> Option<String> {
        Value::parse_entry_with(&dimension, raw, norm)
            .ok()
            .map(|v| v.to_string())
    }

    /// The table: every spelling of one device, card or phone is one value under
    /// rules 2, and the bad ones are refused.
    #[test]
    fn the_spellings_of_one_identity_are_one_value() {
        let n = Norm::LATEST;
        for (dimension, one, spellings) in [
            (
                Dimension::Phone,
                "+8613800138000",
                &[
                    "13800138000",
                    "+86 138 0013 8000",
                    "+86-138-0013-8000",
                    "8613800138000",
                    "008613800138000",
                    "+86 (138) 0013-8000",
                ][..],
            ),
            (
                Dimension::IdCard,
                "11010519491231002X",
                &[
                    "11010519491231002X",
                    "11010519491231002x",
                    " 110105491231002 ",
                ],
            ),
            (
                Dimension::Imei,
                "49015420323751",
                &[
                    "490154203237518",
                    "49-015420-323751-8",
                    "49015420323751",
                    "4901542032375182",
                ],
            ),
        ] {
            for raw in spellings {
                assert_eq!(
                    check(n, dimension.clone(), raw).as_deref(),
                    Some(one),
                    "{raw}"
                );
            }
        }
        assert_eq!(check(n, Dimension::IdCard, "110105194912310021"), None);
        // Other forms keep rules 1: a passport number.
        assert_eq!(
            check(n, Dimension::IdCard, "e12345678").as_deref(),
            Some("E12345678")
        );
        // 15 digits that are no date: another form, kept.
        assert_eq!(
            check(n, Dimension::IdCard, "110105491331002").as_deref(),
            Some("110105491331002")
        );
        assert_eq!(check(n, Dimension::Imei, "490154203237519"), None);
        // Segments: the region's calling code in front, a `00` read as `+`.
        for (norm, raw, want) in [
            (n, "170*", "+86170*"),
            (n, "0086170*", "+86170*"),
            (n, "+65 9*", "+659*"),
            (sg(), "9*", "+659*"),
        ] {
            assert_eq!(
                entry(norm, Dimension::Phone, raw).as_deref(),
                Some(want),
                "{raw}"
            );
        }
    }

    /// Rules 1 are exactly the old rules: nothing canonicalised, nothing refused that was
    /// accepted.
    #[test]
    fn rules_1_are_unchanged() {
        let n = Norm::V1;
        for (d, raw, want) in [
            (Dimension::Phone, "13800138000", Some("13800138000")),
            (Dimension::Phone, "008613800138000", Some("008613800138000")),
            (
                Dimension::Phone,
                "+86 138-0013-8000",
                Some("+8613800138000"),
            ),
            (Dimension::Phone, "1234", None),
            (
                Dimension::IdCard,
                "110105194912310021",
                Some("110105194912310021"),
            ),
            (
                Dimension::IdCard,
                "110105491231002",
                Some("110105491231002"),
            ),
            (Dimension::Imei, "490154203237519", Some("490154203237519")),
            (
                Dimension::Imei,
                "4901542032375182",
                Some("4901542032375182"),
            ),
        ] {
            assert_eq!(check(n, d.clone(), raw).as_deref(), want, "{d} {raw}");
        }
        assert_eq!(entry(n, Dimension::Phone, "170*").as_deref(), Some("170*"));
    }

    /// A number the parser cannot make valid keeps its rules-1 form, and is counted.
    #[test]
    fn an_invalid_number_keeps_its_digits_and_is_counted() {
        let before = phones_not_e164();
        assert_eq!(
            check(Norm::LATEST, Dimension::Phone, "12345").as_deref(),
            Some("12345")
        );
        assert!(phones_not_e164() > before);
    }

    /// The hand-written E.164 is the crate's formatter's, leading zeros included (Italy).
    #[test]
    fn e164_is_the_crates() {
        for (region, raw) in [
            (Region::CN, "13800138000"),
            (Region::IT, "0612345678"),
            (Region::SG, "91234567"),
            (Region::US, "2015550123"),
        ] {
            let n = phonenumber::parse(Some(region), raw).unwrap();
            assert_eq!(
                e164(&n),
                n.format().mode(phonenumber::Mode::E164).to_string(),
                "{raw}"
            );
        }
    }

    #[test]
    fn regions_are_checked() {
        assert!(parse_region("sg").is_ok());
        assert!(parse_region("XX").is_err());
        assert!(PhoneRegions::new("CN", &BTreeMap::from([("intl".into(), "ZZ".into())])).is_err());
        let regions =
            PhoneRegions::new("CN", &BTreeMap::from([("intl".into(), "SG".into())])).unwrap();
        assert_eq!(regions.of(&"intl".parse().unwrap()), Region::SG);
        assert_eq!(regions.of(&Sandbox::default()), Region::CN);
    }

    /// An independent check digit: Σ aᵢ·2^(17−i) mod 11 (the weights as powers of two, not
    /// the table), then (12 − s) mod 11, 10 written X.
    fn check_digit_by_powers(body: &str) -> char {
        let s: u64 = body
            .bytes()
            .enumerate()
            .map(|(i, b)| u64::from(b - b'0') * ((1u64 << (17 - i)) % 11))
            .sum::<u64>()
            % 11;
        match (12 - s) % 11 {
            10 => 'X',
            d => char::from(b'0' + d as u8),
        }
    }

    /// Luhn the long way: double every second digit from the right as a number, add its
    /// decimal digits.
    fn luhn_by_digit_sums(s: &str) -> bool {
        let total: u32 = s
            .chars()
            .rev()
            .enumerate()
            .map(|(i, c)| {
                let d = c.to_digit(10).unwrap() * if i % 2 == 1 { 2 } else { 1 };
                d.to_string()
                    .chars()
                    .map(|c| c.to_digit(10).unwrap())
                    .sum::<u32>()
            })
            .sum();
        total.is_multiple_of(10)
    }

    proptest! {
        /// Every spelling of a valid CN mobile number is one E.164 string, and read in SG it
        /// is not that string (regions do not leak into each other).
        #[test]
        fn every_spelling_of_a_number_is_one_e164(
            prefix in prop::sample::select(vec!["130", "135", "138", "139", "150", "158", "186", "189"]),
            rest in "[0-9]{8}",
            sep in prop::sample::select(vec!["", " ", "-"]),
            form in 0usize..5,
        ) {
            let national = format!("{prefix}{rest}");
            let want = format!("+86{national}");
            let spaced = format!("{prefix}{sep}{}{sep}{}", &rest[..4], &rest[4..]);
            let typed = match form {
                0 => spaced,
                1 => format!("+86{sep}{spaced}"),
                2 => format!("0086{sep}{spaced}"),
                3 => format!("86{spaced}"),
                _ => format!("+86 ({prefix}) {}-{}", &rest[..4], &rest[4..]),
            };
            prop_assert_eq!(check(Norm::LATEST, Dimension::Phone, &typed), Some(want.clone()));
            prop_assert_ne!(check(sg(), Dimension::Phone, &national), Some(want));
        }

        /// A 15-digit card with a valid date becomes the 18-character form whose check digit
        /// an independent computation gives; that form is accepted as it is, and any other
        /// last character is refused.
        #[test]
        fn id_cards_convert_and_check(
            region in "[1-6][0-9]{5}",
            yy in 0u32..100,
            mm in 1u32..=12,
            dd in 1u32..=28,
            seq in "[0-9]{3}",
            wrong in 0u8..11,
        ) {
            let old = format!("{region}{yy:02}{mm:02}{dd:02}{seq}");
            let body = format!("{region}19{yy:02}{mm:02}{dd:02}{seq}");
            let full = format!("{body}{}", check_digit_by_powers(&body));
            prop_assert_eq!(check(Norm::LATEST, Dimension::IdCard, &old), Some(full.clone()));
            prop_assert_eq!(check(Norm::LATEST, Dimension::IdCard, &full), Some(full.clone()));
            let other = b"0123456789X"[wrong as usize] as char;
            if other != full.chars().last().unwrap() {
                let bad = format!("{body}{other}");
                prop_assert_eq!(check(Norm::LATEST, Dimension::IdCard, &bad), None);
            }
        }

        /// An IMEI passes when Luhn passes (checked another way), and the IMEI, its body and
        /// its IMEISV are one value.
        #[test]
        fn imeis_are_luhn_checked_and_keyed_by_their_body(body in "[0-9]{14}", last in 0u8..10, sv in "[0-9]{2}") {
            let imei = format!("{body}{last}");
            let ok = check(Norm::LATEST, Dimension::Imei, &imei);
            if luhn_by_digit_sums(&imei) {
                prop_assert_eq!(ok, Some(body.clone()));
            } else {
                prop_assert_eq!(ok, None);
            }
            prop_assert_eq!(check(Norm::LATEST, Dimension::Imei, &body), Some(body.clone()));
            prop_assert_eq!(check(Norm::LATEST, Dimension::Imei, &format!("{body}{sv}")), Some(body.clone()));
        }
    }
}
