//! `rediss://` end to end, against a real TLS-only `redis-server` (`--port 0 --tls-port N`)
//! whose certificates are generated here (rcgen): the store and the whole service work over
//! TLS, a server certificate from a CA that is not trusted is refused (promptly), and a Redis
//! password travels inside TLS and is never printed when it is wrong.
//!
//! Trust comes the way it does in production: the redis crate's rustls loads its roots with
//! rustls-native-certs, which reads `SSL_CERT_FILE`. This binary (each test file is its own
//! process) points that variable at a CA of its own before any TLS configuration is built.

use crate::common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{free_port, spawn_app, test_settings};
use namelist::config::Settings;
use namelist::startup::{Application, StartupError};
use namelist::store::redis::{RedisOptions, RedisStore};
use namelist::store::{Deadline, EntryKey, EntryStore, StoreBase, StoreError, WriteBatch};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use secrecy::SecretString;
use serde_json::json;

const PASSWORD: &str = "s3cret";
const WRONG_PASSWORD: &str = "wr0ng-pa55word";

/// A server certificate and key on disk, and the PEM of the CA that signed it.
struct ServerCert {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    ca_pem: String,
}

/// Every certificate of this process: a trusted CA (the one `SSL_CERT_FILE` names) with a
/// server certificate it signed, and an untrusted CA with one of its own.
struct Pki {
    /// Kept for the life of the process: `SSL_CERT_FILE` is read at every TLS connection.
    _dir: tempfile::TempDir,
    trusted: ServerCert,
    untrusted: ServerCert,
}

fn new_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    (cert.pem(), Issuer::new(params, key))
}

/// A CA, and a certificate for 127.0.0.1 and localhost signed by it, written under `dir`.
fn server_cert(dir: &Path, name: &str) -> ServerCert {
    let (ca_pem, issuer) = new_ca(&format!("namelist test CA ({name})"));
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("server params");
    params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server certificate");
    let paths = ServerCert {
        cert: dir.join(format!("{name}-server.pem")),
        key: dir.join(format!("{name}-server.key")),
        ca: dir.join(format!("{name}-ca.pem")),
        ca_pem,
    };
    std::fs::write(&paths.cert, cert.pem()).expect("writing the certificate");
    std::fs::write(&paths.key, key.serialize_pem()).expect("writing the key");
    std::fs::write(&paths.ca, &paths.ca_pem).expect("writing the CA");
    paths
}

static PKI: OnceLock<Pki> = OnceLock::new();

/// The certificates; the first call also makes this process trust the trusted CA (and only
/// it) and installs rustls's crypto provider.
fn pki() -> &'static Pki {
    PKI.get_or_init(|| {
        // Under the target directory, not /tmp: the directory lives as long as the process.
        let dir = tempfile::Builder::new()
            .prefix("tls-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        let trusted = server_cert(dir.path(), "trusted");
        let untrusted = server_cert(dir.path(), "untrusted");
        // SAFETY: `set_var` is unsound only while another thread may read the environment
        // through libc (`getenv`) at the same time. This runs once, inside `OnceLock::get_or_init`,
        // as the first statement of every test (`run`, before its runtime exists): any other
        // test thread is either blocked on this `OnceLock` or has not reached its first
        // statement, and libtest's main thread only waits for results. Nothing else in this
        // process reads the environment before the variable is set.
        unsafe { std::env::set_var("SSL_CERT_FILE", &trusted.ca) };
        let _ = rustls::crypto::ring::default_provider().install_default();
        Pki {
            _dir: dir,
            trusted,
            untrusted,
        }
    })
}

/// Runs a test body: trust set up first, then a runtime of two workers.
fn run<F: Future<Output = ()>>(body: F) {
    pki();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(body);
}

/// A TLS-only `redis-server` (no plain port), killed when dropped.
struct TlsRedis {
    port: u16,
    password: Option<String>,
    child: Child,
    dir: tempfile::TempDir,
}

impl TlsRedis {
    /// Starts a server presenting `cert`; `password` sets `requirepass`.
    fn start(cert: &ServerCert, password: Option<&str>) -> Self {
        for _ in 0..10 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let mut cmd = Command::new(common::redis_server_bin());
            cmd.args(["--port", "0", "--bind", "127.0.0.1"])
                .arg("--tls-port")
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(&cert.cert)
                .arg("--tls-key-file")
                .arg(&cert.key)
                .arg("--tls-ca-cert-file")
                .arg(&cert.ca)
                .args([
                    "--tls-auth-clients",
                    "no",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"));
            if let Some(p) = password {
                cmd.args(["--requirepass", p]);
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning redis-server");
            let mut server = Self {
                port,
                password: password.map(str::to_owned),
                child,
                dir,
            };
            if server.wait_ready(&cert.ca_pem) {
                return server;
            }
        }
        panic!("could not start a TLS redis-server; is redis-server built with TLS?");
    }

    /// Waits until a TLS client trusting `ca_pem` (given directly, not through the
    /// environment) gets a PONG; false if the server exited (port taken) or never answered.
    fn wait_ready(&mut self, ca_pem: &str) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let client = redis::Client::build_with_tls(
                self.url_with(self.password.as_deref()),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca_pem.as_bytes().to_vec()),
                },
            );
            if let Ok(mut c) =
                client.and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        eprintln!(
            "redis-server on TLS port {} never answered:\n{log}",
            self.port
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }

    /// `rediss://` with the server's own password (if any).
    fn url(&self) -> String {
        self.url_with(self.password.as_deref())
    }

    fn url_with(&self, password: Option<&str>) -> String {
        match password {
            Some(p) => format!("rediss://:{p}@127.0.0.1:{}", self.port),
            None => format!("rediss://127.0.0.1:{}", self.port),
        }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn options(url: String, prefix: &str) -> RedisOptions {
    RedisOptions {
        expected_entries: Some(400 * 16),
        response_timeout: Duration::from_secs(2),
        audit_max_len: 100,
        ..common::redis_options(url, prefix)
    }
}

fn settings_on(url: String) -> Settings {
    Settings {
        redis_url: Some(SecretString::from(url)),
        ..test_settings()
    }
}

/// Opens, writes one entry and reads it back through the store.
async fn write_and_read(url: String) {
    let (store, report) = RedisStore::open(options(url, "tls:"))
        .await
        .expect("the store opens over TLS");
    assert!(report.created);
    store.ping().await.expect("PING over TLS");
    let key = EntryKey {
        bucket: 3,
        field: 0x5eed,
    };
    let absent = EntryKey {
        bucket: 3,
        field: 0x0bad,
    };
    store
        .write(
            WriteBatch {
                entries: vec![(key, 0)],
                ..WriteBatch::default()
            },
            Deadline::after(Duration::from_secs(10)),
        )
        .await
        .expect("a write over TLS");
    let got = store
        .get_many(&[key, absent])
        .await
        .expect("a read over TLS");
    assert_eq!(got, vec![Some(0), None]);
}

/// Opens a store that must fail, within `limit`; returns the error.
async fn open_fails(url: String, limit: Duration) -> StoreError {
    let started = Instant::now();
    let opened = tokio::time::timeout(
        Duration::from_secs(30),
        RedisStore::open(options(url, "x:")),
    )
    .await
    .expect("opening must fail, not hang");
    let elapsed = started.elapsed();
    let err = match opened {
        Ok(_) => panic!("the store opened"),
        Err(e) => e,
    };
    assert!(
        elapsed < limit,
        "failing took {elapsed:?} (connect_timeout 1 s): {err}"
    );
    eprintln!("refused in {elapsed:?}: {err}");
    err
}

#[test]
fn the_store_reads_its_writes_over_tls() {
    run(async {
        let redis = TlsRedis::start(&pki().trusted, None);
        write_and_read(redis.url()).await;
        // The server has no plain port: the traffic above was TLS.
        assert!(
            redis::Client::open(format!("redis://127.0.0.1:{}", redis.port))
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_err(),
            "plain RESP on the TLS port must fail"
        );
    });
}

#[test]
fn the_service_runs_on_rediss() {
    run(async {
        let redis = TlsRedis::start(&pki().trusted, None);
        let app = spawn_app(settings_on(redis.url())).await;

        let res = app.get("/readyz").await;
        assert_eq!(res.status(), 200);
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["store"], "redis");

        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": "uid", "value": "over-tls"}]}),
            )
            .await;
        assert_eq!(res.status(), 200);
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {"uid": ["over-tls", "other"]}}))
            .await;
        let hits = body["hits"].as_array().expect("hits");
        assert_eq!(hits.len(), 1, "{body}");
        assert_eq!(hits[0]["value"], "over-tls", "{body}");
        let res = app.get("/v1/lists/black/entries/uid/over-tls").await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            res.json::<serde_json::Value>().await.unwrap()["listed"],
            true
        );
        app.stop().await;
    });
}

#[test]
fn a_certificate_from_an_untrusted_ca_is_refused() {
    run(async {
        let pki = pki();
        // Up and answering TLS (checked with its own CA): the refusal below is the client's.
        let rogue = TlsRedis::start(&pki.untrusted, None);
        let err = open_fails(rogue.url(), Duration::from_secs(5)).await;
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Unavailable { .. }), "{msg}");
        assert!(
            msg.to_ascii_lowercase().contains("certificate"),
            "the error says it is the certificate: {msg}"
        );

        // The service does not start on it either.
        match Application::build(settings_on(rogue.url())).await {
            Err(e @ StartupError::Store(_)) => {
                assert!(e.to_string().starts_with("opening the store"), "{e}")
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("the service started on an untrusted Redis"),
        }

        // The same client trusts the right CA: a server it signed is accepted.
        let trusted = TlsRedis::start(&pki.trusted, None);
        write_and_read(trusted.url()).await;
    });
}

#[test]
fn a_password_goes_over_tls_and_a_wrong_one_is_not_printed() {
    run(async {
        let redis = TlsRedis::start(&pki().trusted, Some(PASSWORD));
        write_and_read(redis.url()).await;

        for (url, what) in [
            (redis.url_with(Some(WRONG_PASSWORD)), "a wrong password"),
            (redis.url_with(None), "no password"),
        ] {
            let err = open_fails(url.clone(), Duration::from_secs(5)).await;
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(
                    !shown.contains(WRONG_PASSWORD) && !shown.contains(PASSWORD),
                    "{what}: the error shows a password: {shown}"
                );
                assert!(
                    shown.to_ascii_uppercase().contains("AUTH")
                        || shown.to_ascii_uppercase().contains("PASS"),
                    "{what}: the error says it is authentication: {shown}"
                );
            }

            let err = match Application::build(settings_on(url)).await {
                Err(e) => e,
                Ok(_) => panic!("the service started with {what}"),
            };
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(
                    !shown.contains(WRONG_PASSWORD) && !shown.contains(PASSWORD),
                    "{what}: the start-up error shows a password: {shown}"
                );
            }
        }

        // The service with the right password.
        let app = spawn_app(settings_on(redis.url())).await;
        let res = app
            .post(
                "/v1/lists/black/entries",
                &json!({"entries": [{"dimension": "uid", "value": "authed"}]}),
            )
            .await;
        assert_eq!(res.status(), 200);
        let body = app
            .check(&json!({"lists": ["black"], "subjects": {"uid": "authed"}}))
            .await;
        assert_eq!(body["hits"].as_array().map(Vec::len), Some(1), "{body}");
        app.stop().await;
    });
}
