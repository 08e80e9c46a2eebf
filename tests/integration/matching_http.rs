//! Issue 14 over HTTP, on the real application and a real Redis (one node, and a local
//! cluster): phone segments, e-mail addresses and domains written, looked up, checked and
//! deleted; `precedence` and `decision` on `/v1/check` and `/v1/evaluate` (and in a rule);
//! every bad form of them a 400 naming the entry and the rule, with Redis unchanged.

use crate::common;

use common::{Backend, RedisCluster, RedisServer, TestApp, spawn_app};
use serde_json::{Value, json};

async fn app_on(redis: &Backend) -> TestApp {
    spawn_app(redis.settings()).await
}

async fn ok(res: reqwest::Response) -> Value {
    let status = res.status();
    let body: Value = res.json().await.expect("JSON body");
    assert_eq!(status, 200, "{body}");
    body
}

/// (dimension, value) of each hit, sorted.
fn hit_values(body: &Value) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = body["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("hits in {body}"))
        .iter()
        .map(|h| {
            (
                h["list"].as_str().unwrap().to_owned(),
                h["dimension"].as_str().unwrap().to_owned(),
                h["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

fn hit(list: &str, dim: &str, value: &str) -> (String, String, String) {
    (list.into(), dim.into(), value.into())
}

async fn segments_addresses_and_domains_round_trip(redis: &Backend) {
    let app = app_on(redis).await;
    let body = ok(app
        .post(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "phone", "value": "170*", "sandbox": "loan"},
                {"dimension": "phone", "value": "+86 165 *", "sandbox": "loan", "ttl_seconds": 3600},
                {"dimension": "email", "value": "John.Smith+ads@Example.com", "sandbox": "loan"},
                {"dimension": "email", "value": "@Fraud.Example", "sandbox": "loan"}
            ]}),
        )
        .await)
    .await;
    assert_eq!(body, json!({"written": 4}));

    for (path, listed) in [
        ("/v1/lists/black/entries/phone/170*?sandbox=loan", true),
        ("/v1/lists/black/entries/phone/170%2A?sandbox=loan", true),
        ("/v1/lists/black/entries/phone/%2B86165*?sandbox=loan", true),
        ("/v1/lists/black/entries/phone/17*?sandbox=loan", false),
        ("/v1/lists/black/entries/phone/170*", false),
        (
            "/v1/lists/black/entries/email/@fraud.example?sandbox=loan",
            true,
        ),
        (
            "/v1/lists/black/entries/email/%40FRAUD.example?sandbox=loan",
            true,
        ),
        (
            "/v1/lists/black/entries/email/@a.fraud.example?sandbox=loan",
            false,
        ),
        (
            "/v1/lists/black/entries/email/john.smith@example.com?sandbox=loan",
            true,
        ),
        (
            "/v1/lists/black/entries/email/a@fraud.example?sandbox=loan",
            false,
        ),
    ] {
        let body = ok(app.get(path).await).await;
        assert_eq!(body["listed"], listed, "{path}: {body}");
    }

    let body = app
        .check(
            &json!({"sandbox": "loan", "lists": ["black", "grey"], "subjects": {
            "phone": ["17012345678", "+86 165 0000 0000", "13800000000"],
            "email": ["JOHN.smith@example.COM", "x@mail.fraud.example", "x@fraud.example.com"]}}),
        )
        .await;
    assert_eq!(
        hit_values(&body),
        vec![
            hit("black", "email", "@fraud.example"),
            hit("black", "email", "john.smith@example.com"),
            hit("black", "phone", "+86165*"),
            // Rules 2: `170*` read in CN is `+86170*`.
            hit("black", "phone", "+86170*"),
        ],
        "{body}"
    );

    // Without precedence the answer is exactly what it always was: no `decision` key.
    let res = app
        .post(
            "/v1/check",
            &json!({"sandbox": "loan", "lists": ["black"], "subjects": {"phone": "17000000000"}}),
        )
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.text().await.unwrap(),
        r#"{"hits":[{"list":"black","dimension":"phone","value":"+86170*","expires_at":null}],"degraded":false}"#
    );

    let body = ok(app
        .delete(
            "/v1/lists/black/entries",
            &json!({"entries": [
                {"dimension": "phone", "value": "170 *", "sandbox": "loan"},
                {"dimension": "email", "value": "@fraud.example.", "sandbox": "loan"},
                {"dimension": "email", "value": "@other.example", "sandbox": "loan"}
            ]}),
        )
        .await)
    .await;
    assert_eq!(body, json!({"removed": 2}));
    let body = app
        .check(&json!({"sandbox": "loan", "lists": ["black"], "subjects": {
            "phone": "17012345678", "email": "x@mail.fraud.example"}}))
        .await;
    assert_eq!(hit_values(&body), vec![], "{body}");
}

async fn precedence_adds_a_decision(redis: &Backend) {
    let app = app_on(redis).await;
    for (list, entries) in [
        ("white", json!([{"dimension": "uid", "value": "vip"}])),
        (
            "black",
            json!([{"dimension": "uid", "value": "vip"}, {"dimension": "phone", "value": "170*"}]),
        ),
    ] {
        ok(app
            .post(
                &format!("/v1/lists/{list}/entries"),
                &json!({ "entries": entries }),
            )
            .await)
        .await;
    }
    let check = |uid: &str, precedence: Value| {
        json!({"lists": ["white", "black", "grey"], "precedence": precedence,
               "subjects": {"uid": uid, "phone": "17000000000"}})
    };
    for (uid, precedence, decision, hits) in [
        ("vip", json!(["white", "black", "grey"]), json!("white"), 3),
        ("vip", json!(["black", "white"]), json!("black"), 3),
        ("other", json!(["white", "black"]), json!("black"), 1),
        ("other", json!(["grey", "white"]), json!(null), 1),
    ] {
        let body = app.check(&check(uid, precedence.clone())).await;
        assert_eq!(body["decision"], decision, "{uid} {precedence}: {body}");
        assert!(body.as_object().unwrap().contains_key("decision"), "{body}");
        assert_eq!(
            body["hits"].as_array().unwrap().len(),
            hits,
            "every hit is still reported: {body}"
        );
    }

    // Evaluate: the same decision, and a rule that reads it.
    let res = app
        .client
        .put(app.url("/v1/rules/blocked"))
        .json(&json!({"expr": "decision == \"black\""}))
        .send()
        .await
        .unwrap();
    let rule = ok(res).await;
    assert_eq!(rule["metrics"], json!([]), "{rule}");
    let evaluate = |uid: &str, precedence: Option<Value>| {
        let mut body = json!({"lists": ["white", "black"], "rules": ["blocked"],
                              "subjects": {"uid": uid}});
        if let Some(p) = precedence {
            body["precedence"] = p;
        }
        body
    };
    for (uid, precedence, decision, blocked) in [
        (
            "vip",
            Some(json!(["white", "black"])),
            Some(json!("white")),
            false,
        ),
        (
            "vip",
            Some(json!(["black", "white"])),
            Some(json!("black")),
            true,
        ),
        ("vip", None, None, false),
        (
            "nobody",
            Some(json!(["white", "black"])),
            Some(json!(null)),
            false,
        ),
    ] {
        let body = ok(app
            .post("/v1/evaluate", &evaluate(uid, precedence.clone()))
            .await)
        .await;
        assert_eq!(
            body.get("decision"),
            decision.as_ref(),
            "{uid} {precedence:?}: {body}"
        );
        assert_eq!(
            body["rules"]["blocked"], blocked,
            "{uid} {precedence:?}: {body}"
        );
        if precedence.is_none() {
            let mut keys: Vec<&String> = body.as_object().unwrap().keys().collect();
            keys.sort();
            assert_eq!(keys, ["degraded", "features", "hits", "rules"], "{body}");
        }
    }
}

/// One bad request and what its error must say.
struct Bad {
    path: &'static str,
    body: Value,
    code: &'static str,
    says: &'static [&'static str],
}

fn entries(values: &[(&str, &str)]) -> Value {
    let list: Vec<Value> = values
        .iter()
        .map(|(d, v)| json!({"dimension": d, "value": v}))
        .collect();
    json!({ "entries": list })
}

async fn bad_forms_are_400s_and_change_nothing(redis: &Backend) {
    let app = app_on(redis).await;
    let post = "/v1/lists/black/entries";
    let fine = ("uid", "fine");
    let value = |i: usize, dim: &str, v: &str| {
        let mut list = vec![fine; i];
        list.push((dim, v));
        entries(&list)
    };
    let cases = vec![
        Bad {
            path: post,
            body: value(1, "phone", "*"),
            code: "invalid_value",
            says: &["entries[1].value", "invalid phone", "1-19 digits"],
        },
        Bad {
            path: post,
            body: value(2, "phone", "1*2"),
            code: "invalid_value",
            says: &["entries[2].value", "invalid phone", "only end a segment"],
        },
        Bad {
            path: post,
            body: value(0, "phone", "+*"),
            code: "invalid_value",
            says: &["entries[0].value", "1-19 digits"],
        },
        Bad {
            path: post,
            body: value(3, "phone", "12345678901234567890*"),
            code: "invalid_value",
            says: &["entries[3].value", "1-19 digits"],
        },
        Bad {
            path: post,
            body: value(1, "email", "a@b@example.com"),
            code: "invalid_value",
            says: &["entries[1].value", "invalid email", "exactly one @"],
        },
        Bad {
            path: post,
            body: value(1, "email", "john@localhost"),
            code: "invalid_value",
            says: &["entries[1].value", "at least one dot"],
        },
        Bad {
            path: post,
            body: value(0, "email", "@localhost"),
            code: "invalid_value",
            says: &["entries[0].value", "at least one dot"],
        },
        Bad {
            path: post,
            body: value(2, "email", &format!("a@{}com", "abcdefghi.".repeat(26))),
            code: "invalid_value",
            says: &["entries[2].value", "longer than 253 bytes"],
        },
        Bad {
            path: post,
            body: value(1, "email", &format!("{}@example.com", "a".repeat(65))),
            code: "invalid_value",
            says: &["entries[1].value", "1-64 bytes"],
        },
        Bad {
            path: post,
            body: value(1, "email", "a@xn--a.example"),
            code: "invalid_value",
            says: &["entries[1].value", "IDNA"],
        },
        Bad {
            path: post,
            body: value(1, "email", "a@bücher-.example"),
            code: "invalid_value",
            says: &["entries[1].value", "IDNA"],
        },
        Bad {
            path: post,
            body: value(1, "email", "@a.b.c.d.e.f.g.h.i.j.example"),
            code: "invalid_value",
            says: &["entries[1].value", "at most 10 labels"],
        },
        Bad {
            path: "/v1/check",
            body: json!({"lists": ["black"], "subjects": {"phone": ["13800000000", "170*"]}, "strict": true}),
            code: "invalid_value",
            says: &["subjects.phone[1]", "only in entries"],
        },
        Bad {
            path: "/v1/check",
            body: json!({"lists": ["black"], "subjects": {"email": "@example.com"}, "strict": true}),
            code: "invalid_value",
            says: &["subjects.email[0]", "only in entries"],
        },
        Bad {
            path: "/v1/check",
            body: json!({"lists": ["white", "black"], "precedence": ["white", "grey"],
                         "subjects": {"uid": "u"}}),
            code: "invalid_lists",
            says: &["precedence[1]", "grey", "not in lists"],
        },
        Bad {
            path: "/v1/check",
            body: json!({"lists": ["white"], "precedence": [], "subjects": {"uid": "u"}}),
            code: "invalid_lists",
            says: &["precedence"],
        },
        Bad {
            path: "/v1/evaluate",
            body: json!({"lists": ["white", "black"], "precedence": ["grey"],
                         "subjects": {"uid": "u"}}),
            code: "invalid_lists",
            says: &["precedence[0]", "not in lists"],
        },
        Bad {
            path: "/v1/evaluate",
            body: json!({"precedence": ["white"]}),
            code: "invalid_lists",
            says: &["precedence"],
        },
    ];
    let before = redis.digest();
    for case in cases {
        let res = app.post(case.path, &case.body).await;
        assert_eq!(res.status(), 400, "{}", case.body);
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"]["code"], case.code, "{}: {body}", case.body);
        assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
        assert_eq!(body["error"].as_object().unwrap().len(), 2, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        for piece in case.says {
            assert!(
                message.contains(piece),
                "{}: message {message:?} should say {piece:?}",
                case.body
            );
        }
        assert_eq!(redis.digest(), before, "{} changed the store", case.body);
    }

    // A rule comparing `decision` wrongly is refused too.
    let res = app
        .client
        .put(app.url("/v1/rules/bad"))
        .json(&json!({"expr": "decision > \"black\""}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_rule", "{body}");
    assert_eq!(redis.digest(), before, "a refused rule changed the store");
}

macro_rules! on_every_redis {
    ($($case:ident),* $(,)?) => {
        mod node {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Backend::Node(super::RedisServer::start())).await;
                }
            )*
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_all_cases() {
            let cluster = Backend::Cluster(tokio::task::block_in_place(RedisCluster::start));
            $(
                eprintln!("cluster: {}", stringify!($case));
                $case(&cluster).await;
            )*
        }
    };
}

on_every_redis!(
    segments_addresses_and_domains_round_trip,
    precedence_adds_a_decision,
    bad_forms_are_400s_and_change_nothing,
);
