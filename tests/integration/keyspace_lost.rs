//! A lost keyspace (issue 25, point 3): Redis restarted without its data is noticed within a
//! few seconds, never silently recreated; writes are refused with `keyspace_lost` and nothing
//! is written; checks are answered from the tier (fail-open) or refused (fail-closed); the
//! same keyspace restored brings instances back by themselves; a new one needs the explicit
//! `keyspace create` and is adopted on restart.

use crate::common;

use std::time::{Duration, Instant};

use common::{RedisServer, TestApp, redis_settings, spawn_app};
use namelist::config::Settings;
use namelist::lists::FailMode;
use namelist::startup::Application;
use namelist::store::Layout;
use namelist::store::redis::{RedisOptions, RedisStore};
use serde_json::{Value, json};

fn upsert(values: &[&str]) -> Value {
    json!({"entries": values.iter()
        .map(|v| json!({"dimension": "uid", "value": v}))
        .collect::<Vec<_>>()})
}

fn check(values: &[&str]) -> Value {
    json!({"lists": ["black"], "subjects": {"uid": values}})
}

/// Every key of the keyspace at `prefix`, as `DUMP`s: what an RDB restore brings back.
pub(crate) fn dump_all(redis: &RedisServer, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut conn)
        .unwrap();
    keys.into_iter()
        .map(|k| {
            let d: Vec<u8> = redis::cmd("DUMP").arg(&k).query(&mut conn).unwrap();
            (k, d)
        })
        .collect()
}

pub(crate) fn restore_all(redis: &RedisServer, dumps: &[(String, Vec<u8>)]) {
    let mut conn = redis.conn();
    for (k, d) in dumps {
        let () = redis::cmd("RESTORE")
            .arg(k)
            .arg(0)
            .arg(d.as_slice())
            .arg("REPLACE")
            .query(&mut conn)
            .unwrap();
    }
}

fn meta_exists(redis: &RedisServer, prefix: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(format!("{prefix}meta"))
        .query::<i64>(&mut redis.conn())
        .unwrap()
        == 1
}

/// Polls until the instance has seen the keyspace lost (its gauge), for at most `limit`;
/// `/readyz` is 503 from then on.
async fn lost_within(app: &TestApp, limit: Duration) -> Duration {
    let started = Instant::now();
    while app.metric("namelist_keyspace_lost").await != Some(1.0) {
        assert!(
            started.elapsed() < limit,
            "the lost keyspace was not noticed within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    assert_eq!(app.get("/readyz").await.status(), 503);
    took
}

/// Polls `/readyz` until it answers `status`, for at most `limit`.
async fn ready_becomes(app: &TestApp, status: u16, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if app.get("/readyz").await.status() == status {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "/readyz did not become {status} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn error_code(res: reqwest::Response) -> (u16, String) {
    let status = res.status().as_u16();
    let body: Value = res.json().await.expect("a JSON error");
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

/// A Redis, an instance on it with `fail_mode`, and `u1` listed through it.
async fn listed_u1(fail_mode: FailMode) -> (RedisServer, Settings, TestApp) {
    let redis = RedisServer::start();
    let settings = Settings {
        fail_mode,
        ..redis_settings(&redis)
    };
    let app = spawn_app(settings.clone()).await;
    assert_eq!(write(&app, "u1").await, 200);
    (redis, settings, app)
}

/// `POST /v1/lists/black/entries` of one uid: the status.
async fn write(app: &TestApp, value: &str) -> u16 {
    app.post("/v1/lists/black/entries", &upsert(&[value]))
        .await
        .status()
        .as_u16()
}

/// Asserts that the keyspace at `prefix` holds nothing but the lost marker: nothing was
/// written into the empty one (`more` ends the failure's message). The marker is waited for
/// (up to 3 s: its first try may fail and is tried again).
async fn only_the_marker(redis: &RedisServer, prefix: &str, more: &str) {
    let started = Instant::now();
    while !marker_exists(redis, prefix) && started.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(
        keys,
        vec![Layout::lost_marker_key_of(prefix)],
        "nothing but the marker is written{more}"
    );
}

fn marker_exists(redis: &RedisServer, prefix: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(Layout::lost_marker_key_of(prefix))
        .query::<i64>(&mut redis.conn())
        .unwrap()
        == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_restarted_empty_is_noticed_and_never_recreated() {
    let (mut redis, settings, app) = listed_u1(FailMode::Open).await;
    let prefix = settings.key_prefix.clone();
    let body = app.check(&check(&["u1", "never-seen"])).await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["degraded"], false);

    redis.restart_empty();
    let noticed = lost_within(&app, Duration::from_secs(5)).await;
    eprintln!("lost keyspace noticed after {noticed:?}");

    // Writes: refused, nothing written, the meta key not recreated.
    let (status, code) =
        error_code(app.post("/v1/lists/black/entries", &upsert(&["u2"])).await).await;
    assert_eq!((status, code.as_str()), (503, "keyspace_lost"));
    let (status, code) = error_code(
        app.delete("/v1/lists/black/entries", &upsert(&["u1"]))
            .await,
    )
    .await;
    assert_eq!((status, code.as_str()), (503, "keyspace_lost"));
    assert!(!meta_exists(&redis, &prefix), "the keyspace was recreated");
    only_the_marker(&redis, &prefix, "").await;

    // Checks: from the tier, degraded, the listed entry still a hit, the rest as of the loss.
    let body = app.check(&check(&["u1", "never-seen"])).await;
    assert_eq!(body["degraded"], true, "{body}");
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["hits"][0]["value"], "u1");
    assert!(body["stale_ms"].as_u64().is_some(), "{body}");
    assert!(
        body.get("unanswered").is_none(),
        "a complete tier holds every bucket: {body}"
    );

    // A new instance refuses to start instead of making a new keyspace.
    let err = match Application::build(settings.clone()).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an instance started on a lost keyspace"),
    };
    assert!(err.contains("namelist-tools keyspace create"), "{err}");
    assert!(!meta_exists(&redis, &prefix));

    // Still lost a few seconds later (the periodic check never "heals" an empty keyspace).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(app.get("/readyz").await.status(), 503);
    app.stop().await;
}

/// The marker is left even when its first try fails (CI once found none: the loss was seen
/// first on a connection other than the one the marker went out on, which the restart had
/// broken): it is tried again for as long as the keyspace stays lost. Here the server
/// refuses `SET` until the loss has been noticed and a few tries have failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lost_marker_is_left_even_if_its_first_try_fails() {
    let (redis, settings, app) = listed_u1(FailMode::Open).await;
    let prefix = settings.key_prefix.clone();
    redis.acl_setuser("default", "-set");
    let () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    // A check is the first to meet the loss (a write's entries would land before its probe
    // refuses them: `only_the_marker` below is about the marker alone).
    app.check(&check(&["u1", "never-seen"])).await;
    lost_within(&app, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker_exists(&redis, &prefix), "SET was refused");

    redis.acl_setuser("default", "+set");
    let started = Instant::now();
    while !marker_exists(&redis, &prefix) {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "no marker 3 s after SET was allowed again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    only_the_marker(&redis, &prefix, "").await;
    // A new instance is refused instead of making a new keyspace.
    let err = match Application::build(settings.clone()).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("an instance started on a lost keyspace"),
    };
    assert!(err.contains("namelist-tools keyspace create"), "{err}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_checks_with_keyspace_lost() {
    let (mut redis, _, app) = listed_u1(FailMode::Closed).await;
    redis.restart_empty();
    lost_within(&app, Duration::from_secs(5)).await;
    // A check the tier answers whole needs no store read, so the loss may only show on one
    // that does: a value on a list the tier reads from Redis. Complete tiers answer every
    // lookup locally, so the refusal shows once the tier stops being trusted.
    let started = Instant::now();
    loop {
        let res = app.post("/v1/check", &check(&["u1"])).await;
        if res.status() == 503 {
            let (_, code) = error_code(res).await;
            assert_eq!(code, "keyspace_lost");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a fail-closed check kept being answered on a lost keyspace"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_keyspace_restored_is_resumed_by_itself() {
    let (mut redis, settings, app) = listed_u1(FailMode::Open).await;
    let prefix = settings.key_prefix.clone();
    let backup = dump_all(&redis, &prefix);

    redis.restart_empty();
    lost_within(&app, Duration::from_secs(5)).await;
    // The backup brought back (an RDB restored): the same keyspace id.
    restore_all(&redis, &backup);
    let resumed = ready_becomes(&app, 200, Duration::from_secs(5)).await;
    eprintln!("restored keyspace resumed after {resumed:?}");
    assert_eq!(app.metric("namelist_keyspace_lost").await, Some(0.0));
    assert_eq!(write(&app, "u2").await, 200);
    // The marker is gone: a new instance starts on it.
    assert!(!marker_exists(&redis, &prefix));
    let other = spawn_app(settings).await;
    let started = Instant::now();
    loop {
        let body = other.check(&check(&["u1", "u2", "u3"])).await;
        let hits: Vec<&str> = body["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["value"].as_str().unwrap())
            .collect();
        if hits == ["u1", "u2"] && body["degraded"] == false {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And the first instance answers from Redis again, exactly.
    let body = app.check(&check(&["u1", "u2", "u3"])).await;
    assert_eq!(body["degraded"], false, "{body}");
    assert_eq!(body["hits"].as_array().unwrap().len(), 2, "{body}");
    other.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_keyspace_is_made_explicitly_and_adopted_on_restart() {
    let (mut redis, settings, app) = listed_u1(FailMode::Open).await;
    let prefix = settings.key_prefix.clone();
    redis.restart_empty();
    lost_within(&app, Duration::from_secs(5)).await;

    // What `namelist-tools keyspace create --lost-for-good` does.
    let (_, report) =
        RedisStore::open_anew(RedisOptions::from_settings(&settings).expect("options"))
            .await
            .expect("a new keyspace");
    assert!(report.created);
    assert!(meta_exists(&redis, &prefix));

    // The running instance does not adopt it: another id is not its keyspace.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(app.get("/readyz").await.status(), 503);
    let (status, code) =
        error_code(app.post("/v1/lists/black/entries", &upsert(&["u2"])).await).await;
    assert_eq!((status, code.as_str()), (503, "keyspace_lost"));
    app.stop().await;

    // A restarted one does, empty.
    let fresh = spawn_app(settings).await;
    assert_eq!(fresh.get("/readyz").await.status(), 200);
    assert_eq!(write(&fresh, "u3").await, 200);
    let body = fresh.check(&check(&["u1", "u3"])).await;
    assert_eq!(body["hits"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(body["hits"][0]["value"], "u3");
    fresh.stop().await;
}

/// `PUT /v1/metrics/n`, the count of `tx` events by `user` in the last hour: status and
/// error code.
pub(crate) async fn define_n(app: &TestApp) -> (u16, String) {
    let res = app
        .client
        .put(app.url("/v1/metrics/n"))
        .json(&json!({"expr": "COUNT(1h, tx) BY user"}))
        .send()
        .await
        .unwrap();
    error_code(res).await
}

/// `POST /v1/events` of one transaction of user `u` with id `id`: status and body.
async fn event(app: &TestApp, id: &str) -> (u16, Value) {
    let res = app
        .post(
            "/v1/events",
            &json!({"id": id, "type": "tx", "fields": {"user": "u"}}),
        )
        .await;
    (
        res.status().as_u16(),
        res.json().await.unwrap_or(Value::Null),
    )
}

/// `POST /v1/features` of metric `n` for user `u`: status and body.
async fn count(app: &TestApp) -> (u16, Value) {
    let res = app
        .post(
            "/v1/features",
            &json!({"metrics": ["n"], "fields": {"user": "u"}}),
        )
        .await;
    (
        res.status().as_u16(),
        res.json().await.unwrap_or(Value::Null),
    )
}

/// Velocity through a lost keyspace, from the first request after Redis restarted empty
/// or was flushed: no event is acknowledged (it would count in a keyspace about to be
/// replaced) and none is recorded as seen (its retry after the restore would be taken for a
/// replay); no count is answered (they all read 0 there); the instance keeps its definitions
/// (read from the empty Redis they would all be gone, and events would then be taken and
/// counted nowhere). Once the same keyspace is restored, the count is the one before the
/// loss, and the event refused meanwhile, sent again, counts once. `count_first`: the first
/// request to meet the lost keyspace is a read of counts, else an event (the first to meet
/// it is the one that must find it out: afterwards the instance knows).
async fn velocity_through_a_lost_keyspace(flush: bool, count_first: bool) {
    let (mut redis, settings, app) = listed_u1(FailMode::Open).await;
    let prefix = settings.key_prefix.clone();
    assert_eq!(define_n(&app).await.0, 200);
    assert_eq!(event(&app, "e1").await.0, 200);
    assert_eq!(count(&app).await, (200, json!({"values": {"n": 1}})));
    let backup = dump_all(&redis, &prefix);

    if flush {
        // No connection breaks: the first request is the first to meet the empty keyspace.
        let () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    } else {
        redis.restart_empty();
    }
    // From the first request on, until the instance has noticed and some time after (its
    // subscription, after a restart, comes back and reads the definitions again meanwhile).
    let started = Instant::now();
    let mut refused = 0;
    while started.elapsed() < Duration::from_secs(2)
        || app.metric("namelist_keyspace_lost").await != Some(1.0)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the loss was not noticed"
        );
        for read in [count_first, !count_first] {
            if read {
                let (status, body) = count(&app).await;
                assert_eq!(status, 503, "a count read from a lost keyspace: {body}");
            } else {
                let (status, body) = event(&app, "e2").await;
                assert_eq!(status, 503, "an event taken into a lost keyspace: {body}");
            }
        }
        refused += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for res in [event(&app, "e2").await, count(&app).await] {
        assert_eq!(res.0, 503, "{res:?}");
        assert_eq!(res.1["error"]["code"], "keyspace_lost", "{res:?}");
    }
    only_the_marker(&redis, &prefix, &format!(" ({refused} events refused)")).await;
    let metrics: Value = app.get("/v1/metrics").await.json().await.unwrap();
    assert!(
        metrics.to_string().contains("COUNT(1h, tx) BY user"),
        "{metrics}"
    );

    restore_all(&redis, &backup);
    ready_becomes(&app, 200, Duration::from_secs(5)).await;
    // Right after the restore a read may miss its deadline (a 503 `store_unavailable`, the
    // store's failure: seen in about one run in six, the instance catching up meanwhile):
    // the count is read again until it is answered.
    let started = Instant::now();
    loop {
        let (status, body) = count(&app).await;
        if status == 200 {
            assert_eq!(
                body,
                json!({"values": {"n": 1}}),
                "the count before the loss"
            );
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(started.elapsed() < Duration::from_secs(5), "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The event refused during the loss, sent again as the engine would (again after a
    // 503): it counts, once.
    loop {
        let (status, body) = event(&app, "e2").await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(started.elapsed() < Duration::from_secs(10), "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(count(&app).await, (200, json!({"values": {"n": 2}})));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn velocity_through_a_keyspace_restarted_empty_is_refused_not_miscounted() {
    velocity_through_a_lost_keyspace(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn velocity_through_a_flushed_keyspace_is_refused_not_miscounted() {
    velocity_through_a_lost_keyspace(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_of_a_flushed_keyspace_are_refused_not_read_as_zero() {
    velocity_through_a_lost_keyspace(true, true).await;
}

/// A metric defined through an instance that has not yet seen the keyspace flushed: refused
/// (`keyspace_lost`) by the definition script's own check of the keyspace id, before
/// anything is written or announced, so nothing stands in the empty keyspace but the lost
/// marker (a definition acknowledged there would be gone once the keyspace is restored). The
/// instance knows from then on: the next changes, a definition and a deletion, are refused
/// unsent. (A deletion as the first change writes nothing either way: the script finds no
/// definition to mark deleted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_put_into_a_flushed_keyspace_is_refused_unwritten() {
    let (redis, settings, app) = listed_u1(FailMode::Open).await;
    let prefix = settings.key_prefix.clone();
    let drop = || async {
        let res = app
            .client
            .delete(app.url("/v1/metrics/n"))
            .send()
            .await
            .unwrap();
        error_code(res).await
    };
    assert_eq!(define_n(&app).await.0, 200);
    let () = redis::cmd("FLUSHALL").query(&mut redis.conn()).unwrap();
    let lost = (503, "keyspace_lost".to_owned());
    assert_eq!(
        define_n(&app).await,
        lost,
        "the first change after the flush"
    );
    lost_within(&app, Duration::from_secs(5)).await;
    // The marker is left by a task of its own: wait for it, then for nothing else.
    let started = Instant::now();
    while !marker_exists(&redis, &prefix) {
        assert!(started.elapsed() < Duration::from_secs(5), "no lost marker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    only_the_marker(&redis, &prefix, " by the refused change").await;
    assert_eq!(define_n(&app).await, lost);
    assert_eq!(drop().await, lost);
    only_the_marker(&redis, &prefix, " by the changes after").await;
    app.stop().await;
}

/// With `create_keyspace = false` (production's setting) an empty Redis is never taken for a
/// new one: Redis restarted without its data while every instance was down (so none left the
/// lost marker) refuses every start, writing nothing, until the keyspace is restored or made
/// explicitly (what `namelist-tools keyspace create` does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_create_keyspace_an_emptied_redis_is_refused_not_made_anew() {
    let mut redis = RedisServer::start();
    let settings = Settings {
        create_keyspace: false,
        ..redis_settings(&redis)
    };
    let prefix = settings.key_prefix.clone();
    let refused = |what: &'static str| {
        let settings = settings.clone();
        async move {
            match Application::build(settings).await {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{what}: an instance made a keyspace on an empty Redis"),
            }
        }
    };
    // A new Redis: refused, naming the setting and the tool; nothing written.
    let err = refused("new Redis").await;
    assert!(err.contains("create_keyspace = false"), "{err}");
    assert!(err.contains("namelist-tools keyspace create"), "{err}");
    let keys: i64 = redis::cmd("DBSIZE").query(&mut redis.conn()).unwrap();
    assert_eq!(keys, 0);

    // Made explicitly (the tool's call), then instances start and serve.
    let (_, report) =
        RedisStore::open_configured(RedisOptions::from_settings(&settings).unwrap(), true)
            .await
            .unwrap();
    assert!(report.created);
    let app = spawn_app(settings.clone()).await;
    let res = app.post("/v1/lists/black/entries", &upsert(&["u1"])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(app.check(&check(&["u1"])).await["hits"][0]["value"], "u1");
    app.stop().await;

    // Redis restarted empty while no instance ran: refused again, nothing written.
    redis.restart_empty();
    let err = refused("emptied Redis").await;
    assert!(err.contains("create_keyspace = false"), "{err}");
    assert!(!meta_exists(&redis, &prefix));
}
