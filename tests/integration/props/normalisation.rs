//! Section 1 of the properties, normalisation: (a) idempotent on arbitrary strings and on
//! valid values; (b) every form of a value normalises to its canonical text; (c) invalid values
//! of each dimension are rejected (and ranges in checks).

use namelist::domain::{Dimension, ValidationError, Value};
use proptest::prelude::*;

use super::forms::{
    dimension_and_valid_raw, id_card_forms, imei_forms, ip_forms, ipv4, ipv6, near_miss,
    phone_forms, text_forms, wifi_mac_forms,
};
use super::{all_dimensions, check, config, dimension, entry, shown, ws};

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
pub(super) fn assert_forms_agree(
    dim: &Dimension,
    canon: &str,
    forms: &[String],
) -> Result<(), TestCaseError> {
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
pub(super) fn assert_invalid(
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
pub(super) fn assert_rejected(dim: &Dimension, raw: &str) -> Result<(), TestCaseError> {
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
