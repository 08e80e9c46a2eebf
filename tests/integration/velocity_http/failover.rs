//! Events across a primary's failover, on the production recommendation: a local Redis
//! Cluster (3 primaries, 3 replicas) with `write_replicas = 1`, two instances. Every event
//! (with its id) is sent to both instances at once, the original and a racing replay, and
//! each is retried after a 503 until it is acknowledged, as the risk engine does; meanwhile
//! one shard's primary is killed (SIGKILL), its replica promoted, and the killed node
//! restarted as a replica. An event updates two entities (a device and a user), so most
//! events are two script calls on two shards, each remembering the event.
//!
//! Asserted from the history of every event sent: each is acknowledged by both instances in
//! the end; each shard refused some while it had no replica (so the window was exercised);
//! and every count and sum, per device and per user, equals the events sent: none lost
//! (an acknowledged write is on a replica before it is acknowledged) and none counted twice
//! (a retry of a call that did land, on the old primary and its replica, finds the event
//! remembered with the update it made).

use super::*;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{RedisCluster, cluster_settings};
use namelist::store::layout::key_slot;

/// Longer than the window without a replica (failover, 3 s, rejoin): an event that is not
/// acknowledged by then never will be.
const ACK_WITHIN: Duration = Duration::from_secs(40);

/// One event's outcome: how many 503s it met before both instances acknowledged it.
struct Sent {
    device: usize,
    user: usize,
    amount: i64,
    refusals: usize,
}

/// Posts `body` until a 200, sleeping a little after each 503; returns the 503s met.
async fn until_acknowledged(app: &TestApp, body: &Value) -> usize {
    let started = Instant::now();
    let mut refusals = 0;
    loop {
        let res = app.post("/v1/events", body).await;
        let status = res.status().as_u16();
        let text = res.text().await.unwrap_or_default();
        match status {
            200 => return refusals,
            503 => refusals += 1,
            _ => panic!("an event answered {status}: {text}"),
        }
        assert!(
            started.elapsed() < ACK_WITHIN,
            "an event not acknowledged within {ACK_WITHIN:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends events `w-0`, `w-1`, … until `stop`, each to both instances at once.
async fn writer(
    w: usize,
    apps: [Arc<TestApp>; 2],
    devices: Arc<Vec<String>>,
    users: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
) -> Vec<Sent> {
    let mut out = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let (device, user, amount) = ((i * 7 + w) % devices.len(), (i + w) % users.len(), i % 5);
        let body = json!({"events": [{
            "id": format!("{w}-{i}"),
            "type": "tx",
            "fields": {"device_id": devices[device], "userid": users[user], "amount": amount + 1},
        }]});
        let (a, b) = futures::join!(
            until_acknowledged(&apps[0], &body),
            until_acknowledged(&apps[1], &body)
        );
        out.push(Sent {
            device,
            user,
            amount: amount as i64 + 1,
            refusals: a + b,
        });
        sent.fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_count_exactly_once_across_a_primary_failover() {
    let mut cluster = tokio::task::block_in_place(RedisCluster::start);
    assert!(tokio::task::block_in_place(
        || cluster.wait_replicas_online(Duration::from_secs(30))
    ));
    let mut settings = relaxed(cluster_settings(&cluster));
    settings.write_replicas = 1;
    settings.write_deadline_ms = 2_000;
    settings.connect_timeout_ms = 300;
    let a = Arc::new(spawn_app(settings.clone()).await);
    let b = Arc::new(spawn_app(settings).await);
    let count = put_metric(&a, "n", "COUNT(1h, tx) BY device_id", None).await;
    let sum = put_metric(&a, "amt", "SUM(1h, tx, amount) BY userid", None).await;
    // The other instance hears of the definitions by pub/sub.
    for _ in 0..100 {
        let res = send(&b, "GET", "/v1/metrics/amt", None).await;
        if res.status() == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The victim: the primary of the first device's slot; devices and users on every shard.
    let layout = a.lists.store().layout().clone();
    let slot_of = |metric: &Value, value: &str| {
        let (id, version) = (metric["id"].as_str().unwrap(), metric["version"].as_u64());
        key_slot(layout.metric_key(id, version.unwrap(), &[value]).as_bytes())
    };
    let devices: Vec<String> = (0..24).map(|i| format!("dev-{i}")).collect();
    let users: Vec<String> = (0..17).map(|i| format!("user-{i}")).collect();
    let (victim, device_nodes, user_nodes) = tokio::task::block_in_place(|| {
        let node = |slot| cluster.primary_of_slot(slot);
        let d: Vec<usize> = devices.iter().map(|v| node(slot_of(&count, v))).collect();
        let u: Vec<usize> = users.iter().map(|v| node(slot_of(&sum, v))).collect();
        (d[0], d, u)
    });
    assert!(
        device_nodes.iter().filter(|&&n| n == victim).count() >= 2
            && device_nodes.iter().any(|&n| n != victim),
        "devices on the victim's shard and on others: {device_nodes:?}"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let (devices, users) = (Arc::new(devices), Arc::new(users));
    let writers: Vec<_> = (0..3)
        .map(|w| {
            tokio::spawn(writer(
                w,
                [a.clone(), b.clone()],
                devices.clone(),
                users.clone(),
                stop.clone(),
                sent.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before_kill = sent.load(Ordering::Relaxed);
    tokio::task::block_in_place(|| cluster.nodes[victim].kill());
    assert!(
        tokio::task::block_in_place(|| cluster.wait_failover(Duration::from_secs(30))),
        "the replica was promoted"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| cluster.nodes[victim].restart());
    assert!(
        tokio::task::block_in_place(|| cluster.wait_replicas_online(Duration::from_secs(30))),
        "the killed node rejoined as a replica"
    );
    // Events past the rejoin, on every shard.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut history = Vec::new();
    for w in writers {
        history.extend(w.await.expect("a writer"));
    }
    assert!(
        before_kill > 0 && history.len() > before_kill,
        "events before and after the kill: {before_kill}, {}",
        history.len()
    );
    let refused: usize = history
        .iter()
        .filter(|s| device_nodes[s.device] == victim || user_nodes[s.user] == victim)
        .map(|s| s.refusals)
        .sum();
    assert!(
        refused > 0,
        "the shard without a replica refused events (write_replicas = 1), which were retried"
    );

    let mut counts: HashMap<usize, i64> = HashMap::new();
    let mut sums: HashMap<usize, i64> = HashMap::new();
    for s in &history {
        *counts.entry(s.device).or_default() += 1;
        *sums.entry(s.user).or_default() += s.amount;
    }
    for (i, d) in devices.iter().enumerate() {
        let got = features(&a, &["n"], json!({ "device_id": d }), None).await;
        let want = counts.get(&i).copied().unwrap_or(0);
        assert_eq!(got["n"], json!(want), "{d} (node {})", device_nodes[i]);
    }
    for (i, u) in users.iter().enumerate() {
        let got = features(&b, &["amt"], json!({ "userid": u }), None).await;
        let want = sums.get(&i).copied().unwrap_or(0);
        assert_eq!(
            got["amt"].as_f64(),
            Some(want as f64),
            "{u} (node {})",
            user_nodes[i]
        );
    }
    eprintln!(
        "{} events, each sent to both instances; {refused} refusals on the victim's shard, \
         each retried; every count and sum exact",
        history.len()
    );
}
