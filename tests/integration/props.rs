//! Property tests of the name-list domain rules (API.md, "Name-lists", under rules 1) and of the storage
//! layout (`store::layout`): value normalisation, the Redis field and bucket of an entry in both
//! layout formats (held to independent implementations of their documented hashing), the
//! expiry encoding and IP ranges. No store, no network: these run in a second or two.
//!
//! Failures are not persisted to `proptest-regressions/`: a failing case is printed, shrunk,
//! and belongs in a unit test next to the code it breaks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use namelist::domain::{
    Dimension, Expiry, IpValue, ListName, Norm, Sandbox, ValidationError, Value,
};
use namelist::store::expiry::EPOCH_2020_MS;
use namelist::store::layout::{Layout, canonical};
use namelist::store::{FingerprintKey, Hashing};
use proptest::prelude::*;
use proptest::sample::select;

// ---------------------------------------------------------------------------------------------
// Configuration and small helpers
// ---------------------------------------------------------------------------------------------

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// 2021-01-01T00:00:00Z, in Unix ms.
const Y2021_MS: i64 = 1_609_459_200_000;
/// 2088-01-01T00:00:00Z, in Unix ms.
const Y2088_MS: i64 = 3_723_753_600_000;
/// 2100-01-01T00:00:00Z, in Unix ms.
const Y2100_MS: i64 = 4_102_444_800_000;
/// 2150-01-01T00:00:00Z, in Unix ms.
const Y2150_MS: i64 = 5_680_281_600_000;

// The rules of the table in API.md's "Name-lists" as keyspaces made before issue 29 keep
// them: rules 1 (rules 2's own properties are in `src/domain/rules.rs`).
fn entry(dim: &Dimension, raw: &str) -> Result<Value, ValidationError> {
    Value::parse_entry_with(dim, raw, Norm::V1)
}

fn check(dim: &Dimension, raw: &str) -> Result<Value, ValidationError> {
    Value::parse_check_with(dim, raw, Norm::V1)
}

/// The canonical text of a parse result, or the error code, for readable assertion output.
fn shown(r: &Result<Value, ValidationError>) -> Result<String, String> {
    match r {
        Ok(v) => Ok(v.to_string()),
        Err(e) => Err(format!("{}: {}", e.code, e.message)),
    }
}

/// Every built-in dimension plus a custom one.
fn all_dimensions() -> Vec<Dimension> {
    let mut dims = Dimension::BUILT_IN.to_vec();
    dims.push(Dimension::Custom("merchant_id".into()));
    dims
}

/// A built-in dimension or a random custom name.
fn dimension() -> impl Strategy<Value = Dimension> {
    prop_oneof![
        3 => select(all_dimensions()),
        1 => "[a-z][a-z0-9_]{0,31}".prop_map(|s| s.parse::<Dimension>().expect("a dimension name")),
    ]
}

/// Whitespace that `str::trim` removes, including the ideographic space of CJK keyboards.
fn ws() -> impl Strategy<Value = String> {
    prop::collection::vec(
        select(vec![' ', '\t', '\n', '\r', '\u{3000}', '\u{a0}']),
        0..3,
    )
    .prop_map(String::from_iter)
}

/// Random ASCII case: character `i` is upper-cased when `flips[i % len]`.
fn random_case(s: &str, flips: &[bool]) -> String {
    s.chars()
        .enumerate()
        .map(|(i, c)| {
            if flips[i % flips.len()] {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// `seps[i % len]` before every character of `s` and one more after the last.
fn interleave(s: &str, seps: &[String]) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        out.push_str(&seps[i % seps.len()]);
        out.push(c);
    }
    out.push_str(&seps[s.chars().count() % seps.len()]);
    out
}

fn flips() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(any::<bool>(), 1..20)
}

/// A canonical value and 1-4 differently typed forms of it, as (canonical text, forms).
type Forms = (String, Vec<String>);

// ---------------------------------------------------------------------------------------------
// Valid values, canonical and decorated
// ---------------------------------------------------------------------------------------------

/// `phone`: optional leading `+`, 5-20 digits; spaces, `-`, `(`, `)` anywhere after the `+`,
/// whitespace around.
fn phone_forms() -> impl Strategy<Value = Forms> {
    let decoration = (ws(), prop::collection::vec("[ ()\\-]{0,2}", 1..22), ws());
    (
        any::<bool>(),
        "[0-9]{5,20}",
        prop::collection::vec(decoration, 1..5),
    )
        .prop_map(|(plus, digits, decorations)| {
            let plus = if plus { "+" } else { "" };
            let forms = decorations
                .iter()
                .map(|(l, seps, r)| format!("{l}{plus}{}{r}", interleave(&digits, seps)))
                .collect();
            (format!("{plus}{digits}"), forms)
        })
}

/// `id_card`: `[0-9A-Z]{4,32}`, typed in any case, whitespace around.
fn id_card_forms() -> impl Strategy<Value = Forms> {
    (
        "[0-9A-Z]{4,32}",
        prop::collection::vec((ws(), flips(), ws()), 1..5),
    )
        .prop_map(|(canon, decorations)| {
            let forms = decorations
                .iter()
                .map(|(l, f, r)| format!("{l}{}{r}", random_case(&canon, f)))
                .collect();
            (canon, forms)
        })
}

/// `imei`: 14-16 digits with spaces and `-` anywhere, whitespace around.
fn imei_forms() -> impl Strategy<Value = Forms> {
    let decoration = (ws(), prop::collection::vec("[ \\-]{0,2}", 1..18), ws());
    ("[0-9]{14,16}", prop::collection::vec(decoration, 1..5)).prop_map(|(canon, decorations)| {
        let forms = decorations
            .iter()
            .map(|(l, seps, r)| format!("{l}{}{r}", interleave(&canon, seps)))
            .collect();
        (canon, forms)
    })
}

/// The four spellings of a MAC address API.md allows, lower-case.
fn mac_spellings(b: &[u8; 6]) -> [String; 4] {
    let hex: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    [
        hex.join(":"),
        hex.join("-"),
        format!(
            "{}{}.{}{}.{}{}",
            hex[0], hex[1], hex[2], hex[3], hex[4], hex[5]
        ),
        hex.concat(),
    ]
}

/// `wifi_mac`: `aa:bb:..`, `AA-BB-..`, `aabb.ccdd.eeff` or bare, in random case.
fn wifi_mac_forms() -> impl Strategy<Value = Forms> {
    let octet = prop_oneof![Just(0u8), Just(0xff), any::<u8>()];
    (
        prop::array::uniform6(octet),
        prop::collection::vec((ws(), 0usize..4, flips(), ws()), 1..5),
    )
        .prop_map(|(bytes, decorations)| {
            let spellings = mac_spellings(&bytes);
            let forms = decorations
                .iter()
                .map(|(l, style, f, r)| format!("{l}{}{r}", random_case(&spellings[*style], f)))
                .collect();
            (spellings[0].clone(), forms)
        })
}

fn octet() -> impl Strategy<Value = u8> {
    prop_oneof![Just(0u8), Just(255), any::<u8>()]
}

fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    prop::array::uniform4(octet()).prop_map(Ipv4Addr::from)
}

/// An IPv6 address that is not IPv4-mapped, with runs of zero groups (so that `::` compression
/// and its placement matter) and `ffff` groups.
fn ipv6() -> impl Strategy<Value = Ipv6Addr> {
    let group = prop_oneof![3 => Just(0u16), 1 => Just(0xffff), 4 => any::<u16>()];
    prop::array::uniform8(group)
        .prop_map(Ipv6Addr::from)
        .prop_filter("not IPv4-mapped", |a| a.to_ipv4_mapped().is_none())
}

/// Every group, zero-padded to 4 digits, no `::`.
fn ipv6_expanded(a: &Ipv6Addr) -> String {
    let groups: Vec<String> = a.segments().iter().map(|g| format!("{g:04x}")).collect();
    groups.join(":")
}

/// Every group, without padding, no `::`.
fn ipv6_uncompressed(a: &Ipv6Addr) -> String {
    let groups: Vec<String> = a.segments().iter().map(|g| format!("{g:x}")).collect();
    groups.join(":")
}

/// The ways of writing an IPv4 address as an IPv4-mapped IPv6 address.
fn ipv4_mapped_spellings(a: &Ipv4Addr) -> Vec<String> {
    let o = a.octets();
    let (hi, lo) = (
        u16::from_be_bytes([o[0], o[1]]),
        u16::from_be_bytes([o[2], o[3]]),
    );
    vec![
        format!("::ffff:{a}"),
        format!("0:0:0:0:0:ffff:{a}"),
        format!("0000:0000:0000:0000:0000:FFFF:{a}"),
        format!("::ffff:{hi:x}:{lo:x}"),
        format!("::FFFF:{hi:04X}:{lo:04X}"),
    ]
}

/// Independent of the crate: the top `p` bits of `bits`.
fn mask_v4(bits: u32, p: u8) -> u32 {
    bits & u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0)
}

fn mask_v6(bits: u128, p: u8) -> u128 {
    bits & u128::MAX.checked_shl(128 - u32::from(p)).unwrap_or(0)
}

/// `ip`: an address typed several ways, or a CIDR range with random host bits.
fn ip_forms() -> impl Strategy<Value = Forms> {
    let v4 = (ipv4(), prop::collection::vec((ws(), 0usize..6, ws()), 1..5)).prop_map(
        |(a, decorations)| {
            let mut spellings = ipv4_mapped_spellings(&a);
            spellings.insert(0, a.to_string());
            let forms = decorations
                .iter()
                .map(|(l, i, r)| format!("{l}{}{r}", spellings[*i]))
                .collect();
            (a.to_string(), forms)
        },
    );
    let v6 = (
        ipv6(),
        prop::collection::vec((ws(), 0usize..3, flips(), ws()), 1..5),
    )
        .prop_map(|(a, decorations)| {
            let spellings = [a.to_string(), ipv6_expanded(&a), ipv6_uncompressed(&a)];
            let forms = decorations
                .iter()
                .map(|(l, i, f, r)| format!("{l}{}{r}", random_case(&spellings[*i], f)))
                .collect();
            (a.to_string(), forms)
        });
    let v4_range = (
        any::<u32>(),
        0u8..=32,
        prop::collection::vec((any::<u32>(), any::<bool>()), 1..5),
    )
        .prop_map(|(bits, p, hosts)| {
            let net = Ipv4Addr::from(mask_v4(bits, p));
            let canon = if p == 32 {
                net.to_string()
            } else {
                format!("{net}/{p}")
            };
            let forms = hosts
                .iter()
                .map(|&(host, mapped)| {
                    // Same network, random host bits.
                    let a = Ipv4Addr::from(mask_v4(bits, p) | (host & !mask_v4(u32::MAX, p)));
                    if mapped {
                        format!("::ffff:{a}/{}", u16::from(p) + 96)
                    } else {
                        format!("{a}/{p}")
                    }
                })
                .collect();
            (canon, forms)
        });
    let v6_range = (
        ipv6(),
        0u8..=128,
        prop::collection::vec((any::<u128>(), any::<bool>()), 1..5),
    )
        .prop_map(|(a, p, hosts)| {
            let bits = u128::from(a);
            let net = Ipv6Addr::from(mask_v6(bits, p));
            let canon = if p == 128 {
                net.to_string()
            } else {
                format!("{net}/{p}")
            };
            let forms = hosts
                .iter()
                .map(|&(host, expanded)| {
                    let a = Ipv6Addr::from(mask_v6(bits, p) | (host & !mask_v6(u128::MAX, p)));
                    let text = if expanded {
                        ipv6_expanded(&a).to_ascii_uppercase()
                    } else {
                        a.to_string()
                    };
                    format!("{text}/{p}")
                })
                .collect();
            (canon, forms)
        });
    // (`ipv6()` is never IPv4-mapped, so neither is its network nor any address in it: the
    // mapped ranges, which are IPv4 ranges, are in `v4_range`.)
    prop_oneof![v4, v6, v4_range, v6_range]
}

/// `uid`, `device`, custom: any non-empty text of at most 256 bytes without surrounding
/// whitespace, case-sensitive, with whitespace around.
fn text_forms() -> impl Strategy<Value = Forms> {
    let canon = prop_oneof![
        "[!-~]{1,40}",
        "[a-z]{1,5}( [A-Z]{1,5}){0,3}",
        "\\PC{1,40}".prop_filter("no surrounding whitespace", |s| s.trim() == s),
        "[a-zA-Z0-9]{250,256}",
        "[é商]{1,85}",
    ];
    (canon, prop::collection::vec((ws(), ws()), 1..5)).prop_map(|(canon, decorations)| {
        let forms = decorations
            .iter()
            .map(|(l, r)| format!("{l}{canon}{r}"))
            .collect();
        (canon, forms)
    })
}

/// A domain of 2-4 lower-case ASCII labels, never one the gmail rule rewrites.
fn ascii_domain() -> impl Strategy<Value = String> {
    "[a-z0-9]{1,12}(\\.[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?){0,2}\\.[a-z]{2,6}"
        .prop_filter("not gmail", |d| d != "gmail.com" && d != "googlemail.com")
}

/// Internationalised domains and their ASCII forms (UTS #46 / RFC 3492 examples), as
/// (typed, ASCII): typed forms differ in case and in the ideographic full stop.
const IDN_DOMAINS: &[(&str, &str)] = &[
    ("bücher.example", "xn--bcher-kva.example"),
    ("BÜCHER.Example", "xn--bcher-kva.example"),
    ("münchen.de", "xn--mnchen-3ya.de"),
    ("例え.テスト", "xn--r8jz45g.xn--zckzah"),
    ("例え。テスト", "xn--r8jz45g.xn--zckzah"),
    ("xn--r8jz45g.xn--zckzah", "xn--r8jz45g.xn--zckzah"),
];

/// `email`: an address (never at gmail) typed with random case, a `+tag`, a trailing dot
/// on the domain, an IDN domain in Unicode, and whitespace around.
fn email_forms() -> impl Strategy<Value = Forms> {
    let domain = prop_oneof![
        3 => ascii_domain().prop_map(|d| (d.clone(), d)),
        1 => select(IDN_DOMAINS).prop_map(|(t, a)| (t.to_owned(), a.to_owned())),
    ];
    let decoration = (
        ws(),
        flips(),
        prop::option::of("[a-z0-9.+]{0,8}"),
        any::<bool>(),
        ws(),
    );
    (
        "[a-z0-9._-]{1,30}",
        domain,
        prop::collection::vec(decoration, 1..5),
    )
        .prop_map(|(local, (typed, ascii), decorations)| {
            let forms = decorations
                .iter()
                .map(|(l, case, tag, dot, r)| {
                    let tag = tag.as_ref().map(|t| format!("+{t}")).unwrap_or_default();
                    let dot = if *dot { "." } else { "" };
                    let local = random_case(&format!("{local}{tag}"), case);
                    format!("{l}{local}@{}{dot}{r}", random_case(&typed, case))
                })
                .collect();
            (format!("{local}@{ascii}"), forms)
        })
}

/// A gmail address as its owner may type it: dots anywhere in the local part, a `+tag`,
/// either domain, any case.
fn gmail_forms() -> impl Strategy<Value = Forms> {
    let decoration = (
        flips(),
        prop::collection::vec("[.]{0,1}", 1..8),
        prop::option::of("[a-z0-9.]{0,6}"),
        select(vec![
            "gmail.com",
            "googlemail.com",
            "GMail.COM",
            "googlemail.com.",
        ]),
    );
    ("[a-z0-9]{1,20}", prop::collection::vec(decoration, 1..5)).prop_map(|(local, decorations)| {
        let forms = decorations
            .iter()
            .map(|(case, dots, tag, domain)| {
                let tag = tag.as_ref().map(|t| format!("+{t}")).unwrap_or_default();
                let dotted = interleave(&local, dots);
                format!("{}{tag}@{domain}", random_case(&dotted, case))
            })
            .collect();
        (format!("{local}@gmail.com"), forms)
    })
}

fn forms(dim: &Dimension) -> BoxedStrategy<Forms> {
    match dim {
        Dimension::Email => prop_oneof![3 => email_forms(), 1 => gmail_forms()].boxed(),
        Dimension::Phone => phone_forms().boxed(),
        Dimension::IdCard => id_card_forms().boxed(),
        Dimension::Imei => imei_forms().boxed(),
        Dimension::WifiMac => wifi_mac_forms().boxed(),
        Dimension::Ip => ip_forms().boxed(),
        Dimension::Uid | Dimension::Device | Dimension::Custom(_) => text_forms().boxed(),
    }
}

/// A dimension and one valid (possibly decorated) raw value of it.
fn dimension_and_valid_raw() -> impl Strategy<Value = (Dimension, String)> {
    dimension().prop_flat_map(|d| {
        let raw = forms(&d).prop_flat_map(|(_, forms)| select(forms));
        (Just(d), raw)
    })
}

/// Strings that are mostly invalid but close to the parsers' alphabets, so that the `Ok`
/// branch of the idempotence properties is not only reached through valid generators.
fn near_miss() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[0-9a-fA-F:.\\-+() /\t]{0,45}",
        "[ ]?[+]?[0-9 ()\\-]{3,26}[ ]?",
        "[0-9a-fA-F]{2}([:.\\-]?[0-9a-fA-F]{2}){4,6}",
        "[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}|[0-9a-fA-F]{4}(\\.[0-9a-fA-F]{4}){2}|[0-9a-fA-F]{11,13}",
        "[ ]?[0-9]{3,6}([ \\-]{0,2}[0-9]{3,6}){2,3}[ ]?",
        "(::ffff:)?[0-9]{1,3}(\\.[0-9]{1,3}){3}(/[0-9]{1,3})?",
        "[0-9a-f:]{2,39}(/[0-9]{1,3})?",
        "[ ]?[+]?[0-9 ()\\-]{0,22}[*]{1,2}[0-9]{0,2}[ ]?",
        "[ ]?[A-Za-z0-9.+_-]{0,12}@{0,3}[A-Za-z0-9.-]{0,20}[.]?[ ]?",
        "\\PC{0,8}@\\PC{0,12}",
        "[A-Za-z.+]{0,6}@[ÄäÜüßẞİıΣσς.]{1,12}\\.[a-z]{2,3}",
    ]
}

/// A random entry: (list, dimension, sandbox, normalised value).
fn random_entry() -> impl Strategy<Value = (ListName, Dimension, Sandbox, Value)> {
    (
        "[a-z0-9_-]{1,32}",
        "[A-Za-z0-9_-]{1,64}",
        dimension_and_valid_raw(),
    )
        .prop_map(|(list, sandbox, (dim, raw))| {
            let value = entry(&dim, &raw).expect("the valid-value strategies give valid values");
            (
                list.parse().expect("a list name"),
                dim,
                sandbox.parse().expect("a sandbox"),
                value,
            )
        })
}

// ---------------------------------------------------------------------------------------------
// 1. Normalisation
// ---------------------------------------------------------------------------------------------

/// (a) Normalising a normalised value changes nothing, for entries and for checks, and a value
/// that is valid to check is valid, and the same, as an entry.
fn assert_idempotent(dim: &Dimension, raw: &str) -> Result<(), TestCaseError> {
    let e = entry(dim, raw);
    if let Ok(v) = &e {
        let text = v.to_string();
        let again = entry(dim, &text);
        prop_assert_eq!(
            again.as_ref(),
            Ok(v),
            "{} entry {:?} normalised to {:?}, which re-normalises differently",
            dim,
            raw,
            text
        );
        prop_assert_eq!(
            text.trim(),
            text.as_str(),
            "{} entry {:?}: canonical text has surrounding whitespace",
            dim,
            raw
        );
    }
    let c = check(dim, raw);
    if let Ok(v) = &c {
        let text = v.to_string();
        let again = check(dim, &text);
        prop_assert_eq!(
            again.as_ref(),
            Ok(v),
            "{} check {:?} normalised to {:?}, which re-normalises differently",
            dim,
            raw,
            text
        );
        prop_assert_eq!(
            shown(&e),
            shown(&c),
            "{} {:?}: valid as a check but normalised differently as an entry",
            dim,
            raw
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn normalisation_is_idempotent_on_arbitrary_strings(raw in near_miss()) {
        for dim in all_dimensions() {
            assert_idempotent(&dim, &raw)?;
        }
    }

    #[test]
    fn normalisation_is_idempotent_on_valid_values((dim, raw) in dimension_and_valid_raw()) {
        let e = entry(&dim, &raw);
        prop_assert!(e.is_ok(), "{} {:?} should be a valid entry, got {:?}", dim, raw, shown(&e));
        assert_idempotent(&dim, &raw)?;
    }
}

/// (b) Every decorated form of one value normalises to the value's canonical text.
fn assert_forms_agree(dim: &Dimension, canon: &str, forms: &[String]) -> Result<(), TestCaseError> {
    let want = entry(dim, canon);
    prop_assert_eq!(
        shown(&want),
        Ok(canon.to_owned()),
        "{} canonical {:?} should normalise to itself",
        dim,
        canon
    );
    for raw in forms {
        prop_assert_eq!(
            shown(&entry(dim, raw)),
            Ok(canon.to_owned()),
            "{} entry {:?} should normalise to {:?}",
            dim,
            raw,
            canon
        );
        // CIDR notation (even a /32) is for entries only.
        let cidr = dim == &Dimension::Ip && raw.contains('/');
        if !cidr {
            prop_assert_eq!(
                shown(&check(dim, raw)),
                Ok(canon.to_owned()),
                "{} check {:?} should normalise to {:?}",
                dim,
                raw,
                canon
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn phone_separators_and_whitespace_do_not_matter((canon, forms) in phone_forms()) {
        assert_forms_agree(&Dimension::Phone, &canon, &forms)?;
    }

    #[test]
    fn phone_plus_is_significant(digits in "[0-9]{5,20}") {
        let with = entry(&Dimension::Phone, &format!("+{digits}"));
        let without = entry(&Dimension::Phone, &digits);
        prop_assert!(
            with.is_ok() && without.is_ok() && with != without,
            "+{} and {} are different numbers as dialled: {:?} vs {:?}",
            digits, digits, shown(&with), shown(&without)
        );
    }

    /// API.md: "spaces, `-`, `(`, `)` removed; optional leading `+`". Once the separators are
    /// removed, a `+` that only separators preceded is the leading `+`: the everyday
    /// "(+86) 138-0000-0000" is "+8613800000000".
    #[test]
    fn phone_plus_inside_parentheses_is_leading(
        lead in "[ ]?[(][ ]?",
        cc in "[1-9][0-9]{0,2}",
        close in "[)][ \\-]?",
        number in "[0-9]{4,12}",
    ) {
        let raw = format!("{lead}+{cc}{close}{number}");
        prop_assert_eq!(
            shown(&entry(&Dimension::Phone, &raw)),
            Ok(format!("+{cc}{number}")),
            "phone {:?}: removing spaces, -, ( and ) leaves a leading +",
            raw
        );
    }

    #[test]
    fn id_card_case_and_whitespace_do_not_matter((canon, forms) in id_card_forms()) {
        assert_forms_agree(&Dimension::IdCard, &canon, &forms)?;
    }

    #[test]
    fn imei_separators_do_not_matter((canon, forms) in imei_forms()) {
        assert_forms_agree(&Dimension::Imei, &canon, &forms)?;
    }

    #[test]
    fn wifi_mac_spelling_and_case_do_not_matter((canon, forms) in wifi_mac_forms()) {
        assert_forms_agree(&Dimension::WifiMac, &canon, &forms)?;
    }

    #[test]
    fn ip_spelling_and_host_bits_do_not_matter((canon, forms) in ip_forms()) {
        assert_forms_agree(&Dimension::Ip, &canon, &forms)?;
    }

    #[test]
    fn text_is_trimmed_and_case_sensitive(
        dim in prop_oneof![
            Just(Dimension::Uid),
            Just(Dimension::Device),
            "[a-z][a-z0-9_]{0,31}".prop_map(|s| s.parse::<Dimension>().expect("a dimension")),
        ].prop_filter("opaque text dimensions", |d| {
            matches!(d, Dimension::Uid | Dimension::Device | Dimension::Custom(_))
        }),
        (canon, forms) in text_forms(),
    ) {
        assert_forms_agree(&dim, &canon, &forms)?;
        let upper = canon.to_uppercase();
        if upper != canon && upper.len() <= 256 {
            prop_assert_ne!(
                entry(&dim, &upper),
                entry(&dim, &canon),
                "{} is case-sensitive: {:?} and {:?} are different values",
                dim, upper, canon
            );
        }
    }
}

/// (c) The error of an invalid value: `invalid_value`, naming the dimension.
fn assert_invalid(
    dim: &Dimension,
    raw: &str,
    r: Result<Value, ValidationError>,
) -> Result<ValidationError, TestCaseError> {
    let err = match r {
        Ok(v) => {
            return Err(TestCaseError::fail(format!(
                "{dim} {raw:?} should be rejected, normalised to {v}"
            )));
        }
        Err(e) => e,
    };
    prop_assert_eq!(
        err.code,
        "invalid_value",
        "{} {:?}: {}",
        dim,
        raw,
        err.message
    );
    let prefix = format!("invalid {dim}: ");
    prop_assert!(
        err.message.starts_with(&prefix),
        "{} {:?}: message {:?} should start with {:?}",
        dim,
        raw,
        err.message,
        prefix
    );
    Ok(err)
}

/// Invalid values of `dim`, rejected both as entries and as checks; the message never echoes a
/// run of 5 or more characters of the value.
fn assert_rejected(dim: &Dimension, raw: &str) -> Result<(), TestCaseError> {
    for r in [entry(dim, raw), check(dim, raw)] {
        let err = assert_invalid(dim, raw, r)?;
        let core = raw.trim();
        if core.len() >= 5 {
            prop_assert!(
                !err.message.contains(core),
                "{} {:?}: the message {:?} echoes the value",
                dim,
                raw,
                err.message
            );
        }
    }
    Ok(())
}

/// Invalid phones: a letter or other character, too few or too many digits, a misplaced `+`.
fn invalid_phone() -> impl Strategy<Value = String> {
    prop_oneof![
        ("[0-9]{3,10}", "[a-zA-Z.,/#*_]", "[0-9]{3,10}").prop_map(|(a, x, b)| format!("{a}{x}{b}")),
        "[+]?[ (]?[0-9]{0,4}[ )]?",
        "[+]?[0-9]{21,30}",
        "[+]?[0-9 ]{0,3}-?[0-9]{21,24}",
        ("[0-9]{1,10}", "[0-9]{4,10}").prop_map(|(a, b)| format!("{a}+{b}")),
        "\\+\\+[0-9]{5,12}",
        "[0-9]{5,12}\\+",
    ]
}

fn invalid_id_card() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9A-Za-z]{0,3}",
        "[0-9A-Za-z]{33,40}",
        ("[0-9A-Z]{2,10}", "[ ._/\\-é]", "[0-9A-Z]{2,10}")
            .prop_map(|(a, x, b)| format!("{a}{x}{b}")),
    ]
}

fn invalid_imei() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,13}",
        "[0-9]{17,25}",
        "[0-9]{4}[ \\-][0-9]{4}[ \\-][0-9]{4}",
        ("[0-9]{7}", "[a-zA-Z.+/]", "[0-9]{7}").prop_map(|(a, x, b)| format!("{a}{x}{b}")),
    ]
}

fn invalid_wifi_mac() -> impl Strategy<Value = String> {
    prop_oneof![
        // Wrong number of hex digits.
        "[0-9a-f]{0,11}",
        "[0-9a-f]{13,20}",
        "[0-9a-f]{2}(:[0-9a-f]{2}){4}",
        "[0-9a-f]{2}(-[0-9a-f]{2}){6}",
        "[0-9a-f]{4}\\.[0-9a-f]{4}",
        // A non-hex digit.
        "[g-z][0-9a-f](:[0-9a-f]{2}){5}",
        "[0-9a-f]{11}[g-zG-Z]",
        // Mixed or misplaced separators.
        "[0-9a-f]{2}-[0-9a-f]{2}(:[0-9a-f]{2}){4}",
        "[0-9a-f]{2}(\\.[0-9a-f]{2}){5}",
        "[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}",
        "[0-9a-f]{6}:[0-9a-f]{6}",
    ]
}

fn invalid_ip() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u8..=255, 0u8..=255, 0u8..=255, 256u16..=999)
            .prop_map(|(a, b, c, d)| format!("{a}.{b}.{c}.{d}")),
        (ipv4(), 33u16..=999).prop_map(|(a, p)| format!("{a}/{p}")),
        (ipv6(), 129u16..=999).prop_map(|(a, p)| format!("{a}/{p}")),
        ipv4().prop_map(|a| format!("{a}/")),
        ipv4().prop_map(|a| format!("{a}/-1")),
        (ipv4(), "[+ ][0-9]{1,2}").prop_map(|(a, p)| format!("{a}/{p}")),
        "[0-9]{1,3}(\\.[0-9]{1,3}){1,2}",
        "[g-z]{1,8}",
        "1:2:3:4:5:6:7:8:9",
    ]
}

fn invalid_text() -> impl Strategy<Value = String> {
    prop_oneof![
        ws(),
        "[a-z]{257,300}",
        "[é]{129,140}",
        "[ ]{0,2}[!-~]{257,260}[ ]{0,2}"
    ]
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn invalid_phones_are_rejected(raw in invalid_phone()) {
        assert_rejected(&Dimension::Phone, &raw)?;
    }

    #[test]
    fn invalid_id_cards_are_rejected(raw in invalid_id_card()) {
        assert_rejected(&Dimension::IdCard, &raw)?;
    }

    #[test]
    fn invalid_imeis_are_rejected(raw in invalid_imei()) {
        assert_rejected(&Dimension::Imei, &raw)?;
    }

    #[test]
    fn invalid_wifi_macs_are_rejected(raw in invalid_wifi_mac()) {
        assert_rejected(&Dimension::WifiMac, &raw)?;
    }

    #[test]
    fn invalid_ips_are_rejected(raw in invalid_ip()) {
        assert_rejected(&Dimension::Ip, &raw)?;
    }

    #[test]
    fn ranges_are_rejected_in_checks((canon, forms) in ip_forms()) {
        for raw in forms.iter().filter(|f| f.contains('/')) {
            let err = assert_invalid(&Dimension::Ip, raw, check(&Dimension::Ip, raw))?;
            prop_assert!(err.message.contains("range"), "check {:?} ({}): {}", raw, canon, err.message);
        }
    }

    #[test]
    fn invalid_texts_are_rejected(dim in dimension(), raw in invalid_text()) {
        if matches!(dim, Dimension::Uid | Dimension::Device | Dimension::Custom(_)) {
            for r in [entry(&dim, &raw), check(&dim, &raw)] {
                assert_invalid(&dim, &raw, r)?;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. The field: a signed decimal i64
// 3. The bucket: in 0..N, and N = ceil(entries / 200)
//    (the layout's mean fill; the issue allows at most 400)
// Both as the layout formats document them: format 2 (keyed, `store::fingerprint`) and
// format 1 (unkeyed xxh3_64 field, crc32 bucket).
// ---------------------------------------------------------------------------------------------

/// Key material of the keyed layout (as hex in a key file).
const KEY: &str = "00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210";

/// Format 2's (bucket, field), from the documented derivation alone: subkey = the first 16
/// bytes of SHA-256("namelist fingerprint v1" 0 "entry" 0 key); SipHash-2-4-128 of the
/// canonical bytes; field = the low 64 bits, bucket = the high 64 bits mod N.
fn keyed_oracle(bytes: &[u8], buckets: u32) -> (u32, i64) {
    use sha2::Digest;
    let material: Vec<u8> = (0..KEY.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&KEY[i..i + 2], 16).unwrap())
        .collect();
    let mut h = sha2::Sha256::new();
    h.update(b"namelist fingerprint v1\0entry\0");
    h.update(&material);
    let digest = h.finalize();
    let mut k = [0u8; 16];
    k.copy_from_slice(&digest[..16]);
    let out = siphasher::sip128::SipHasher24::new_with_key(&k).hash(bytes);
    ((out.h2 % u64::from(buckets)) as u32, out.h1 as i64)
}

/// Format 1's (bucket, field): crc32 % N, xxh3_64.
fn unkeyed_oracle(bytes: &[u8], buckets: u32) -> (u32, i64) {
    (
        crc32fast::hash(bytes) % buckets,
        xxhash_rust::xxh3::xxh3_64(bytes) as i64,
    )
}

type Oracle = fn(&[u8], u32) -> (u32, i64);

/// Both layouts of `buckets` buckets, each with its oracle.
fn layouts(prefix: &str, buckets: u32) -> [(Layout, Oracle); 2] {
    let key = FingerprintKey::from_hex(KEY, "props").unwrap();
    [
        (
            Layout::new(prefix, buckets, Hashing::Keyed(key)),
            keyed_oracle as Oracle,
        ),
        (
            Layout::new(prefix, buckets, Hashing::Unkeyed),
            unkeyed_oracle as Oracle,
        ),
    ]
}

/// The mean bucket fill the bucket count is sized for.
const FILL: u64 = 200;

fn bucket_count() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(1u32),
        Just(2),
        Just(u32::MAX),
        1u32..=16,
        1u32..=100_000,
        1u32..=u32::MAX,
    ]
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn field_is_the_format_hash_as_a_signed_decimal_i64(
        (list, dim, sandbox, value) in random_entry(),
        buckets in bucket_count(),
    ) {
        let bytes = canonical(&list, &dim, &sandbox, &value);
        let expected = format!("{list}\n{dim}\n{sandbox}\n{value}");
        prop_assert_eq!(
            bytes.as_slice(),
            expected.as_bytes(),
            "canonical bytes are <list> \\n <dimension> \\n <sandbox> \\n <value>"
        );
        for (layout, oracle) in layouts("nl:", buckets) {
        let key = layout.entry_key(&list, &dim, &sandbox, &value);
        let hash = oracle(&bytes, buckets).1 as u64;
        prop_assert_eq!(key.field, hash as i64, "field of {:?} in format {} is the format's 64-bit hash as i64", expected, layout.format());

        let args = redis::ToRedisArgs::to_redis_args(&key.field);
        prop_assert_eq!(args.len(), 1, "field {} should be one Redis argument, got {:?}", key.field, args);
        let arg = &args[0];
        let text = std::str::from_utf8(arg);
        prop_assert!(text.is_ok(), "field {} argument {:?} is not UTF-8", key.field, arg);
        let text = text.unwrap_or_default();
        let digits = text.strip_prefix('-').unwrap_or(text);
        prop_assert!(
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
            "field argument {:?} should be -?[0-9]+", text
        );
        prop_assert!(
            digits == "0" || !digits.starts_with('0'),
            "field argument {:?} has a leading zero (Redis would keep it a string)", text
        );
        prop_assert!(text != "-0", "field argument is -0");
        prop_assert!(text.len() <= 20, "field argument {:?} is longer than 20 bytes", text);
        prop_assert_eq!(text.parse::<i64>().ok(), Some(key.field), "field argument {:?} parses back", text);

        let fingerprint = key.fingerprint();
        prop_assert_eq!(fingerprint.len(), 16, "fingerprint {:?} is 16 hex digits", fingerprint);
        prop_assert_eq!(
            u64::from_str_radix(&fingerprint, 16).ok(),
            Some(hash),
            "fingerprint {:?} is the unsigned hash in hex", fingerprint
        );
        }
    }

    #[test]
    fn bucket_is_the_format_hash_mod_n_and_in_range(
        (list, dim, sandbox, value) in random_entry(),
        buckets in bucket_count(),
    ) {
        let bytes = canonical(&list, &dim, &sandbox, &value);
        for (layout, oracle) in layouts("nl:", buckets) {
            let key = layout.entry_key(&list, &dim, &sandbox, &value);
            prop_assert!(key.bucket < buckets, "bucket {} out of range for N = {}", key.bucket, buckets);
            prop_assert_eq!(
                key.bucket,
                oracle(&bytes, buckets).0,
                "bucket of {:?} with N = {} in format {}", String::from_utf8_lossy(&bytes), buckets, layout.format()
            );
            prop_assert_eq!(layout.key_of(&bytes), key, "key_of(canonical) == entry_key");
            prop_assert_eq!(layout.bucket_key(key.bucket), format!("nl:b:{}", key.bucket), "bucket key name");
        }
    }

    #[test]
    fn key_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300), buckets in bucket_count()) {
        for (layout, oracle) in layouts("p:", buckets) {
            let key = layout.key_of(&bytes);
            prop_assert!(key.bucket < buckets, "bucket {} out of range for N = {}", key.bucket, buckets);
            prop_assert_eq!((key.bucket, key.field), oracle(&bytes, buckets), "format {}", layout.format());
        }
    }

    #[test]
    fn buckets_for_keeps_mean_fill_at_most_the_fill(
        expected in prop_oneof![
            Just(0u64),
            Just(FILL),
            Just(401),
            Just(FILL * u64::from(u32::MAX)),
            Just(FILL * u64::from(u32::MAX) + 1),
            Just(u64::MAX),
            0u64..=5_000,
            0u64..=FILL * u64::from(u32::MAX),
            any::<u64>(),
        ],
    ) {
        let n = Layout::buckets_for(expected);
        let ceil = u128::from(expected).div_ceil(u128::from(FILL)).max(1);
        if ceil <= u128::from(u32::MAX) {
            prop_assert_eq!(u128::from(n), ceil, "buckets_for({}) == max(1, ceil({} / 200))", expected, expected);
            prop_assert!(
                u128::from(expected) <= u128::from(FILL) * u128::from(n),
                "buckets_for({}) = {}: mean fill {} > 200", expected, n, expected / u64::from(n)
            );
            prop_assert!(
                n == 1 || u128::from(expected) > u128::from(FILL) * u128::from(n - 1),
                "buckets_for({}) = {} is not the fewest buckets", expected, n
            );
        } else {
            prop_assert_eq!(n, u32::MAX, "buckets_for({}) saturates at u32::MAX", expected);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Expiry encoding
// ---------------------------------------------------------------------------------------------

/// (now, expires_at): now in [2021, 2100), expires_at in (now, 2150], often within a few
/// seconds of now so that the rounding to whole seconds is exercised.
fn now_and_expiry() -> impl Strategy<Value = (i64, i64)> {
    (
        Y2021_MS..Y2100_MS,
        prop_oneof![
            1i64..=3_000,
            1i64..=86_400_000,
            1i64..=(Y2150_MS - Y2021_MS)
        ],
    )
        .prop_map(|(now, delta)| (now, (now + delta).min(Y2150_MS)))
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn expiry_rounds_up_to_a_whole_second(
        (now, at) in now_and_expiry(),
        probe in any::<prop::sample::Index>(),
    ) {
        let e = Expiry::at_ms(at, now);
        prop_assert!(e.is_ok(), "at_ms({}, {}) should be Ok, got {:?}", at, now, e);
        let e = e.unwrap_or(Expiry::Never);
        prop_assert!(e.code() >= 1, "code of {:?} is at least 1", e);
        prop_assert_eq!(Expiry::from_code(e.code()), e, "from_code(code) round-trips");

        let stored = e.expires_at_ms();
        prop_assert!(stored.is_some(), "{:?} expires", e);
        let stored = stored.unwrap_or_default();
        prop_assert!(
            at <= stored && stored < at + 1000,
            "expires_at {} stored as {}: should round up to within a second", at, stored
        );
        prop_assert_eq!((stored - EPOCH_2020_MS) % 1000, 0, "stored expiry {} is a whole second", stored);
        prop_assert_eq!(
            i64::from(e.code()),
            (stored - EPOCH_2020_MS) / 1000,
            "code is seconds since 2020"
        );

        // Live strictly before the stored expiry, dead at and after it.
        let t = now + probe.index(usize::try_from(stored - now + 2_000).unwrap_or(usize::MAX)) as i64;
        prop_assert_eq!(e.is_live(t), t < stored, "is_live({}) with expiry at {}", t, stored);
        prop_assert!(e.is_live(stored - 1), "live 1 ms before {}", stored);
        prop_assert!(!e.is_live(stored), "not live at {}", stored);
        prop_assert!(e.is_live(now), "live at now {} (expiry {})", now, stored);

        if at < Y2088_MS {
            prop_assert!(e.code() < 1 << 31, "an expiry before 2088 ({}) fits in 31 bits: {}", at, e.code());
        }
    }

    #[test]
    fn expiry_at_or_before_now_is_rejected(now in Y2021_MS..Y2100_MS, back in 0i64..=10_000_000_000) {
        let r = Expiry::at_ms(now - back, now);
        prop_assert_eq!(
            r.as_ref().map_err(|e| e.code.as_str()),
            Err("expiry_in_past"),
            "at_ms({}, {}) is in the past: {:?}", now - back, now, r
        );
    }

    #[test]
    fn after_ttl_is_at_ms_of_now_plus_ttl(
        now in Y2021_MS..Y2100_MS,
        ttl in prop_oneof![1u64..=10, 1u64..=86_400 * 365, 1u64..=((Y2150_MS - Y2021_MS) / 1000) as u64],
    ) {
        let ttl_ms = i64::try_from(ttl).unwrap_or(i64::MAX) * 1000;
        let at = now + ttl_ms;
        prop_assume!(at <= Y2150_MS);
        let relative = Expiry::after_ttl(ttl, now);
        let absolute = Expiry::at_ms(at, now);
        prop_assert!(relative.is_ok(), "after_ttl({}, {}) should be Ok: {:?}", ttl, now, relative);
        prop_assert_eq!(relative, absolute, "after_ttl({}, {}) == at_ms({}, {})", ttl, now, at, now);
    }
}

#[test]
fn expiry_epoch_constants() {
    // The constants above are what they say they are (seconds since 2020 stay below 2^31
    // until 2088-01-19).
    assert_eq!(EPOCH_2020_MS, 1_577_836_800_000);
    assert_eq!((Y2088_MS - EPOCH_2020_MS) / 1000 / 86_400, 68 * 365 + 17);
    const {
        assert!((Y2088_MS - EPOCH_2020_MS) / 1000 < 1 << 31);
        assert!((Y2150_MS - EPOCH_2020_MS) / 1000 < u32::MAX as i64);
    }
}

// ---------------------------------------------------------------------------------------------
// 5. IP ranges
// ---------------------------------------------------------------------------------------------

/// An address (IPv4 or non-mapped IPv6), a prefix length for its family and random host bits.
fn addr_prefix_host() -> impl Strategy<Value = (IpAddr, u8, u128)> {
    prop_oneof![
        (ipv4(), 0u8..=32, any::<u128>()).prop_map(|(a, p, h)| (IpAddr::V4(a), p, h)),
        (ipv6(), 0u8..=128, any::<u128>()).prop_map(|(a, p, h)| (IpAddr::V6(a), p, h)),
    ]
}

/// The address with the top `p` bits of `addr` and the rest from `host`.
fn inside(addr: IpAddr, p: u8, host: u128) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let net = mask_v4(u32::from(a), p);
            IpAddr::V4(Ipv4Addr::from(net | (host as u32 & !mask_v4(u32::MAX, p))))
        }
        IpAddr::V6(a) => {
            let net = mask_v6(u128::from(a), p);
            IpAddr::V6(Ipv6Addr::from(net | (host & !mask_v6(u128::MAX, p))))
        }
    }
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn ip_networks((addr, p, host) in addr_prefix_host()) {
        let net = IpValue::network(addr, p);
        prop_assert_eq!(net.prefix(), p, "network({}, {}) keeps the prefix", addr, p);
        prop_assert_eq!(IpValue::network(net.addr(), p), net, "network({}, {}) is idempotent", addr, p);
        prop_assert_eq!(net.within(p), net, "network({}, {}).within({}) is itself", addr, p, p);
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        prop_assert_eq!(net.is_range(), p < max, "network({}, {}) is a range iff p < {}", addr, p, max);
        let expected_addr = match addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(mask_v4(u32::from(a), p))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(mask_v6(u128::from(a), p))),
        };
        prop_assert_eq!(net.addr(), expected_addr, "network({}, {}) clears the host bits", addr, p);

        let raw = format!("{addr}/{p}");
        prop_assert_eq!(
            entry(&Dimension::Ip, &raw),
            Ok(Value::Ip(net)),
            "entry {:?} is network({}, {})", raw, addr, p
        );

        // Any address inside the network probes to it.
        let a = inside(addr, p, host);
        let probe = check(&Dimension::Ip, &a.to_string());
        prop_assert!(probe.is_ok(), "check {} should be Ok: {:?}", a, probe);
        let probe = probe.ok().and_then(|v| v.as_ip().copied());
        prop_assert_eq!(
            probe.map(|ip| ip.within(p)),
            Some(net),
            "{} is inside {}, so within({}) should give it", a, net, p
        );
        prop_assert_eq!(
            probe.map(|ip| (ip.is_range(), ip.prefix())),
            Some((false, max)),
            "a checked address is a single address"
        );
    }

    #[test]
    fn ipv4_mapped_addresses_probe_ipv4_ranges(a in ipv4(), p in 0u8..=32, host in any::<u32>()) {
        let net = IpValue::network(IpAddr::V4(a), p);
        let mapped_range = format!("::ffff:{a}/{}", u16::from(p) + 96);
        prop_assert_eq!(
            entry(&Dimension::Ip, &mapped_range),
            Ok(Value::Ip(net)),
            "entry {:?} is the IPv4 range {}", mapped_range, net
        );
        let b = inside(IpAddr::V4(a), p, u128::from(host));
        let IpAddr::V4(b4) = b else {
            return Err(TestCaseError::fail("inside() of an IPv4 address is IPv4"));
        };
        for spelling in ipv4_mapped_spellings(&b4) {
            let probe = check(&Dimension::Ip, &spelling).ok().and_then(|v| v.as_ip().copied());
            prop_assert_eq!(
                probe.map(|ip| ip.within(p)),
                Some(net),
                "check {:?} ({} inside {}) should probe the IPv4 range", spelling, b, net
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Phone segments and e-mail domains: spellings, bad input, and each probe against a
//    brute-force oracle (a segment lists the phones it prefixes; a domain entry lists the
//    addresses at it or at any subdomain)
// ---------------------------------------------------------------------------------------------

/// `phone` segments: optional `+`, 1-19 digits, a phone's separators, then `*`.
fn segment_forms() -> impl Strategy<Value = Forms> {
    let decoration = (ws(), prop::collection::vec("[ ()\\-]{0,2}", 1..21), ws());
    (
        any::<bool>(),
        "[0-9]{1,19}",
        prop::collection::vec(decoration, 1..5),
    )
        .prop_map(|(plus, digits, decorations)| {
            let plus = if plus { "+" } else { "" };
            let forms = decorations
                .iter()
                .map(|(l, seps, r)| format!("{l}{plus}{}*{r}", interleave(&digits, seps)))
                .collect();
            (format!("{plus}{digits}*"), forms)
        })
}

fn invalid_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ ]?[+]?[ ()\\-]{0,3}[*][ ]?",
        "[+]?[0-9]{20,25}[*]",
        ("[0-9]{1,8}", "[0-9]{1,8}").prop_map(|(a, b)| format!("{a}*{b}")),
        ("[0-9]{1,8}", "[*]{1,3}").prop_map(|(a, b)| format!("{a}*{b}")),
        "[0-9]{1,5}[a-z#.][0-9]{0,3}[*]",
        "[0-9]{1,5}[+][0-9]{0,3}[*]",
    ]
}

fn invalid_email() -> impl Strategy<Value = String> {
    prop_oneof![
        // Not exactly one @.
        "[a-z]{1,8}\\.[a-z]{2,4}",
        "[a-z]{1,8}@[a-z]{1,8}@[a-z]{1,8}\\.com",
        "@@[a-z]{1,8}\\.com",
        // An empty, overlong or spaced local part; nothing left after the tag.
        "[a-z]{65,80}@example\\.com",
        "[a-z]{1,8} [a-z]{1,8}@example\\.com",
        "[+][a-z]{0,8}@example\\.com",
        "[.]{1,4}@gmail\\.com",
        // A domain without a dot, over 253 bytes, with a bad label.
        "@?[a-z]{1,8}@?[a-z]{1,20}".prop_filter("one @ at most", |s| s.matches('@').count() <= 1),
        "[a-z]{1,8}@([a-z]{9}\\.){26}com",
        "[a-z]{1,8}@[a-z]{64,70}\\.com",
        "[a-z]{1,8}@([a-z]{1,5}\\.){0,2}[-_][a-z]{1,5}\\.com",
        "[a-z]{1,8}@[a-z]{1,5}\\.\\.[a-z]{2,3}",
        "[a-z]{1,8}@\\[[0-9]{1,3}(\\.[0-9]{1,3}){3}\\]",
        // Domain entries: no dot, over 10 labels.
        "@[a-z]{1,12}",
        "@([a-z]{1,3}\\.){10,12}[a-z]{2,3}",
    ]
}

/// A phone, and a segment that prefixes it in about half of the cases.
fn phone_and_segment() -> impl Strategy<Value = (String, String)> {
    (
        "[+]?[0-9]{5,20}",
        any::<bool>(),
        1usize..=20,
        "[+]?[0-9]{1,19}",
    )
        .prop_map(|(phone, take, cut, other)| {
            let cut = cut.min(phone.len());
            let prefix = &phone[..cut];
            let digits = prefix.bytes().filter(u8::is_ascii_digit).count();
            let seg = if take && (1..=19).contains(&digits) {
                prefix.to_owned()
            } else {
                other
            };
            (phone, seg)
        })
}

/// An address on a domain of up to 13 labels, and a domain entry that it is at (or below)
/// in about half of the cases.
fn address_and_domain() -> impl Strategy<Value = (String, String)> {
    (
        "[a-z0-9]{1,8}",
        prop::collection::vec("[a-c]{1,2}", 2..14),
        any::<bool>(),
        0usize..14,
        prop::collection::vec("[a-c]{1,2}", 2..5),
    )
        .prop_map(|(local, labels, take, skip, other)| {
            let domain = labels.join(".");
            let entry = if take {
                labels[skip.min(labels.len() - 2)..].join(".")
            } else {
                other.join(".")
            };
            (format!("{local}@{domain}"), entry)
        })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn segment_spellings_agree((canon, forms) in segment_forms()) {
        prop_assert_eq!(shown(&entry(&Dimension::Phone, &canon)), Ok(canon.clone()));
        for raw in &forms {
            prop_assert_eq!(shown(&entry(&Dimension::Phone, raw)), Ok(canon.clone()), "entry {:?}", raw);
            let err = assert_invalid(&Dimension::Phone, raw, check(&Dimension::Phone, raw))?;
            prop_assert!(err.message.contains("segments"), "check {:?}: {}", raw, err.message);
        }
    }

    #[test]
    fn invalid_segments_are_rejected(raw in invalid_segment()) {
        assert_rejected(&Dimension::Phone, &raw)?;
    }

    #[test]
    fn invalid_emails_are_rejected(raw in invalid_email()) {
        assert_rejected(&Dimension::Email, &raw)?;
    }

    #[test]
    fn email_spellings_agree((canon, forms) in prop_oneof![email_forms(), gmail_forms()]) {
        assert_forms_agree(&Dimension::Email, &canon, &forms)?;
    }

    /// The probes of a phone find a segment exactly when the phone starts with it.
    #[test]
    fn a_segment_lists_exactly_the_phones_it_prefixes((phone, seg) in phone_and_segment()) {
        let listed = entry(&Dimension::Phone, &format!("{seg}*")).expect("a valid segment");
        let probe = check(&Dimension::Phone, &phone).expect("a valid phone");
        let found = (1..=20).any(|len| probe.phone_segment(len).as_ref() == Some(&listed));
        prop_assert_eq!(found, phone.starts_with(&seg), "phone {} segment {}*", phone, seg);
    }

    /// The probes of an address find a domain entry exactly when the address is at that
    /// domain or below it, and the entry has at most 10 labels.
    #[test]
    fn a_domain_lists_exactly_the_addresses_at_or_below_it((address, domain) in address_and_domain()) {
        let listed = entry(&Dimension::Email, &format!("@{domain}"));
        let probe = check(&Dimension::Email, &address).expect("a valid address");
        let at = &address[address.find('@').unwrap() + 1..];
        let below = at == domain || at.ends_with(&format!(".{domain}"));
        let labels = domain.split('.').count();
        match listed {
            Ok(listed) => {
                prop_assert!(labels <= 10);
                let found = (0..=20).any(|n| probe.email_domain_suffix(n).as_ref() == Some(&listed));
                prop_assert_eq!(found, below, "address {} domain {}", address, domain);
            }
            Err(e) => prop_assert!(labels > 10, "@{} refused: {}", domain, e.message),
        }
    }
}
