//! Valid values, canonical and decorated: for each dimension, a canonical value and forms of it
//! typed differently (the generators the properties draw from).

use std::net::{Ipv4Addr, Ipv6Addr};

use namelist::domain::{Dimension, ListName, Sandbox, Value};
use proptest::prelude::*;
use proptest::sample::select;

use super::{Forms, dimension, entry, flips, interleave, random_case, ws};

/// `phone`: optional leading `+`, 5-20 digits; spaces, `-`, `(`, `)` anywhere after the `+`,
/// whitespace around.
pub(super) fn phone_forms() -> impl Strategy<Value = Forms> {
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
pub(super) fn id_card_forms() -> impl Strategy<Value = Forms> {
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
pub(super) fn imei_forms() -> impl Strategy<Value = Forms> {
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
pub(super) fn wifi_mac_forms() -> impl Strategy<Value = Forms> {
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

pub(super) fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    prop::array::uniform4(octet()).prop_map(Ipv4Addr::from)
}

/// An IPv6 address that is not IPv4-mapped, with runs of zero groups (so that `::` compression
/// and its placement matter) and `ffff` groups.
pub(super) fn ipv6() -> impl Strategy<Value = Ipv6Addr> {
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
pub(super) fn ipv4_mapped_spellings(a: &Ipv4Addr) -> Vec<String> {
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
pub(super) fn mask_v4(bits: u32, p: u8) -> u32 {
    bits & u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0)
}

pub(super) fn mask_v6(bits: u128, p: u8) -> u128 {
    bits & u128::MAX.checked_shl(128 - u32::from(p)).unwrap_or(0)
}

/// `ip`: an address typed several ways, or a CIDR range with random host bits.
pub(super) fn ip_forms() -> impl Strategy<Value = Forms> {
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
pub(super) fn text_forms() -> impl Strategy<Value = Forms> {
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
pub(super) fn email_forms() -> impl Strategy<Value = Forms> {
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
pub(super) fn gmail_forms() -> impl Strategy<Value = Forms> {
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

pub(super) fn forms(dim: &Dimension) -> BoxedStrategy<Forms> {
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
pub(super) fn dimension_and_valid_raw() -> impl Strategy<Value = (Dimension, String)> {
    dimension().prop_flat_map(|d| {
        let raw = forms(&d).prop_flat_map(|(_, forms)| select(forms));
        (Just(d), raw)
    })
}

/// Strings that are mostly invalid but close to the parsers' alphabets, so that the `Ok`
/// branch of the idempotence properties is not only reached through valid generators.
pub(super) fn near_miss() -> impl Strategy<Value = String> {
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
pub(super) fn random_entry() -> impl Strategy<Value = (ListName, Dimension, Sandbox, Value)> {
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
