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

use phonenumber::country::Id as Region;
use phonenumber::{Mode, PhoneNumber};

use super::Sandbox;

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
    // `00` is the international prefix of most regions (CN included): `0086…` is `+86…`.
    let typed = match fallback.strip_prefix("00") {
        Some(rest) if !rest.starts_with('0') => format!("+{rest}"),
        _ => fallback.clone(),
    };
    let parsed = phonenumber::parse(Some(region), &typed)
        .ok()
        .filter(phonenumber::is_valid)
        .or_else(|| {
            // `8613800138000`: the country code typed without its `+`.
            (!fallback.starts_with('+'))
                .then(|| phonenumber::parse(None, format!("+{fallback}")).ok())
                .flatten()
                .filter(phonenumber::is_valid)
        });
    match parsed {
        Some(n) => e164(&n),
        None => {
            PHONES_NOT_E164.fetch_add(1, Ordering::Relaxed);
            fallback
        }
    }
}

fn e164(n: &PhoneNumber) -> String {
    n.format().mode(Mode::E164).to_string()
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
    let code = phonenumber::metadata::DATABASE
        .by_id(region.as_ref())
        .map_or(86, |m| m.country_code());
    format!("+{code}{digits}")
}

/// The ISO 7064 MOD 11-2 check character of an ID card's first 17 digits.
pub fn id_card_check(body: &[u8; 17]) -> u8 {
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
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
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
        let body: &[u8; 17] = b[..17].try_into().expect("17 bytes");
        if id_card_check(body) != b[17] {
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
    sum % 10 == 0
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
