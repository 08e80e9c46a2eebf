//! An operator searches, edits and reads the audit trail (times in Asia/Shanghai, UTC+8),
//! the lists and health pages, in the browser.

use std::time::Duration;

use crate::common::RedisServer;
use fantoccini::Locator;
use serde_json::json;

use super::browser::Browser;
use super::{PHONE, WRITE, XSS, api, app_with_tokens, displayed, last_record, listed};

/// `ms` as the console shows it in Asia/Shanghai (UTC+8 all year): `2026-11-27 16:20:41 UTC+8`.
fn shanghai(ms: i64) -> String {
    let secs = ms.div_euclid(1000) + 8 * 3600;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC+8",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn shanghai_time_is_utc_plus_8() {
    assert_eq!(shanghai(0), "1970-01-01 08:00:00 UTC+8");
    assert_eq!(shanghai(1_795_000_000_123), "2026-11-18 19:06:40 UTC+8");
    assert_eq!(shanghai(951_782_400_000 - 1), "2000-02-29 07:59:59 UTC+8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_searches_edits_and_reads_the_audit_trail() {
    let redis = RedisServer::start();
    let (app, _dir) = app_with_tokens(Some(&redis)).await;
    let (status, body) = api(
        &app,
        "POST",
        "/v1/lists/black/entries",
        Some(json!({"entries": [
            {"dimension": "phone", "value": PHONE, "reason": XSS, "ttl_seconds": 86400},
            {"dimension": "phone", "value": "170*", "reason": "ring 170: virtual operator SIMs"}
        ]})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // One check the risk engine makes: the lists page counts its hit.
    let (status, body) = api(
        &app,
        "POST",
        "/v1/check",
        Some(json!({"lists": ["black"], "subjects": {"phone": PHONE}})),
    )
    .await;
    assert_eq!(
        body["hits"].as_array().map(Vec::len),
        Some(1),
        "{status} {body}"
    );
    // The browser's clock is in Shanghai, this machine's (and the service's) maybe not.
    let b = Browser::start_in(Some("Asia/Shanghai")).await;
    b.sign_in(&app, WRITE).await;
    assert!(
        !displayed(&b, "banner-noauth").await,
        "tokens are configured: no banner"
    );
    assert!(b.text("who").await.contains("list-loader (write)"));
    assert!(
        b.text("zone").await.contains("Asia/Shanghai"),
        "{}",
        b.text("zone").await
    );

    // 1. Search: typed with spaces and dashes, the dimension guessed.
    b.fill("search-q", "138 1234-5678").await;
    b.click("search-btn").await;
    b.wait_for(
        "the hit",
        "return document.querySelectorAll('#search-hits tbody tr td').length >= 5 && document.querySelector('#search-audit tbody tr') !== null",
    )
    .await;
    let hits = b.text("search-hits").await;
    assert!(hits.contains("black") && hits.contains("phone"), "{hits}");
    assert!(hits.contains(XSS), "why it is listed, as text: {hits}");
    assert!(b.text("search-guess").await.contains("phone"));
    let trail = b.text("search-audit").await;
    assert!(trail.contains("platform-admin"), "{trail}");
    assert!(trail.contains(XSS), "the reason is shown as text: {trail}");
    assert!(!trail.contains(PHONE), "no raw value in the trail: {trail}");
    // Local time in the browser's zone, with the zone.
    let at = last_record(&app, "black", "phone", PHONE).await["at"]
        .as_i64()
        .unwrap();
    let held = b.content("search-audit").await;
    assert!(
        held.contains(&shanghai(at)),
        "{} in Shanghai: {held}",
        shanghai(at)
    );
    assert!(!trail.contains('Z'), "no UTC times: {trail}");
    // The XSS reason stayed text: no image element, no alert.
    assert_eq!(
        b.js("return document.querySelectorAll('img').length;")
            .await,
        0
    );
    assert!(b.client.get_alert_text().await.is_err(), "no alert opened");
    b.check_layouts("search").await;

    // A link to an identity (a ticket's, an alert's) opens with the search run: a segment's
    // hit says why, from the segment's own audit record.
    b.open(&app, "search?value=17012345678&sandbox=default")
        .await;
    b.wait_for(
        "the segment's hit",
        "return document.getElementById('search-hits').textContent.includes('segment')",
    )
    .await;
    let hits = b.text("search-hits").await;
    assert!(
        hits.contains("ring 170: virtual operator SIMs") && hits.contains("platform-admin"),
        "the segment's reason and who: {hits}"
    );
    assert_eq!(
        b.js("return document.getElementById('search-q').value;")
            .await,
        "17012345678"
    );
    // No request URL holds an identifier (lookups and audit filters go in POST bodies); the
    // fragment never leaves the browser.
    let fetched = b.fetched().await;
    assert!(
        fetched.iter().any(|u| u.ends_with("/v1/lists/-/lookup")),
        "the searches were looked up: {fetched:?}"
    );
    for url in fetched {
        let raw = ["13812345678", "138%201234-5678", "1234-5678", "17012345678"]
            .iter()
            .any(|v| url.contains(v));
        assert!(!raw, "an identifier in a request URL: {url}");
    }

    // 2. Lists: sizes, the engine's hit, the last change in local time; a list's changes and
    // what it holds, masked.
    b.open(&app, "lists").await;
    b.wait_for(
        "the lists",
        "return document.getElementById('lists-rows').textContent.includes('black')",
    )
    .await;
    let row = b
        .js("return [...document.querySelectorAll('#lists-rows tbody tr')].map(r => [...r.cells].map(c => c.textContent)).find(c => c[0] === 'black');")
        .await;
    assert_eq!(row[1], "default", "{row}");
    assert_eq!(row[2], "≈ 2", "{row}");
    assert_eq!(row[3], "1", "the check's hit: {row}");
    let last_change = row[4].as_str().unwrap();
    assert!(
        last_change.contains("UTC+8") && last_change.contains("ago"),
        "{row}"
    );
    let open = b
        .client
        .find(Locator::XPath(
            "//table[@id='lists-rows']//tr[td[1]='black']//button",
        ))
        .await
        .unwrap();
    open.click().await.unwrap();
    b.wait_for(
        "what black holds",
        "return document.querySelectorAll('#list-holds tbody tr').length === 2",
    )
    .await;
    let holds = b.text("list-holds").await;
    assert!(
        holds.contains("138****5678") || holds.contains("****"),
        "{holds}"
    );
    assert!(holds.contains("ring 170"), "{holds}");
    assert!(!holds.contains(PHONE), "masked only: {holds}");
    assert!(b.text("list-changes").await.contains("upsert"));
    assert!(
        b.js("return location.hash;")
            .await
            .as_str()
            .unwrap()
            .contains("list=black"),
        "the open list is in the address"
    );
    b.check_layouts("lists").await;

    // 3. Edit: the dimension guessed and said; a mistyped list is a new one, and says so.
    b.open(&app, "edit").await;
    b.fill("add-list", "blakc").await;
    b.fill("add-value", "13912345678").await;
    b.wait_for(
        "the notes",
        "return document.getElementById('add-note').textContent.includes('New list')",
    )
    .await;
    let note = b.text("add-note").await;
    assert!(note.contains("Read as phone"), "{note}");
    b.fill("add-list", "grey").await;
    b.fill("add-ttl", "30d").await;
    b.fill("add-reason", "ring 2026-11").await;
    b.click("add-btn").await;
    b.wait_for(
        "the write",
        "return document.getElementById('status').textContent.startsWith('Written')",
    )
    .await;
    assert!(b.text("status").await.contains("as phone (guessed)"));
    assert!(listed(&app, "grey", "phone", "13912345678").await);

    // A CSV file with a row the browser refuses: named by its line in the file, nothing
    // written.
    let files = tempfile::tempdir().unwrap();
    let bad = files.path().join("suspects.csv");
    std::fs::write(
        &bad,
        "dimension,value,sandbox,reason\ndevice,csv-good-1,default,ok\nphone,12,default,too short\ndevice,csv-good-2,default,ok\n",
    )
    .unwrap();
    b.fill("csv-list", "grey").await;
    b.visible("csv-file")
        .await
        .send_keys(bad.to_str().unwrap())
        .await
        .unwrap();
    b.wait_for(
        "the file",
        "return document.getElementById('csv-text').value.includes('csv-good-2')",
    )
    .await;
    b.click("csv-write-btn").await;
    b.wait_for(
        "the row errors",
        "return document.querySelectorAll('#csv-errors li').length > 0",
    )
    .await;
    let errors = b.text("csv-errors").await;
    assert!(
        errors.contains("suspects.csv line 3") && errors.contains("phone"),
        "{errors}"
    );
    assert!(!listed(&app, "grey", "device", "csv-good-1").await);
    // A row only the service refuses (the ID card's check digit, rules 2), after a blank
    // line: its refusal names the file's line, not the entry's index.
    let refused = files.path().join("suspects-2.csv");
    std::fs::write(
        &refused,
        "dimension,value,sandbox,reason\ndevice,csv-good-1,default,ok\nphone,13900000000,default,fixed\n\nid_card,110105194912310021,default,typo\ndevice,csv-good-2,default,ok\n",
    )
    .unwrap();
    b.visible("csv-file")
        .await
        .send_keys(refused.to_str().unwrap())
        .await
        .unwrap();
    b.wait_for(
        "the second file",
        "return document.getElementById('csv-text').value.includes('typo')",
    )
    .await;
    b.click("csv-write-btn").await;
    b.wait_for(
        "the service's refusal",
        "return document.getElementById('csv-errors').textContent.includes('refused by the service')",
    )
    .await;
    let errors = b.text("csv-errors").await;
    assert!(
        errors.contains("suspects-2.csv line 5") && errors.contains("check digit"),
        "{errors}"
    );
    assert!(!errors.contains("entries["), "{errors}");
    assert!(!listed(&app, "grey", "device", "csv-good-1").await);
    // Fixed, the rows are written.
    b.fill(
        "csv-text",
        "dimension,value,sandbox,reason\ndevice,csv-good-1,default,ok\nphone,13900000000,default,fixed\ndevice,csv-good-2,default,ok\n",
    )
    .await;
    b.click("csv-write-btn").await;
    b.wait_for(
        "the rows",
        "return document.getElementById('status').textContent.startsWith('Written: 3')",
    )
    .await;
    assert!(listed(&app, "grey", "device", "csv-good-2").await);

    // A delete asks first (No keeps the entry), then can be undone within seconds: the entry
    // comes back with its reason and expiry.
    b.fill("del-list", "grey").await;
    b.fill("del-value", "13912345678").await;
    b.click("del-btn").await;
    assert!(
        b.text("confirm-text").await.contains("13912345678"),
        "the question names the entry"
    );
    b.click("confirm-no").await;
    b.wait_for(
        "no delete",
        "return document.getElementById('status').textContent === 'Nothing removed'",
    )
    .await;
    assert!(listed(&app, "grey", "phone", "13912345678").await);
    b.click("del-btn").await;
    b.click("confirm-yes").await;
    b.wait_for(
        "the delete",
        "return document.getElementById('status').textContent.startsWith('Removed')",
    )
    .await;
    assert!(!listed(&app, "grey", "phone", "13912345678").await);
    // Undo right away: the bar lasts 10 s, a slow machine's screenshots could outlast it.
    b.click("undo-btn").await;
    b.wait_for(
        "the undo",
        "return document.getElementById('status').textContent.startsWith('Put back')",
    )
    .await;
    b.check_layouts("edit").await;
    let (_, entry) = api(
        &app,
        "GET",
        "/v1/lists/grey/entries/phone/13912345678",
        None,
    )
    .await;
    assert_eq!(entry["listed"], true, "{entry}");
    let expires = entry["expires_at"].as_i64().expect("the expiry came back");
    assert!(
        expires > at + 29 * 86_400_000,
        "30 days, as before: {entry}"
    );
    let undone = last_record(&app, "grey", "phone", "13912345678").await;
    assert_eq!(undone["op"], "upsert", "{undone}");
    assert_eq!(undone["reason"], "ring 2026-11", "{undone}");

    // 4. Audit: the token's name and the masked value, never the raw one; no word broken at
    // 1280 px; the fingerprint shortened, whole on hover.
    b.open(&app, "audit").await;
    b.wait_for(
        "the trail",
        "return document.querySelectorAll('#audit-rows tbody tr').length >= 6",
    )
    .await;
    let broken = b
        .js(r#"const broken = [];
            for (const td of document.querySelectorAll('#audit-rows td')) {
              const walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
              for (let n = walk.nextNode(); n; n = walk.nextNode()) {
                for (const m of n.textContent.matchAll(/\S+/g)) {
                  const r = document.createRange();
                  r.setStart(n, m.index);
                  r.setEnd(n, m.index + m[0].length);
                  const lines = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
                  if (lines.size > 1) broken.push(m[0]);
                }
              }
            }
            return broken;"#)
        .await;
    assert_eq!(broken, json!([]), "words broken across lines at 1280 px");
    assert_eq!(
        b.js("const s = document.getElementById('audit-rows').parentElement; return s.scrollWidth <= s.clientWidth;")
            .await,
        true,
        "the audit table fits 1280 px"
    );
    let fp = b
        .js("const s = document.querySelector('#audit-rows .fp'); return [s.title, s.textContent, s.getBoundingClientRect().width];")
        .await;
    assert_eq!(fp[0], fp[1], "the whole fingerprint on hover: {fp}");
    assert!(
        fp[0].as_str().unwrap().len() > 12 && fp[2].as_f64().unwrap() < 100.0,
        "shown shortened: {fp}"
    );
    b.select("audit-op", "delete").await;
    b.click("audit-btn").await;
    b.wait_for("the records", "return document.querySelector('#audit-rows tbody tr td') !== null && document.querySelector('#audit-rows tbody tr td').textContent !== 'No records' && !document.getElementById('audit-rows').textContent.includes('upsert')").await;
    let rows = b.text("audit-rows").await;
    assert!(
        rows.contains("list-loader") && rows.contains("delete"),
        "{rows}"
    );
    b.select("audit-op", "").await;
    b.select("audit-dim", "phone").await;
    b.fill("audit-value", PHONE).await;
    b.click("audit-btn").await;
    b.wait_for(
        "the phone's records",
        "return document.getElementById('audit-rows').textContent.includes('****') && !document.getElementById('audit-rows').textContent.includes('delete')",
    )
    .await;
    let rows = b.text("audit-rows").await;
    assert!(!rows.contains(PHONE), "{rows}");
    assert!(rows.contains(XSS), "{rows}");
    let held = b.content("audit-rows").await;
    assert!(held.contains(&shanghai(at)), "{held}");
    for url in b.fetched().await {
        assert!(!url.contains(PHONE), "{url}");
    }
    b.check_layouts("audit").await;
    // Filtered by reason, exported: the file holds the filtered records, masked.
    b.select("audit-dim", "").await;
    b.fill("audit-value", "").await;
    b.fill("audit-reason", "FIXED").await;
    b.click("audit-btn").await;
    b.wait_for(
        "the reason filter",
        "return document.querySelectorAll('#audit-rows tbody tr').length === 1 && document.getElementById('audit-rows').textContent.includes('fixed')",
    )
    .await;
    b.click("audit-export").await;
    let (name, csv) = b.downloaded().await;
    assert!(
        name.starts_with("audit-") && name.ends_with(".csv"),
        "{name}"
    );
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "the header and the one record: {csv}");
    assert!(
        lines[1].contains("fixed") && lines[1].contains("****"),
        "{csv}"
    );
    for raw in ["13900000000", PHONE, "13912345678", "csv-good"] {
        assert!(!csv.contains(raw), "a raw value in the export: {csv}");
    }

    // 5. Health says first whether the service is well, 6. definitions (a write token sees
    // no definition controls).
    b.open(&app, "health").await;
    b.wait_for(
        "the verdict",
        "return document.getElementById('health-verdict').textContent !== ''",
    )
    .await;
    let verdict = b.text("health-verdict").await;
    assert!(verdict.starts_with("Well"), "{verdict}");
    let summary = b.text("health-summary").await;
    assert!(
        summary.contains("Redis") && summary.contains("invalidation subscription"),
        "{summary}"
    );
    b.check_layouts("health").await;
    b.open(&app, "definitions").await;
    b.visible("metrics-rows").await;
    assert!(
        !displayed(&b, "metric-save").await,
        "a write token defines nothing"
    );
    assert!(!displayed(&b, "rule-save").await);
    b.check_layouts("definitions").await;

    // 7. Every page once more, as an operator opens them: nothing in the browser console
    // (no 401, no favicon 404, no script error). The refusals above were logged; read
    // them away first.
    let _ = b.console().await;
    for page in [
        "search?value=17012345678",
        "lists?list=black&sandbox=default",
        "edit",
        "audit?op=upsert",
        "health",
        "definitions",
    ] {
        b.open(&app, page).await;
        b.wait_for(
            "the page",
            "return document.querySelector('.page.current') !== null",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(
        b.js("const l = document.querySelector('link[rel=icon]'); return l !== null && l.href.startsWith('data:image/svg+xml');")
            .await,
        true,
        "a favicon"
    );
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "browser console errors: {errors:#?}");
}
