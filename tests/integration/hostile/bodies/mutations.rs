//! Cases made from each endpoint's example: truncations, syntax, wrong types, numbers,
//! nesting, invalid UTF-8, oversize values; and huge arrays of small items.

use std::sync::Arc;

use serde_json::{Value, json};

use super::corpus::{
    BAD, BAD_BODY, BAD_JSON, BAD_UTF8, Case, Endpoint, Expect, KINDS, Kind, NOT_NUMBERS, NUMBERS,
    Num, OK, SURROGATES, deep_object, json_bytes, kind_of, number_status, quoted, splice,
    splice_member,
};
use crate::hostile::client::Framing;
use crate::hostile::deep_array;

/// Every proper prefix of the example: never valid JSON.
pub(super) fn truncations(ep: &Endpoint, out: &mut Vec<Case>) {
    let full = ep.bytes();
    for n in 0..full.len() {
        out.push(ep.case(
            format_args!("truncated at byte {n} of {}", full.len()),
            full[..n].to_vec(),
            BAD_JSON,
        ));
    }
}

/// Empty, whitespace, BOM, comments, trailing garbage, not-an-object, duplicate keys.
pub(super) fn syntax(ep: &Endpoint, out: &mut Vec<Case>) {
    let body = ep.bytes();
    let text = String::from_utf8(body.clone()).unwrap();
    let cat = |a: &[u8], b: &[u8]| [a, b].concat();
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        ("empty body", Vec::new(), BAD_JSON),
        ("whitespace only", b" \t\r\n  ".to_vec(), BAD_JSON),
        (
            "a BOM before the body",
            cat(b"\xef\xbb\xbf", &body),
            BAD_JSON,
        ),
        ("a BOM alone", b"\xef\xbb\xbf".to_vec(), BAD_JSON),
        (
            "UTF-16LE with BOM",
            {
                let mut v = vec![0xff, 0xfe];
                v.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
                v
            },
            BAD_JSON,
        ),
        ("trailing garbage", cat(&body, b" x"), BAD_JSON),
        ("a second document", cat(&body, b"{}"), BAD_JSON),
        ("the body twice", cat(&body, &body), BAD_JSON),
        ("a stray bracket", cat(&body, b"]"), BAD_JSON),
        ("a trailing NUL", cat(&body, b"\0"), BAD_JSON),
        ("a leading NUL", cat(b"\0", &body), BAD_JSON),
        ("a block comment before", cat(b"/* c */", &body), BAD_JSON),
        ("a line comment after", cat(&body, b" // c"), BAD_JSON),
        ("a hash comment before", cat(b"# c\n", &body), BAD_JSON),
        (
            "a comment inside",
            text.replacen('{', "{/* c */", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "a trailing comma",
            {
                let mut t = text.clone();
                t.insert(t.len() - 1, ',');
                t.into_bytes()
            },
            BAD_JSON,
        ),
        (
            "single quotes",
            text.replace('"', "'").into_bytes(),
            BAD_JSON,
        ),
        (
            "unquoted keys",
            {
                let first_key = text[2..].split('"').next().unwrap().to_owned();
                text.replacen(&format!("\"{first_key}\""), &first_key, 1)
                    .into_bytes()
            },
            BAD_JSON,
        ),
        (
            "a form feed as whitespace",
            text.replacen('{', "{\x0c", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "a vertical tab as whitespace",
            text.replacen('{', "{\x0b", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "a no-break space as whitespace",
            text.replacen('{', "{\u{a0}", 1).into_bytes(),
            BAD_JSON,
        ),
        (
            "an ideographic space as whitespace",
            text.replacen('{', "{\u{3000}", 1).into_bytes(),
            BAD_JSON,
        ),
        ("an open brace alone", b"{".to_vec(), BAD_JSON),
        ("a close brace alone", b"}".to_vec(), BAD_JSON),
        ("ten thousand open braces", vec![b'{'; 10_000], BAD_JSON),
        ("array body", b"[]".to_vec(), BAD_BODY),
        ("null body", b"null".to_vec(), BAD_BODY),
        ("number body", b"0".to_vec(), BAD_BODY),
        ("string body", b"\"s\"".to_vec(), BAD_BODY),
        ("bool body", b"true".to_vec(), BAD_BODY),
        (
            "the body inside an array",
            [b"[", &body[..], b"]"].concat(),
            BAD_BODY,
        ),
        (
            "an unknown member",
            splice_member(&ep.example, "", b"\"x\"", b"1"),
            BAD_BODY,
        ),
        (
            "an empty key",
            splice_member(&ep.example, "", b"\"\"", b"1"),
            BAD_BODY,
        ),
        (
            "the body with surrounding whitespace",
            [b"\r\n\t ", &body[..], b" \n"].concat(),
            OK,
        ),
        (
            "the body, pretty-printed",
            serde_json::to_vec_pretty(&ep.example).unwrap(),
            OK,
        ),
    ];
    for (label, body, expect) in cases {
        out.push(ep.case(label, body, expect));
    }
    // `{}`: only evaluate has nothing required.
    out.push(ep.case(
        "empty object",
        b"{}".to_vec(),
        if ep.name == "evaluate" { OK } else { BAD_BODY },
    ));
    // A member given twice: a struct field is refused; events are read as a map first, where
    // the last one wins.
    let first_key = ep
        .example
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    let first_value = serde_json::to_vec(&ep.example[&first_key]).unwrap();
    out.push(ep.case(
        format_args!("member {first_key:?} given twice"),
        splice_member(&ep.example, "", &quoted(&first_key), &first_value),
        if ep.name == "events" { OK } else { BAD_BODY },
    ));
}

/// Every slot, and the whole body, given a value of every other JSON kind.
pub(super) fn wrong_types(ep: &Endpoint, out: &mut Vec<Case>) {
    for (kind, raw) in KINDS {
        if kind != Kind::Obj {
            out.push(ep.case(
                format_args!("whole body {raw}"),
                raw.as_bytes().to_vec(),
                BAD_BODY,
            ));
        }
    }
    for s in &ep.slots {
        let own = kind_of(ep.example.pointer(s.ptr).unwrap());
        for (kind, raw) in KINDS {
            if kind == own {
                continue;
            }
            let expect = if s.accepts.contains(&kind) {
                OK
            } else {
                Expect::Is(400, s.code)
            };
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                expect,
            ));
        }
    }
}

/// Huge, tiny, out-of-range and not-quite numbers in every slot.
pub(super) fn numbers(ep: &Endpoint, now: i64, out: &mut Vec<Case>) {
    for s in &ep.slots {
        if s.num == Num::Text {
            for raw in ["1e400", "123456789012345678901234567890", "-0", "7"] {
                out.push(ep.case(
                    format_args!("{} = {raw}", s.ptr),
                    splice(&ep.example, s.ptr, raw.as_bytes()),
                    BAD,
                ));
            }
            for raw in ["NaN", "Infinity", "01", "+1"] {
                out.push(ep.case(
                    format_args!("{} = {raw}", s.ptr),
                    splice(&ep.example, s.ptr, raw.as_bytes()),
                    BAD_JSON,
                ));
            }
            continue;
        }
        for (raw, amount) in NUMBERS {
            let status = number_status(s.num, raw, *amount, now);
            let expect = if s.num == Num::Amount && *raw == "0e2147483647" {
                // Zero either way; refusing the exponent is as fair as reading 0.
                Expect::OneOf(&[200, 400])
            } else {
                Expect::Is(status, None)
            };
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                expect,
            ));
        }
        for raw in NOT_NUMBERS {
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                BAD_JSON,
            ));
        }
    }
}

/// 10,000-deep arrays and objects as the body and in every slot; 1,000,000-deep where a value
/// is kept as raw JSON.
pub(super) fn nesting(ep: &Endpoint, out: &mut Vec<Case>) {
    let arr = deep_array(10_000);
    let obj = deep_object(10_000);
    out.push(ep.case("body nested 10,000 deep in arrays", arr.clone(), BAD));
    out.push(ep.case("body nested 10,000 deep in objects", obj.clone(), BAD));
    out.push(ep.case("body of 10,000 unclosed brackets", vec![b'['; 10_000], BAD));
    out.push(ep.case("body nested 1,000,000 deep", deep_array(1_000_000), BAD));
    for s in &ep.slots {
        out.push(ep.case(
            format_args!("{} nested 10,000 deep in arrays", s.ptr),
            splice(&ep.example, s.ptr, &arr),
            BAD,
        ));
        out.push(ep.case(
            format_args!("{} nested 10,000 deep in objects", s.ptr),
            splice(&ep.example, s.ptr, &obj),
            BAD,
        ));
        if matches!(s.num, Num::Group | Num::Amount) {
            out.push(ep.case(
                format_args!("{} nested 1,000,000 deep", s.ptr),
                splice(&ep.example, s.ptr, &deep_array(1_000_000)),
                BAD,
            ));
            out.push(ep.case(
                format_args!("{} nested 100,000 deep in objects", s.ptr),
                splice(&ep.example, s.ptr, &deep_object(100_000)),
                BAD,
            ));
        }
    }
}

/// Invalid UTF-8 and lone surrogate escapes in every string value and in keys.
pub(super) fn utf8(ep: &Endpoint, out: &mut Vec<Case>) {
    for s in &ep.slots {
        if kind_of(ep.example.pointer(s.ptr).unwrap()) != Kind::Str {
            continue;
        }
        for (label, raw) in BAD_UTF8 {
            out.push(ep.case(
                format_args!("{} = {label}", s.ptr),
                splice(&ep.example, s.ptr, raw),
                BAD_JSON,
            ));
        }
        for raw in SURROGATES {
            out.push(ep.case(
                format_args!("{} = {raw}", s.ptr),
                splice(&ep.example, s.ptr, raw.as_bytes()),
                BAD,
            ));
        }
    }
    let mut objects = vec![""];
    objects.extend(
        ep.slots
            .iter()
            .filter(|s| kind_of(ep.example.pointer(s.ptr).unwrap()) == Kind::Obj)
            .map(|s| s.ptr),
    );
    for ptr in objects {
        for (label, raw) in BAD_UTF8.iter().take(3) {
            let key: &[u8] = raw;
            out.push(ep.case(
                format_args!("key in {ptr:?} = {label}"),
                splice_member(&ep.example, ptr, key, b"\"v\""),
                BAD_JSON,
            ));
        }
        out.push(ep.case(
            format_args!("key in {ptr:?} = lone surrogate"),
            splice_member(&ep.example, ptr, br#""\ud800""#, b"\"v\""),
            BAD_JSON,
        ));
        out.push(ep.case(
            format_args!("invalid UTF-8 between members of {ptr:?}"),
            splice_member(&ep.example, ptr, b"\xff\"k\"", b"1"),
            BAD_JSON,
        ));
    }
}

/// Raw control characters in strings, a 1 MiB value in every string slot, a 100 KiB key.
pub(super) fn oversize(ep: &Endpoint, out: &mut Vec<Case>) {
    let mib = quoted(&"a".repeat(1 << 20));
    for s in &ep.slots {
        if kind_of(ep.example.pointer(s.ptr).unwrap()) != Kind::Str {
            continue;
        }
        // A group-by value longer than an event may carry can never have been counted:
        // reading it may be refused or read as nothing.
        let expect = if s.num == Num::Group {
            Expect::OneOf(&[200, 400])
        } else if s.ptr.starts_with("/subjects/") {
            // A subject value that fails its rule is reported in `invalid`, not a 400: the
            // other values are checked (API.md, `strict` keeps the 400).
            Expect::Is(200, None)
        } else {
            BAD
        };
        out.push(ep.case(
            format_args!("{} = 1 MiB string", s.ptr),
            splice(&ep.example, s.ptr, &mib),
            expect,
        ));
        for (label, raw) in [
            ("raw control character", b"\"a\x01b\"".as_slice()),
            ("raw newline", b"\"a\nb\""),
            ("raw tab", b"\"a\tb\""),
            ("raw NUL", b"\"a\0b\""),
            ("invalid escape", br#""a\xb""#),
            ("short unicode escape", br#""a\u12""#),
            ("unterminated string", b"\"abc"),
        ] {
            out.push(ep.case(
                format_args!("{} = {label}", s.ptr),
                splice(&ep.example, s.ptr, raw),
                BAD_JSON,
            ));
        }
    }
    out.push(ep.case(
        "a 100 KiB unknown key",
        splice_member(&ep.example, "", &quoted(&"k".repeat(100 << 10)), b"1"),
        BAD_BODY,
    ));
    out.push(ep.case(
        "100,000 unknown members",
        {
            let mut o = ep.example.as_object().unwrap().clone();
            for i in 0..100_000 {
                o.insert(format!("x{i}"), json!(1));
            }
            serde_json::to_vec(&o).unwrap()
        },
        BAD_BODY,
    ));
}

/// Huge arrays of small items, distinct and repeated.
pub(super) fn huge_arrays(out: &mut Vec<Case>) {
    const N: usize = 100_000;
    let many = |f: &dyn Fn(usize) -> Value| Value::Array((0..N).map(f).collect());
    let mut push = |method: &'static str, path: &str, label: &str, body: Value, expect: Expect| {
        out.push(Case {
            label: format!("{method} {path}: {label}"),
            method,
            path: path.to_owned(),
            body: Arc::new(json_bytes(&body)),
            framing: Framing::Length,
            expect,
        });
    };
    let entries = "/v1/lists/black/entries";
    let too_many_entries = Expect::Is(400, Some("too_many_entries"));
    push(
        "POST",
        entries,
        "100,000 entries",
        json!({"entries": many(&|i| json!({"dimension": "uid", "value": format!("v{i}")}))}),
        too_many_entries,
    );
    push(
        "POST",
        entries,
        "10,001 entries",
        json!({"entries": (0..10_001).map(|i| json!({"dimension": "uid", "value": format!("v{i}")})).collect::<Vec<_>>()}),
        too_many_entries,
    );
    push(
        "DELETE",
        entries,
        "100,000 entries",
        json!({"entries": many(&|i| json!({"dimension": "uid", "value": format!("v{i}")}))}),
        too_many_entries,
    );
    push(
        "DELETE",
        entries,
        "10,000 absent entries",
        json!({"entries": (0..10_000).map(|i| json!({"dimension": "uid", "value": format!("absent{i}")})).collect::<Vec<_>>()}),
        OK,
    );
    let too_many_values = Expect::Is(400, Some("too_many_values"));
    let bad_lists = Expect::Is(400, Some("invalid_lists"));
    for path in ["/v1/check", "/v1/evaluate"] {
        push(
            "POST",
            path,
            "100,000 distinct subject values",
            json!({"lists": ["black"], "subjects": {"uid": many(&|i| json!(format!("v{i}")))}}),
            too_many_values,
        );
        push(
            "POST",
            path,
            "100,000 copies of one subject value",
            json!({"lists": ["black"], "subjects": {"uid": many(&|_| json!("u1"))}}),
            // "At most 64 values in all", counted as sent.
            too_many_values,
        );
        push(
            "POST",
            path,
            "100,000 custom dimensions",
            json!({"lists": ["black"], "subjects": (0..N).map(|i| (format!("c{i}"), json!("x"))).collect::<serde_json::Map<_, _>>()}),
            too_many_values,
        );
        push(
            "POST",
            path,
            "100,000 distinct lists",
            json!({"lists": many(&|i| json!(format!("l{i}"))), "subjects": {"uid": "u1"}}),
            bad_lists,
        );
        push(
            "POST",
            path,
            "100,000 copies of one list",
            json!({"lists": many(&|_| json!("black")), "subjects": {"uid": "u1"}}),
            bad_lists,
        );
    }
    let event = |i: usize| json!({"type": "transaction", "fields": {"device_id": format!("d{i}")}});
    push(
        "POST",
        "/v1/events",
        "100,000 events",
        json!({"events": many(&event)}),
        Expect::Is(400, Some("too_many_events")),
    );
    push(
        "POST",
        "/v1/events",
        "1,001 events",
        json!({"events": (0..1001).map(event).collect::<Vec<_>>()}),
        Expect::Is(400, Some("too_many_events")),
    );
    push(
        "POST",
        "/v1/events",
        "an event with 100,000 fields",
        json!({"type": "transaction", "fields": (0..N).map(|i| (format!("f{i}"), json!(i))).collect::<serde_json::Map<_, _>>()}),
        OK,
    );
    // Over 64 names in one read: refused before anything is looked up.
    let too_many_names = Expect::Is(400, Some("too_many_names"));
    push(
        "POST",
        "/v1/features",
        "100,000 distinct metric ids",
        json!({"metrics": many(&|i| json!(format!("x{i}"))), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/features",
        "100,000 copies of one metric id",
        json!({"metrics": many(&|_| json!("m1")), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/features",
        "100,000 fields",
        json!({"metrics": ["m1"], "fields": (0..N).map(|i| (format!("f{i}"), json!(i))).chain([("device_id".to_owned(), json!("d1"))]).collect::<serde_json::Map<_, _>>()}),
        OK,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 distinct metric ids",
        json!({"metrics": many(&|i| json!(format!("x{i}"))), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 copies of one metric id",
        json!({"metrics": many(&|_| json!("m1")), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 distinct rule ids",
        json!({"rules": many(&|i| json!(format!("x{i}"))), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "POST",
        "/v1/evaluate",
        "100,000 copies of one rule id",
        json!({"rules": many(&|_| json!("r1")), "fields": {"device_id": "d1"}}),
        too_many_names,
    );
    push(
        "PUT",
        "/v1/metrics/m1",
        "grouped by 100,000 fields",
        json!({"expr": format!("COUNT(7d, transaction) BY {}", (0..N).map(|i| format!("f{i}")).collect::<Vec<_>>().join(", "))}),
        Expect::OneOf(&[200, 400]),
    );
    push(
        "PUT",
        "/v1/metrics/m1",
        "a window of 100,000 digits",
        json!({"expr": format!("COUNT({}d, transaction) BY device_id", "9".repeat(N))}),
        Expect::Is(400, Some("invalid_expr")),
    );
    push(
        "PUT",
        "/v1/rules/r1",
        "a rule nested 100,000 parentheses deep",
        json!({"expr": format!("{}m1 > 1{}", "(".repeat(N), ")".repeat(N))}),
        Expect::OneOf(&[200, 400]),
    );
    push(
        "PUT",
        "/v1/rules/r1",
        "1,000,000 open parentheses",
        json!({"expr": "(".repeat(1_000_000)}),
        Expect::Is(400, Some("invalid_rule")),
    );
    push(
        "PUT",
        "/v1/rules/r1",
        "100,000 comparisons",
        json!({"expr": vec!["m1 > 1"; N].join(" AND ")}),
        Expect::OneOf(&[200, 400]),
    );
}
