//! The data: entries generated and imported with `namelist-tools` (`gen`, then `import`),
//! the check subjects built from members and non-members (a share carrying one listed value),
//! and the bodies files the generator posts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value as Json, json};

use crate::common;
use crate::settings::{DIMS, LISTED_PCT, LISTS, RANGES, Rng, SANDBOX, run, target_dir};

/// The release `namelist-tools` binary, built now by cargo into this bench's target directory
/// (`cargo build --release -p namelist-tools`; nothing to do when it is up to date). It belongs
/// to the workspace's other package, so there is no `CARGO_BIN_EXE_namelist-tools` here, and a
/// binary merely found in `target/` could be older than the source.
pub(crate) fn tools_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let target = target_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(&cargo)
            .args([
                "build",
                "--release",
                "-p",
                "namelist-tools",
                "--bin",
                "namelist-tools",
            ])
            .arg("--target-dir")
            .arg(&target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(built, "`{cargo} build --release -p namelist-tools` failed");
        target.join("release").join("namelist-tools")
    })
    .clone()
}

/// `gen` writes `entries` rows (and `outsiders` non-member rows when a path is given), then
/// `import` loads them under `prefix`; the import summary.
pub(crate) fn load_keyspace(
    redis_url: &str,
    dir: &Path,
    entries: u64,
    expected_entries: u64,
    prefix: &str,
    outsiders: Option<(&Path, u64)>,
) -> (PathBuf, Json) {
    let members_csv = dir.join(format!("members-{entries}.csv"));
    let mix = DIMS.map(|d| format!("{d}=1")).join(",");
    let mut generate = Command::new(tools_bin());
    generate.args([
        "gen",
        "--rows",
        &entries.to_string(),
        "--seed",
        "42",
        "--lists",
        &LISTS.join(","),
        "--sandboxes",
        SANDBOX,
        "--mix",
        &mix,
        "--cidr-share",
        "0",
        "--out",
        members_csv.to_str().expect("UTF-8 path"),
        "--quiet",
    ]);
    if let Some((path, rows)) = outsiders {
        generate
            .arg("--non-member-rows")
            .arg(rows.to_string())
            .arg("--non-members")
            .arg(path);
    }
    run(&mut generate);
    let imported: Json = serde_json::from_str(
        run(Command::new(tools_bin()).args([
            "--redis-url",
            redis_url,
            "--fingerprint-key-file",
            common::key_file().to_str().expect("UTF-8 path"),
            "--prefix",
            prefix,
            "--expected-entries",
            &expected_entries.to_string(),
            "import",
            members_csv.to_str().expect("UTF-8 path"),
            "--quiet",
            "--json",
        ]))
        .trim(),
    )
    .expect("import summary JSON");
    (members_csv, imported)
}

/// One check's subject and whether it carries a listed value.
pub(crate) struct Subject {
    pub(crate) values: Vec<(&'static str, String)>,
    pub(crate) listed: bool,
}

impl Subject {
    pub(crate) fn body(&self) -> String {
        let subjects: serde_json::Map<String, Json> = self
            .values
            .iter()
            .map(|(d, v)| ((*d).to_owned(), Json::String(v.clone())))
            .collect();
        json!({"sandbox": SANDBOX, "lists": LISTS, "subjects": subjects}).to_string()
    }
}

/// Values by dimension from a `gen` CSV (`list,dimension,value,...`).
pub(crate) fn read_values(path: &Path) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let mut reader = csv::Reader::from_path(path).expect("reading a gen file");
    for row in reader.records() {
        let row = row.expect("a CSV row");
        let (Some(dim), Some(value)) = (row.get(1), row.get(2)) else {
            continue;
        };
        if dim == "ip" && value.contains('/') {
            continue; // a range: not a value a check may carry
        }
        out.entry(dim.to_owned())
            .or_default()
            .push(value.to_owned());
    }
    out
}

/// An address inside one of `RANGES`.
fn address_in_range(range: &str, rng: &mut Rng) -> String {
    let r = rng.next();
    match range {
        "10.1.0.0/16" => format!("10.1.{}.{}", (r >> 8) & 255, r & 255),
        "10.2.2.0/24" => format!("10.2.2.{}", r & 255),
        "10.3.3.0/24" => format!("10.3.3.{}", r & 255),
        _ => format!("3fff:1:2:{:x}::{:x}", (r >> 16) & 0xffff, r & 0xffff),
    }
}

/// `n` subjects of fresh non-member values; `LISTED_PCT` % carry one listed value instead.
pub(crate) fn subjects(
    n: usize,
    outsiders: &HashMap<String, Vec<String>>,
    cursor: &mut usize,
    members: &HashMap<String, Vec<String>>,
    rng: &mut Rng,
) -> Vec<Subject> {
    (0..n)
        .map(|_| {
            let mut values: Vec<(&'static str, String)> = DIMS
                .iter()
                .map(|d| {
                    let pool = &outsiders[*d];
                    (*d, pool[*cursor % pool.len()].clone())
                })
                .collect();
            *cursor += 1;
            let listed = rng.below(100) < LISTED_PCT;
            if listed {
                let which = rng.below(DIMS.len() as u64 + 1) as usize;
                if which == DIMS.len() {
                    let (_, range) = RANGES[rng.below(RANGES.len() as u64) as usize];
                    values[6].1 = address_in_range(range, rng);
                } else {
                    let pool = &members[DIMS[which]];
                    values[which].1 = pool[rng.below(pool.len() as u64) as usize].clone();
                }
            }
            Subject { values, listed }
        })
        .collect()
}

pub(crate) fn write_bodies(path: &Path, subjects: &[Subject]) {
    let mut text = String::with_capacity(subjects.len() * 360);
    for s in subjects {
        text.push_str(&s.body());
        text.push('\n');
    }
    std::fs::write(path, text).expect("writing bodies");
}
