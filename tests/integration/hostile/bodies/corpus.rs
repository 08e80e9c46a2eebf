//! The corpus: what a case is and must get back, the endpoints that take a body with the slots
//! of their example bodies, the raw values spliced in, and `corpus`, which puts it together.

use std::sync::Arc;

use serde_json::{Value, json};

use super::framing::framing;
use super::hand_written::hand_written;
use super::mutations::{
    huge_arrays, nesting, numbers, oversize, syntax, truncations, utf8, wrong_types,
};
use crate::hostile::client::{Framing, find};

/// What a case must get back.
#[derive(Clone, Copy, Debug)]
pub(super) enum Expect {
    /// Exactly this status; an error in the API.md shape with this code (`None`: any code).
    Is(u16, Option<&'static str>),
    /// One of these statuses (the contract leaves the choice open); errors in the API.md shape.
    OneOf(&'static [u16]),
    /// Refused by the HTTP layer (malformed framing): this status, any body.
    Protocol(u16),
}

pub(super) struct Case {
    pub(super) label: String,
    pub(super) method: &'static str,
    pub(super) path: String,
    pub(super) body: Arc<Vec<u8>>,
    pub(super) framing: Framing,
    pub(super) expect: Expect,
}

/// JSON value kinds, for wrong-type substitutions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    Null,
    Bool,
    Int,
    Float,
    Str,
    Arr,
    Obj,
}

pub(super) const KINDS: [(Kind, &str); 7] = [
    (Kind::Null, "null"),
    (Kind::Bool, "true"),
    (Kind::Int, "7"),
    (Kind::Float, "1.5"),
    (Kind::Str, "\"x\""),
    (Kind::Arr, "[\"x\"]"),
    (Kind::Obj, "{\"x\":\"y\"}"),
];

pub(super) fn kind_of(v: &Value) -> Kind {
    match v {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(n) if n.is_f64() => Kind::Float,
        Value::Number(_) => Kind::Int,
        Value::String(_) => Kind::Str,
        Value::Array(_) => Kind::Arr,
        Value::Object(_) => Kind::Obj,
    }
}

/// What numbers mean in a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Num {
    /// Not a number (a string, a container): any number is a 400.
    Text,
    /// `ttl_seconds`: u64, at least 1, not past 2156.
    Ttl,
    /// An event's `ts`: i64 ms, not negative, at most 5 minutes ahead.
    Ts,
    /// `at` of features: any i64.
    At,
    /// A numeric field of an aggregated amount: at most 4 decimal places, at most 9e11.
    Amount,
    /// A group-by field value: any JSON number, kept as its text.
    Group,
}

/// A place in an endpoint's example body.
pub(super) struct Slot {
    pub(super) ptr: &'static str,
    /// Kinds that make a valid request there (200).
    pub(super) accepts: &'static [Kind],
    /// The error code of a value of the wrong kind there (`None`: more than one applies).
    pub(super) code: Option<&'static str>,
    pub(super) num: Num,
}

fn slot(ptr: &'static str, accepts: &'static [Kind], num: Num) -> Slot {
    let raw_field = matches!(num, Num::Group | Num::Amount);
    Slot {
        ptr,
        accepts,
        code: if raw_field {
            None
        } else {
            Some("invalid_body")
        },
        num,
    }
}

pub(super) struct Endpoint {
    pub(super) name: &'static str,
    method: &'static str,
    path: &'static str,
    pub(super) example: Value,
    pub(super) slots: Vec<Slot>,
}

impl Endpoint {
    pub(super) fn case(
        &self,
        label: impl std::fmt::Display,
        body: Vec<u8>,
        expect: Expect,
    ) -> Case {
        self.shared(label, Arc::new(body), Framing::Length, expect)
    }

    pub(super) fn shared(
        &self,
        label: impl std::fmt::Display,
        body: Arc<Vec<u8>>,
        framing: Framing,
        expect: Expect,
    ) -> Case {
        Case {
            label: format!("{} {}: {label}", self.method, self.path),
            method: self.method,
            path: self.path.to_owned(),
            body,
            framing,
            expect,
        }
    }

    pub(super) fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.example).unwrap()
    }
}

const MARK: &str = "\u{1}HOSTILE-VALUE\u{1}";
const KEY_MARK: &str = "\u{1}HOSTILE-KEY\u{1}";

fn replace_once(bytes: &[u8], needle: &str, raw: &[u8]) -> Vec<u8> {
    let needle = serde_json::to_vec(&Value::String(needle.into())).unwrap();
    let at = find(bytes, &needle).expect("marker in the body");
    [&bytes[..at], raw, &bytes[at + needle.len()..]].concat()
}

/// The example with the value at `ptr` replaced by these raw bytes (any bytes at all).
pub(super) fn splice(example: &Value, ptr: &str, raw: &[u8]) -> Vec<u8> {
    let mut v = example.clone();
    *v.pointer_mut(ptr)
        .unwrap_or_else(|| panic!("{ptr} in {example}")) = Value::String(MARK.into());
    replace_once(&serde_json::to_vec(&v).unwrap(), MARK, raw)
}

/// The example with one more member in the object at `ptr`: raw key bytes, raw value bytes.
pub(super) fn splice_member(
    example: &Value,
    ptr: &str,
    raw_key: &[u8],
    raw_value: &[u8],
) -> Vec<u8> {
    let mut v = example.clone();
    v.pointer_mut(ptr)
        .and_then(Value::as_object_mut)
        .unwrap_or_else(|| panic!("object {ptr} in {example}"))
        .insert(KEY_MARK.into(), Value::String(MARK.into()));
    let bytes = replace_once(&serde_json::to_vec(&v).unwrap(), KEY_MARK, raw_key);
    replace_once(&bytes, MARK, raw_value)
}

pub(super) fn deep_object(depth: usize) -> Vec<u8> {
    let mut v = "{\"a\":".repeat(depth).into_bytes();
    v.extend(b"1");
    v.extend("}".repeat(depth).bytes());
    v
}

pub(super) fn quoted(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap()
}

/// Numbers, and the status an amount of that text gets.
pub(super) const NUMBERS: &[(&str, u16)] = &[
    ("1e400", 400),
    ("-1e400", 400),
    ("1E400", 400),
    ("1e-400", 400),
    ("4.9e-324", 400),
    ("123456789012345678901234567890", 400),
    ("-123456789012345678901234567890", 400),
    ("1.7976931348623157e309", 400),
    ("1.7976931348623157e308", 400),
    ("18446744073709551615", 400),
    ("18446744073709551616", 400),
    ("9223372036854775807", 400),
    ("-9223372036854775808", 400),
    ("-9223372036854775809", 400),
    ("0", 200),
    ("-0", 200),
    ("-1", 200),
    ("1", 200),
    ("86400", 200),
    ("1e2", 200),
    ("1E+2", 200),
    ("1.0", 200),
    ("0.0001", 200),
    ("0.00001", 400),
    ("1e-5", 400),
    ("900000000000", 200),
    ("900000000000.0001", 400),
    ("1e2147483647", 400),
    ("1e2147483648", 400),
    ("1e-2147483648", 400),
    ("1.0000e-2147483648", 400),
    ("0.1e-2147483648", 400),
    ("0e2147483647", 200),
    ("1e9223372036854775807", 400),
    ("1e-9223372036854775808", 400),
    ("0.00001e-9223372036854775808", 400),
    ("1e99999999999999999999", 400),
];

/// Texts that are not JSON numbers at all.
pub(super) const NOT_NUMBERS: &[&str] = &[
    "NaN",
    "-NaN",
    "Infinity",
    "-Infinity",
    "inf",
    "01",
    "-01",
    "1.",
    "-",
    "+1",
    ".5",
    "0x10",
    "1e",
    "1e+",
    "--1",
    "1_000",
    "1,5",
    "\u{661}\u{662}\u{663}",
    "\u{ff11}\u{ff12}\u{ff13}",
];

pub(super) fn number_status(num: Num, text: &str, amount: u16, now: i64) -> u16 {
    match num {
        Num::Text => 400,
        Num::Group => 200,
        Num::Amount => amount,
        // serde_json reads `-0` as the float -0.0 (to keep its sign): not an integer.
        Num::Ttl | Num::Ts | Num::At if text == "-0" => 400,
        Num::Ttl => match text.parse::<u64>() {
            Ok(n) if (1..=3_000_000_000).contains(&n) => 200,
            _ => 400,
        },
        Num::Ts => match text.parse::<i64>() {
            Ok(t) if t >= 0 && t <= now + 300_000 => 200,
            _ => 400,
        },
        Num::At => {
            if text.parse::<i64>().is_ok() {
                200
            } else {
                400
            }
        }
    }
}

/// Invalid UTF-8 inside a JSON string (quotes included).
pub(super) const BAD_UTF8: &[(&str, &[u8])] = &[
    ("byte ff", b"\"\xff\""),
    ("lone continuation byte", b"\"a\x80b\""),
    ("overlong slash", b"\"u\xc0\xafx\""),
    ("overlong nul", b"\"\xc0\x80\""),
    ("utf-8 encoded surrogate", b"\"\xed\xa0\x80\""),
    ("5-byte sequence", b"\"\xf8\x88\x80\x80\x80\""),
    ("truncated sequence", b"\"\xe2\x82\""),
    ("beyond U+10FFFF", b"\"\xf4\x90\x80\x80\""),
];

/// Escapes that name no Unicode scalar value.
pub(super) const SURROGATES: &[&str] = &[
    r#""\ud800""#,
    r#""\udc00""#,
    r#""x\ud800y""#,
    r#""\ud800\u0041""#,
    r#""\udbff\udbff""#,
];

fn endpoints(now: i64) -> Vec<Endpoint> {
    use Kind::*;
    let entries = "/v1/lists/black/entries";
    vec![
        Endpoint {
            name: "upsert",
            method: "POST",
            path: entries,
            example: json!({"entries": [{"dimension": "uid", "value": "u-new", "sandbox": "loan",
                "ttl_seconds": 86400, "reason": "hostile corpus"}]}),
            slots: vec![
                slot("/entries", &[Arr], Num::Text),
                slot("/entries/0", &[Obj], Num::Text),
                slot("/entries/0/dimension", &[Str], Num::Text),
                slot("/entries/0/value", &[Str], Num::Text),
                slot("/entries/0/sandbox", &[Str, Null], Num::Text),
                slot("/entries/0/ttl_seconds", &[Int, Null], Num::Ttl),
                slot("/entries/0/reason", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "delete",
            method: "DELETE",
            path: entries,
            example: json!({"entries": [{"dimension": "uid", "value": "u-absent", "sandbox": "loan"}]}),
            slots: vec![
                slot("/entries", &[Arr], Num::Text),
                slot("/entries/0", &[Obj], Num::Text),
                slot("/entries/0/dimension", &[Str], Num::Text),
                slot("/entries/0/value", &[Str], Num::Text),
                slot("/entries/0/sandbox", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "check",
            method: "POST",
            path: "/v1/check",
            example: json!({"sandbox": "loan", "lists": ["black", "grey"],
                "subjects": {"uid": "u1", "device": ["d1", "d2"]}}),
            slots: vec![
                slot("/sandbox", &[Str, Null], Num::Text),
                slot("/lists", &[Arr], Num::Text),
                slot("/lists/0", &[Str], Num::Text),
                slot("/subjects", &[Obj], Num::Text),
                slot("/subjects/uid", &[Str, Arr], Num::Text),
                slot("/subjects/device", &[Str, Arr], Num::Text),
                slot("/subjects/device/0", &[Str], Num::Text),
            ],
        },
        Endpoint {
            name: "lookup",
            method: "POST",
            path: "/v1/lists/-/lookup",
            example: json!({"dimension": "uid", "value": "u-absent", "sandbox": "loan"}),
            slots: vec![
                slot("/dimension", &[Str], Num::Text),
                slot("/value", &[Str], Num::Text),
                slot("/sandbox", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "events",
            method: "POST",
            path: "/v1/events",
            example: json!({"id": "evt-hostile", "type": "transaction", "ts": now - 1000,
                "fields": {"device_id": "d1", "amount": 12.5}}),
            slots: vec![
                slot("/id", &[Str, Null], Num::Text),
                slot("/type", &[Str], Num::Text),
                slot("/ts", &[Int, Null], Num::Ts),
                slot("/fields", &[Obj], Num::Text),
                slot("/fields/device_id", &[Null, Int, Float, Str], Num::Group),
                slot("/fields/amount", &[Null, Int, Float], Num::Amount),
            ],
        },
        Endpoint {
            name: "features",
            method: "POST",
            path: "/v1/features",
            example: json!({"metrics": ["m1", "amt"], "fields": {"device_id": "d1"}, "at": now}),
            slots: vec![
                slot("/metrics", &[Arr], Num::Text),
                slot("/metrics/0", &[Str], Num::Text),
                slot("/fields", &[Obj], Num::Text),
                slot("/fields/device_id", &[Int, Float, Str], Num::Group),
                slot("/at", &[Int, Null], Num::At),
            ],
        },
        Endpoint {
            name: "evaluate",
            method: "POST",
            path: "/v1/evaluate",
            example: json!({"sandbox": "loan", "lists": ["black"], "subjects": {"uid": "u1"},
                "event": {"type": "transaction", "fields": {"device_id": "d1", "amount": 2.5}},
                "fields": {"device_id": "d1"}, "metrics": ["m1"], "rules": ["r1"]}),
            slots: vec![
                slot("/sandbox", &[Str, Null], Num::Text),
                slot("/lists", &[Arr], Num::Text),
                slot("/lists/0", &[Str], Num::Text),
                slot("/subjects", &[Obj], Num::Text),
                slot("/subjects/uid", &[Str, Arr], Num::Text),
                slot("/event", &[Obj, Null], Num::Text),
                slot("/event/type", &[Str], Num::Text),
                slot("/event/fields", &[Obj], Num::Text),
                slot(
                    "/event/fields/device_id",
                    &[Null, Int, Float, Str],
                    Num::Group,
                ),
                slot("/event/fields/amount", &[Null, Int, Float], Num::Amount),
                slot("/fields", &[Obj], Num::Text),
                slot("/fields/device_id", &[Null, Int, Float, Str], Num::Group),
                slot("/metrics", &[Arr], Num::Text),
                slot("/metrics/0", &[Str], Num::Text),
                slot("/rules", &[Arr], Num::Text),
                slot("/rules/0", &[Str], Num::Text),
            ],
        },
        Endpoint {
            name: "metric",
            method: "PUT",
            path: "/v1/metrics/m1",
            example: json!({"expr": "COUNT(7d, transaction) BY device_id", "resolution": "1h"}),
            slots: vec![
                slot("/expr", &[Str], Num::Text),
                slot("/resolution", &[Str, Null], Num::Text),
            ],
        },
        Endpoint {
            name: "rule",
            method: "PUT",
            path: "/v1/rules/r1",
            example: json!({"expr": "m1 > 3 AND amt >= 10"}),
            slots: vec![slot("/expr", &[Str], Num::Text)],
        },
    ]
}

/// The whole corpus, generated.
pub(super) fn corpus(now: i64) -> Vec<Case> {
    let eps = endpoints(now);
    let mut out = Vec::new();
    for ep in &eps {
        truncations(ep, &mut out);
        syntax(ep, &mut out);
        wrong_types(ep, &mut out);
        numbers(ep, now, &mut out);
        nesting(ep, &mut out);
        utf8(ep, &mut out);
        oversize(ep, &mut out);
    }
    framing(&eps, &mut out);
    huge_arrays(&mut out);
    hand_written(&eps, &mut out);
    out
}

pub(super) const BAD_JSON: Expect = Expect::Is(400, Some("invalid_json"));
pub(super) const BAD_BODY: Expect = Expect::Is(400, Some("invalid_body"));
pub(super) const BAD: Expect = Expect::Is(400, None);
pub(super) const OK: Expect = Expect::Is(200, None);

pub(super) fn json_bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}
