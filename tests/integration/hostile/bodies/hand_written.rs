//! Identifiers with look-alike and invisible characters, and other hand-picked cases.

use std::sync::Arc;

use serde_json::{Value, json};

use super::corpus::{BAD_BODY, Case, Endpoint, Expect, OK, json_bytes};
use crate::hostile::client::Framing;
use crate::hostile::deep_array;

/// Identifiers with look-alike and invisible characters, and other hand-picked cases.
pub(super) fn hand_written(eps: &[Endpoint], out: &mut Vec<Case>) {
    let ep = |name: &str| eps.iter().find(|e| e.name == name).unwrap();
    let upsert = ep("upsert");
    let entry = |dimension: &str, value: &str| {
        json_bytes(
            &json!({"entries": [{"dimension": dimension, "value": value, "sandbox": "loan"}]}),
        )
    };
    let cases: Vec<(&str, Vec<u8>, Expect)> = vec![
        (
            "dimension with a Cyrillic i",
            entry("u\u{456}d", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "dimension with a zero-width joiner",
            entry("uid\u{200d}", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "dimension in capitals",
            entry("UID", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "dimension with a trailing space",
            entry("uid ", "u1"),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "phone in full-width digits",
            entry("phone", "\u{ff11}\u{ff13}\u{ff18}00000000"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "phone in Arabic-Indic digits",
            entry(
                "phone",
                "\u{661}\u{663}\u{668}\u{660}\u{660}\u{660}\u{660}\u{660}",
            ),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "id_card with a dotless i",
            entry("id_card", "\u{131}2345"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "id_card with a long s",
            entry("id_card", "\u{17f}2345"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "imei in full-width digits",
            entry("imei", &"\u{ff14}".repeat(15)),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "wifi_mac in full-width letters",
            entry("wifi_mac", "\u{ff21}\u{ff21}:bb:cc:dd:ee:ff"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip with full-width digits",
            entry("ip", "\u{ff11}0.1.2.3"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip with a zero-width space",
            entry("ip", "10.1.2.3\u{200b}"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip range /33",
            entry("ip", "10.1.2.0/33"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "ip range /999999999999",
            entry("ip", "10.1.2.0/999999999999"),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "uid of 257 bytes",
            entry("uid", &"a".repeat(257)),
            Expect::Is(400, Some("invalid_value")),
        ),
        ("uid of 256 bytes", entry("uid", &"a".repeat(256)), OK),
        (
            "uid of 129 two-byte characters (258 bytes)",
            entry("uid", &"\u{e9}".repeat(129)),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "uid of spaces only",
            entry("uid", " \u{3000}\u{a0} "),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "uid with a zero-width joiner",
            entry("uid", "u\u{200d}1"),
            OK,
        ),
        ("uid with an escaped NUL", entry("uid", "u\u{0}x"), OK),
        ("uid with DEL", entry("uid", "u\u{7f}x"), OK),
        (
            "reason of 257 bytes",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "reason": "r".repeat(257)}]}),
            ),
            Expect::Is(400, Some("invalid_reason")),
        ),
        (
            "sandbox with a Cyrillic o",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "sandbox": "l\u{43e}an"}]}),
            ),
            Expect::Is(400, Some("invalid_sandbox")),
        ),
        (
            "sandbox with a zero-width joiner",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "sandbox": "lo\u{200d}an"}]}),
            ),
            Expect::Is(400, Some("invalid_sandbox")),
        ),
        (
            "sandbox of 65 bytes",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "sandbox": "s".repeat(65)}]}),
            ),
            Expect::Is(400, Some("invalid_sandbox")),
        ),
        (
            "expires_at and ttl_seconds",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "ttl_seconds": 5, "expires_at": 4_102_444_800_000_i64}]}),
            ),
            Expect::Is(400, Some("invalid_expiry")),
        ),
        (
            "expires_at in the past",
            json_bytes(&json!({"entries": [{"dimension": "uid", "value": "u1", "expires_at": 1}]})),
            Expect::Is(400, Some("expiry_in_past")),
        ),
        (
            "expires_at i64::MAX",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "expires_at": i64::MAX}]}),
            ),
            Expect::Is(400, Some("invalid_expiry")),
        ),
        (
            "expires_at i64::MIN",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "u1", "expires_at": i64::MIN}]}),
            ),
            Expect::Is(400, Some("expiry_in_past")),
        ),
        (
            "a valid entry then a bad one",
            json_bytes(
                &json!({"entries": [{"dimension": "uid", "value": "fine"}, {"dimension": "phone", "value": "x"}]}),
            ),
            Expect::Is(400, Some("invalid_value")),
        ),
    ];
    for (label, body, expect) in cases {
        out.push(upsert.case(label, body, expect));
    }
    for (path, code) in [
        ("/v1/lists/bl%D0%B0ck/entries", "invalid_list"),
        ("/v1/lists/black%E2%80%8D/entries", "invalid_list"),
        ("/v1/lists/BLACK/entries", "invalid_list"),
        ("/v1/lists/%FF/entries", "invalid_list"),
        (
            "/v1/lists/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/entries",
            "invalid_list",
        ),
    ] {
        for (method, body) in [("POST", upsert.bytes()), ("DELETE", ep("delete").bytes())] {
            out.push(Case {
                label: format!("{method} {path}"),
                method,
                path: path.to_owned(),
                body: Arc::new(body),
                framing: Framing::Length,
                expect: Expect::Is(400, Some(code)),
            });
        }
    }
    for (path, code) in [
        ("/v1/metrics/m%E2%80%8D1", "invalid_metric_id"),
        ("/v1/metrics/M1", "invalid_metric_id"),
        ("/v1/rules/r%D1%961", "invalid_rule_id"),
    ] {
        let body = if path.contains("rules") {
            json!({"expr": "m1 > 3"})
        } else {
            json!({"expr": "COUNT(7d, transaction) BY device_id"})
        };
        out.push(Case {
            label: format!("PUT {path}"),
            method: "PUT",
            path: path.to_owned(),
            body: Arc::new(json_bytes(&body)),
            framing: Framing::Length,
            expect: Expect::Is(400, Some(code)),
        });
    }
    let check = ep("check");
    for (label, body, expect) in [
        (
            "list with a Cyrillic a",
            json!({"lists": ["bl\u{430}ck"], "subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_list")),
        ),
        (
            "dimension with a Cyrillic i",
            json!({"lists": ["black"], "subjects": {"u\u{456}d": "u1"}}),
            Expect::Is(400, Some("unknown_dimension")),
        ),
        (
            "an ip range in a check",
            json!({"lists": ["black"], "subjects": {"ip": "10.0.0.0/8"}}),
            Expect::Is(200, None),
        ),
        (
            "an ip range in a strict check",
            json!({"lists": ["black"], "subjects": {"ip": "10.0.0.0/8"}, "strict": true}),
            Expect::Is(400, Some("invalid_value")),
        ),
        (
            "no lists",
            json!({"lists": [], "subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_lists")),
        ),
        (
            "17 lists",
            json!({"lists": (0..17).map(|i| format!("l{i}")).collect::<Vec<_>>(), "subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_lists")),
        ),
        (
            "65 subject values",
            json!({"lists": ["black"], "subjects": {"uid": (0..65).map(|i| format!("v{i}")).collect::<Vec<_>>()}}),
            Expect::Is(400, Some("too_many_values")),
        ),
        (
            "64 subject values",
            json!({"lists": ["black"], "subjects": {"uid": (0..64).map(|i| format!("v{i}")).collect::<Vec<_>>()}}),
            OK,
        ),
    ] {
        out.push(check.case(label, json_bytes(&body), expect));
    }
    out.push(check.case(
        "a dimension given twice in subjects (a map: the last wins)",
        br#"{"lists":["black"],"subjects":{"uid":"u1","uid":"u2"}}"#.to_vec(),
        OK,
    ));
    let events = ep("events");
    for (label, body, expect) in [
        (
            "type with a Cyrillic o",
            json!({"type": "transacti\u{43e}n"}),
            Expect::Is(400, Some("invalid_event_type")),
        ),
        (
            "type with a zero-width joiner",
            json!({"type": "transaction\u{200d}"}),
            Expect::Is(400, Some("invalid_event_type")),
        ),
        (
            "a field name with a Cyrillic i (an unknown field)",
            json!({"type": "transaction", "fields": {"dev\u{456}ce_id": "d1"}}),
            OK,
        ),
        (
            "an event id of 257 bytes",
            json!({"type": "transaction", "id": "e".repeat(257), "fields": {"device_id": "d1"}}),
            Expect::Is(400, Some("invalid_event_id")),
        ),
        (
            "an empty event id",
            json!({"type": "transaction", "id": "", "fields": {"device_id": "d1"}}),
            Expect::Is(400, Some("invalid_event_id")),
        ),
        (
            "a group-by value of 257 bytes",
            json!({"type": "transaction", "fields": {"device_id": "d".repeat(257)}}),
            Expect::Is(400, Some("invalid_field")),
        ),
        (
            "a batch with something beside it",
            json!({"events": [], "type": "transaction"}),
            BAD_BODY,
        ),
        (
            "a batch that is not an array",
            json!({"events": {"type": "transaction"}}),
            BAD_BODY,
        ),
        ("a batch of null", json!({"events": null}), BAD_BODY),
        (
            "a batch with a bad event",
            json!({"events": [{"type": "transaction"}, {"type": 5}]}),
            BAD_BODY,
        ),
        ("an empty batch", json!({"events": []}), OK),
        (
            "ts 10 minutes ahead",
            json!({"type": "transaction", "ts": namelist::domain::now_ms() + 600_000}),
            Expect::Is(400, Some("event_in_future")),
        ),
    ] {
        out.push(events.case(label, json_bytes(&body), expect));
    }
    out.push(
        events.case(
            "a group-by number of 300 digits",
            format!(
                r#"{{"type":"transaction","fields":{{"device_id":{}}}}}"#,
                "9".repeat(300)
            )
            .into_bytes(),
            Expect::Is(400, Some("invalid_field")),
        ),
    );
    let evaluate = ep("evaluate");
    for (label, body, expect) in [
        (
            "subjects without lists",
            json!({"subjects": {"uid": "u1"}}),
            Expect::Is(400, Some("invalid_lists")),
        ),
        (
            "an unknown rule",
            json!({"rules": ["nope"]}),
            Expect::Is(400, Some("unknown_rule")),
        ),
        (
            "an unknown metric",
            json!({"metrics": ["nope"], "fields": {"device_id": "d1"}}),
            Expect::Is(400, Some("unknown_metric")),
        ),
        (
            "a metric without its group-by field",
            json!({"metrics": ["m1"]}),
            Expect::Is(400, Some("missing_field")),
        ),
        (
            "a subject of an object",
            json!({"lists": ["black"], "subjects": {"uid": {"a": 1}}}),
            BAD_BODY,
        ),
        (
            "a subject nested 100 deep",
            json!({"lists": ["black"], "subjects": {"uid": serde_json::from_slice::<Value>(&deep_array(100)).unwrap()}}),
            BAD_BODY,
        ),
    ] {
        out.push(evaluate.case(label, json_bytes(&body), expect));
    }
    let metric = ep("metric");
    for (label, body, expect) in [
        (
            "an event type with a Cyrillic o",
            json!({"expr": "COUNT(7d, transacti\u{43e}n) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a full-width parenthesis",
            json!({"expr": "COUNT\u{ff08}7d, transaction) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a window of 0",
            json!({"expr": "COUNT(0d, transaction) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a window of i64::MAX days",
            json!({"expr": "COUNT(9223372036854775807d, transaction) BY device_id"}),
            Expect::Is(400, Some("invalid_expr")),
        ),
        (
            "a resolution of 999999999999999999999s",
            json!({"expr": "COUNT(7d, transaction) BY device_id", "resolution": "999999999999999999999s"}),
            Expect::Is(400, Some("invalid_resolution")),
        ),
        (
            "a resolution of 1ms",
            json!({"expr": "COUNT(7d, transaction) BY device_id", "resolution": "1ms"}),
            Expect::Is(400, Some("invalid_resolution")),
        ),
        (
            "an empty expression",
            json!({"expr": ""}),
            Expect::Is(400, Some("invalid_expr")),
        ),
    ] {
        out.push(metric.case(label, json_bytes(&body), expect));
    }
    let rule = ep("rule");
    for (label, body, expect) in [
        (
            "a full-width >",
            json!({"expr": "m1 \u{ff1e} 3"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "a metric id with a zero-width joiner",
            json!({"expr": "m\u{200d}1 > 3"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "a number of 1e400",
            json!({"expr": "m1 > 1e400"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "a number of NaN",
            json!({"expr": "m1 > NaN"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "an unknown metric",
            json!({"expr": "nope > 3"}),
            Expect::Is(400, None),
        ),
        (
            "an empty expression",
            json!({"expr": ""}),
            Expect::Is(400, Some("invalid_rule")),
        ),
        (
            "unbalanced parentheses",
            json!({"expr": "(m1 > 3"}),
            Expect::Is(400, Some("invalid_rule")),
        ),
    ] {
        out.push(rule.case(label, json_bytes(&body), expect));
    }
    // Long expressions: the lexers must stay linear in the length.
    for (label, expr, expect) in [
        (
            "a valid expression and 1 MiB of spaces",
            format!("COUNT(7d, transaction) BY device_id{}", " ".repeat(1 << 20)),
            Expect::OneOf(&[200, 400]),
        ),
        (
            "1 MiB of commas",
            ",".repeat(1 << 20),
            Expect::Is(400, Some("invalid_expr")),
        ),
    ] {
        out.push(metric.case(label, json_bytes(&json!({ "expr": expr })), expect));
    }
    out.push(rule.case(
        "1 MiB of spaces around a comparison",
        json_bytes(&json!({"expr": format!("{0}m1 > 3{0}", " ".repeat(1 << 19))})),
        // A rule is at most 4096 bytes, whatever they are.
        Expect::Is(400, Some("invalid_rule")),
    ));
    // The contract's bodies are objects: a JSON array is not read as the fields in
    // declaration order (whose meaning would change with the order of a struct's fields).
    for (ep, label, body) in [
        (
            check,
            "the fields as a positional array",
            br#"["loan",["black"],{"uid":"u1"}]"#.as_slice(),
        ),
        (
            upsert,
            "an entry as a positional array",
            br#"[[["uid","u-positional","loan",null,null,null]]]"#,
        ),
        (rule, "the fields as a positional array", br#"["m1 > 3"]"#),
        (
            ep("features"),
            "the fields as a positional array",
            br#"[["m1"],{"device_id":"d1"},null]"#,
        ),
    ] {
        out.push(ep.case(label, body.to_vec(), BAD_BODY));
    }
}
