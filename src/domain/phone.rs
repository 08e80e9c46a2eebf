//! The fast path of a phone's E.164 form (rules 2): the common case — a national number of
//! the region, or one written with the region's own country code — decided with the
//! region's metadata patterns compiled once into shared `regex::Regex`es, instead of the
//! `phonenumber` crate's parse and validation (~7 µs for a number like the last ones, ~22 µs
//! for one unlike them: its regexes live in one global cache of 100 behind a mutex, held
//! for every search, so two workers parsing take turns).
//!
//! It answers only where the crate's answer is certain to be the same, and says nothing
//! otherwise (the caller then asks the crate). Given `N`, the national number as typed (the
//! digits after `+` and the region's calling code, or all the digits), the crate's
//! `parse(Some(region), …)` keeps `N` whole and `is_valid` says yes when all of these hold:
//!
//! * the calling code belongs to this one region only (`validator::source_for` then picks
//!   it without reading the number; `+1`, `+7`, `+44`… are left to the crate);
//! * `N` does not start with `0` or the region's national prefix (no zeros to carry, nothing
//!   stripped as a prefix), and neither the international prefix nor the national prefix
//!   for parsing matches at its start (`helper::international_prefix`,
//!   `helper::national_number`: nothing stripped or transformed);
//! * typed without `+`, `N` does not start with the calling code, or has one of the general
//!   descriptor's possible lengths (`helper::country_code` strips a leading calling code
//!   from a number whose length is not possible; with no lengths listed, as in the crate's
//!   CN metadata, none is);
//! * the general pattern matches `N` (with one of its possible lengths, when it lists any)
//!   and so does the mobile or the fixed-line pattern (`validator::number_type` is then not
//!   `Unknown`).
//!
//! Matching is the crate's `Descriptor::is_match`: the length among the descriptor's
//! possible lengths (when it lists any) and the pattern matching from the first digit; the
//! patterns are compiled as the crate compiles them (`ignore_whitespace`). The property
//! tests below hold the fast path to the crate over every 3-digit prefix of CN numbers and
//! random numbers of several regions.

use std::sync::LazyLock;
use std::sync::OnceLock;

use phonenumber::country::Id as Region;
use phonenumber::metadata::{DATABASE, Descriptor, Metadata};
use regex::{Regex, RegexBuilder};

/// One descriptor: its pattern (matched from the first digit) and possible lengths.
struct Desc {
    pattern: Regex,
    lengths: Vec<u16>,
}

impl Desc {
    fn new(d: &Descriptor) -> Option<Self> {
        Some(Self {
            pattern: compile(d.national_number().as_str())?,
            lengths: d.possible_length().to_vec(),
        })
    }

    /// `Descriptor::is_match`.
    fn is_match(&self, n: &str) -> bool {
        (self.lengths.is_empty() || self.lengths.contains(&(n.len() as u16)))
            && self.pattern.is_match(n)
    }
}

/// A region's compiled fast path.
struct Fast {
    code: String,
    national_prefix: Option<String>,
    international_prefix: Option<Regex>,
    prefix_for_parsing: Option<Regex>,
    general: Desc,
    /// Mobile and fixed line (either one makes the number valid).
    types: Vec<Desc>,
    /// Every other type `validator::number_type` tries (premium rate, toll free, shared
    /// cost, VoIP, personal number, pager, UAN, voicemail): with the general pattern and
    /// these, a number none of them match is certainly not valid. `None` when one of them
    /// does not compile here (the fast path then never says "not valid").
    others: Option<Vec<Desc>>,
}

/// `pattern` anchored at the first digit: "it matches there" is all the crate asks of a
/// search (`find(n)` starting at 0), and an anchored `is_match` stops at the first answer
/// (the unanchored search cost ~5 µs on CN's general pattern, more than the crate's parse).
/// The newline ends a trailing `#` comment, which `ignore_whitespace` allows.
fn compile(pattern: &str) -> Option<Regex> {
    RegexBuilder::new(&format!("^(?:{pattern}\n)"))
        .ignore_whitespace(true)
        .build()
        .ok()
}

/// `pattern` finds a match starting at the first digit of `n`.
fn starts(pattern: Option<&Regex>, n: &str) -> bool {
    pattern.is_some_and(|re| re.is_match(n))
}

impl Fast {
    /// `None` where the fast path cannot be sure (a calling code shared with other regions,
    /// no possible lengths, a pattern this `regex` does not compile).
    fn new(meta: &Metadata) -> Option<Self> {
        let code = meta.country_code();
        if DATABASE.region(&code)?.len() != 1 {
            return None;
        }
        let optional = |pattern: Option<&str>| match pattern {
            Some(p) => compile(p).map(Some),
            None => Some(None),
        };
        let mut types = Vec::new();
        for d in [meta.descriptors().mobile(), meta.descriptors().fixed_line()]
            .into_iter()
            .flatten()
        {
            types.push(Desc::new(d)?);
        }
        Some(Self {
            code: code.to_string(),
            national_prefix: meta.national_prefix().map(str::to_owned),
            international_prefix: optional(meta.international_prefix().map(|r| r.as_str()))?,
            prefix_for_parsing: optional(meta.national_prefix_for_parsing().map(|r| r.as_str()))?,
            general: Desc::new(meta.descriptors().general())?,
            types,
            others: {
                let d = meta.descriptors();
                [
                    d.premium_rate(),
                    d.toll_free(),
                    d.shared_cost(),
                    d.voip(),
                    d.personal_number(),
                    d.pager(),
                    d.uan(),
                    d.voicemail(),
                ]
                .into_iter()
                .flatten()
                .map(Desc::new)
                .collect()
            },
        })
    }

    /// What the crate makes of `n` read as a national number of the region (`after_plus`:
    /// it followed `+` and the calling code), when that is certain: `Some(Some(e164))` kept
    /// whole and valid, `Some(None)` not a valid number; `None`: ask the crate.
    fn national(&self, n: &str, after_plus: bool) -> Option<Option<String>> {
        // Typed without `+`, a number starting with the calling code loses it when its
        // length is not possible, which it never is when the general descriptor lists no
        // lengths (the crate's metadata for CN, among others).
        let starts_with_code = !after_plus && n.starts_with(&self.code);
        let keeps_code = !starts_with_code
            || !self.general.lengths.is_empty() && self.general.lengths.contains(&(n.len() as u16));
        let kept_whole = keeps_code
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && !n.starts_with('0')
            && !self
                .national_prefix
                .as_deref()
                .is_some_and(|p| !p.is_empty() && n.starts_with(p))
            && !starts(self.international_prefix.as_ref(), n)
            && !starts(self.prefix_for_parsing.as_ref(), n);
        if !kept_whole {
            return None;
        }
        let general = self.general.is_match(n);
        if general && self.types.iter().any(|t| t.is_match(n)) {
            return Some(Some(format!("+{}{n}", self.code)));
        }
        // Not valid as typed: certain when no type of `number_type` matches, and the caller
        // will not read it again with a `+` (`8613…`: the region's code typed without it).
        let no_type = !general
            || self
                .others
                .as_ref()
                .is_some_and(|others| !others.iter().any(|t| t.is_match(n)));
        (no_type && !starts_with_code).then_some(None)
    }
}

/// Regions' fast paths, compiled on first use (`Region` is a field-less enum of ~250).
static FAST: LazyLock<Box<[OnceLock<Option<Fast>>]>> =
    LazyLock::new(|| (0..512).map(|_| OnceLock::new()).collect());

fn fast(region: Region) -> Option<&'static Fast> {
    let slot = FAST.get(region as usize)?;
    slot.get_or_init(|| DATABASE.by_id(region.as_ref()).and_then(Fast::new))
        .as_ref()
}

/// What `phonenumber::parse(Some(region), …)` and `is_valid` make of `typed` (digits, with a
/// leading `+` or `00` kept) in `region`, when that is certain: `Some(Some(e164))` valid,
/// `Some(None)` not a valid number; `None`: ask the crate. Covers `13800138000`,
/// `+8613800138000` and `008613800138000` (`00` is the caller's: it reads `00…` as `+…`), not
/// `8613800138000` (the crate reads that as a national number first).
pub fn e164(region: Region, typed: &str) -> Option<Option<String>> {
    let fast = fast(region)?;
    match typed.strip_prefix('+') {
        None => fast.national(typed, false),
        Some(rest) => {
            // The crate takes the shortest calling code the database knows: it must be this
            // region's, and no international prefix may follow the `+`.
            let code = (1..=3).filter_map(|len| rest.get(..len)).find(|c| {
                c.parse::<u16>()
                    .is_ok_and(|c| DATABASE.by_code(&c).is_some())
            })?;
            if code != fast.code
                || rest.len() <= 2
                || starts(fast.international_prefix.as_ref(), rest)
            {
                return None;
            }
            fast.national(&rest[code.len()..], true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The crate's answer: parsed in `region`, valid, in E.164.
    fn crate_e164(region: Region, typed: &str) -> Option<String> {
        phonenumber::parse(Some(region), typed)
            .ok()
            .filter(phonenumber::is_valid)
            .map(|n| n.format().mode(phonenumber::Mode::E164).to_string())
    }

    #[test]
    fn the_common_spellings_take_the_fast_path() {
        let valid = |region, typed| e164(region, typed).flatten();
        assert_eq!(
            valid(Region::CN, "13800138000").as_deref(),
            Some("+8613800138000")
        );
        assert_eq!(
            valid(Region::CN, "+8613800138000").as_deref(),
            Some("+8613800138000")
        );
        // Left to the crate (`None`), and why.
        for (region, typed, why) in [
            (Region::CN, "01012345678", "a national prefix"),
            (Region::CN, "12345678901", "prefix for parsing"),
            (Region::CN, "+14155550123", "another code"),
            (Region::US, "4155550123", "+1 is shared"),
        ] {
            assert_eq!(e164(region, typed), None, "{why}: the crate");
        }
        assert_eq!(
            valid(Region::SG, "81234567").as_deref(),
            Some("+6581234567")
        );
        assert_eq!(valid(Region::CN, "123"), None);
        // Certainly not valid: a CN mobile prefix that does not exist, national or `+86`.
        assert_eq!(e164(Region::CN, "14012345678"), Some(None));
        assert_eq!(e164(Region::CN, "+8614012345678"), Some(None));
        assert_eq!(
            e164(Region::CN, "8614012345678"),
            None,
            "the region's code without `+`: read again with it, by the caller"
        );
    }

    #[test]
    fn every_cn_prefix_agrees_with_the_crate() {
        // Every 3-digit start of an 11-digit number (and of shorter and longer ones), with
        // a few endings each: where the fast path answers, the crate answers the same.
        let (mut answered, mut invalid) = (0, 0);
        for prefix in 0..1000u32 {
            for (len, tail) in [
                (11, 0u64),
                (11, 12_345_678),
                (11, 99_999_999),
                (10, 1_234_567),
                (12, 123_456_789),
            ] {
                let digits = format!("{prefix:03}{tail:0w$}", w = len - 3);
                for typed in [digits.clone(), format!("+86{digits}")] {
                    if let Some(fast) = e164(Region::CN, &typed) {
                        answered += 1;
                        invalid += usize::from(fast.is_none());
                        assert_eq!(fast, crate_e164(Region::CN, &typed), "{typed}");
                    }
                }
            }
        }
        assert!(
            answered > 1_000 && invalid > 500,
            "the fast path answered {answered} times, {invalid} of them not valid"
        );
    }

    #[test]
    fn every_regions_examples_agree_with_the_crate() {
        // Every region of the metadata, its example numbers of every type, national and
        // with `+` and the calling code, and each with its last digit changed.
        let (mut answered, mut regions) = (0, 0);
        for meta in DATABASE.iter() {
            let Ok(region) = meta.id().parse::<Region>() else {
                continue;
            };
            let d = meta.descriptors();
            let examples = [
                d.mobile(),
                d.fixed_line(),
                d.toll_free(),
                d.voip(),
                d.premium_rate(),
            ]
            .into_iter()
            .flatten()
            .filter_map(|d| d.example());
            regions += 1;
            for example in examples {
                let last = (example.as_bytes()[example.len() - 1] - b'0' + 7) % 10;
                let changed = format!("{}{last}", &example[..example.len() - 1]);
                for n in [example.to_owned(), changed] {
                    for typed in [n.clone(), format!("+{}{n}", meta.country_code())] {
                        if let Some(fast) = e164(region, &typed) {
                            answered += 1;
                            assert_eq!(fast, crate_e164(region, &typed), "{region:?} {typed}");
                        }
                    }
                }
            }
        }
        assert!(
            regions > 200 && answered > 500,
            "{answered} answers in {regions} regions"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn the_fast_path_is_the_crates_answer(
            region in prop::sample::select(vec![
                Region::CN, Region::SG, Region::HK, Region::TW, Region::IN, Region::DE,
                Region::FR, Region::JP, Region::BR, Region::GB, Region::US, Region::RU,
            ]),
            digits in "[0-9]{4,14}",
            tail in "[0-9]{0,6}",
            from_example in any::<bool>(),
            plus in any::<bool>(),
        ) {
            // Random digits are rarely valid: half the cases are a valid example number of
            // the region with its last digits replaced.
            let meta = DATABASE.by_id(region.as_ref()).unwrap();
            let example = [meta.descriptors().mobile(), meta.descriptors().fixed_line()]
                .into_iter()
                .flatten()
                .find_map(|d| d.example())
                .filter(|_| from_example);
            let digits = match example {
                Some(e) => format!("{}{tail}", &e[..e.len().saturating_sub(tail.len())]),
                None => digits,
            };
            let typed = if plus {
                let code = DATABASE.by_id(region.as_ref()).unwrap().country_code();
                format!("+{code}{digits}")
            } else {
                digits
            };
            if let Some(fast) = e164(region, &typed) {
                prop_assert_eq!(fast, crate_e164(region, &typed), "{}", typed);
            }
        }
    }
}
