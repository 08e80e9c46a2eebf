//! README's error table and `ErrorCode` say the same: every code the table names exists,
//! with exactly the statuses it gives, and every code answered over HTTP is in the table; and
//! `docs/api.md` is a copy of the HTTP contract.

use std::collections::{BTreeMap, BTreeSet};

use namelist::domain::ErrorCode;

/// (code → statuses) from README's table under "Errors are".
fn readme_table() -> BTreeMap<String, BTreeSet<u16>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let start = readme
        .find("Errors are `{\"error\"")
        .expect("README has the error table");
    let mut table = BTreeMap::<String, BTreeSet<u16>>::new();
    let rows = readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2); // header and separator
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (statuses, codes) = (cells[1], cells[2]);
        // "404 / 409" with "`a`, `b` / `c`": the codes before the slash have the first status.
        let statuses: Vec<u16> = statuses
            .split('/')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("status in {row}"))
            })
            .collect();
        let groups: Vec<&str> = codes.split('/').collect();
        assert_eq!(
            statuses.len(),
            groups.len(),
            "statuses and code groups in {row}"
        );
        for (status, group) in statuses.iter().zip(groups) {
            for code in group.split(',') {
                let code = code.trim().trim_matches('`');
                assert!(!code.is_empty(), "a code in {row}");
                table.entry(code.to_owned()).or_default().insert(*status);
            }
        }
    }
    assert!(table.len() > 10, "parsed only {table:?}");
    table
}

#[test]
fn readme_error_table_matches_error_code() {
    let readme = readme_table();
    for (code, statuses) in &readme {
        let parsed: ErrorCode = code
            .parse()
            .unwrap_or_else(|e| panic!("README names {code}: {e}"));
        let ours: BTreeSet<u16> = parsed.statuses().iter().copied().collect();
        assert_eq!(&ours, statuses, "statuses of {code}: ErrorCode vs README");
    }
    for &code in ErrorCode::ALL {
        if !code.statuses().is_empty() {
            assert!(
                readme.contains_key(code.as_str()),
                "{code} is answered over HTTP but not in README's table"
            );
        }
    }
}

/// `docs/api.md` is the HTTP contract (`../shared/API.md`, outside the repository) byte for
/// byte, so the repository carries the contract it is tested against. Where the contract is
/// not beside the checkout (a clone elsewhere), `NAMELIST_API_CONTRACT` names it; without
/// either there is nothing to compare and the test says so.
#[test]
fn docs_api_is_the_contract() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let contract = std::env::var_os("NAMELIST_API_CONTRACT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join("../shared/API.md"));
    let ours = std::fs::read_to_string(root.join("docs/api.md")).expect("docs/api.md");
    match std::fs::read_to_string(&contract) {
        Ok(theirs) => assert!(
            ours == theirs,
            "docs/api.md differs from {}: copy it again (cp {} docs/api.md)",
            contract.display(),
            contract.display()
        ),
        Err(e) => eprintln!("{}: {e}; docs/api.md not compared", contract.display()),
    }
}
