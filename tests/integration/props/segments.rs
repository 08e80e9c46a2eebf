//! Section 6 of the properties, phone segments and e-mail domains: spellings, bad input, and
//! each probe against a brute-force oracle (a segment lists the phones it prefixes; a domain
//! entry lists the addresses at it or at any subdomain).

use namelist::domain::Dimension;
use proptest::prelude::*;

use super::forms::{email_forms, gmail_forms};
use super::normalisation::{assert_forms_agree, assert_invalid, assert_rejected};
use super::{Forms, check, config, entry, interleave, shown, ws};

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
