//! Roles decide the controls each token is offered; an admin's bad metric expression is
//! pointed at its column.

use fantoccini::Locator;

use super::browser::Browser;
use super::{ADMIN, ENGINE, READ, api, app_with_tokens, displayed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_decide_the_controls_and_parse_errors_point_at_their_column() {
    let (app, _dir) = app_with_tokens(None).await;
    let b = Browser::start().await;
    b.sign_in(&app, READ).await;
    assert!(b.text("who").await.contains("risk-engine (read)"));
    for id in [
        "add-btn",
        "csv-write-btn",
        "del-btn",
        "metric-save",
        "rule-save",
    ] {
        assert!(!displayed(&b, id).await, "a read token sees no {id}");
    }
    let edit_link = b
        .client
        .find(Locator::Css("#nav a[data-page=edit]"))
        .await
        .unwrap();
    assert!(
        !edit_link.is_displayed().await.unwrap(),
        "no Edit page in the nav"
    );
    let lists_link = b
        .client
        .find(Locator::Css("#nav a[data-page=lists]"))
        .await
        .unwrap();
    assert!(
        lists_link.is_displayed().await.unwrap(),
        "a read token reads the lists"
    );
    b.open(&app, "edit").await;
    assert!(
        !displayed(&b, "page-edit").await,
        "#edit falls back to search"
    );

    // The risk engine's token reads no lists and no audit trail: those pages are not
    // offered, and a link to one falls back to search.
    b.client
        .execute("sessionStorage.clear();", vec![])
        .await
        .unwrap();
    b.sign_in(&app, ENGINE).await;
    for page in ["lists", "audit", "edit"] {
        let link = b
            .client
            .find(Locator::Css(&format!("#nav a[data-page={page}]")))
            .await
            .unwrap();
        assert!(
            !link.is_displayed().await.unwrap(),
            "an engine token is offered no {page} page"
        );
    }
    b.open(&app, "audit?op=delete").await;
    b.wait_for("the app", "return !document.getElementById('app').hidden")
        .await;
    assert!(!displayed(&b, "page-audit").await, "#audit falls back");
    assert!(displayed(&b, "page-search").await);

    // An admin defines; a bad expression's error points at its column.
    b.client
        .execute("sessionStorage.clear();", vec![])
        .await
        .unwrap();
    b.sign_in(&app, ADMIN).await;
    b.open(&app, "definitions").await;
    b.fill("metric-id", "dev_tx_7d").await;
    b.fill("metric-expr", "COUNT(7d, transaction) BY").await;
    b.click("metric-save").await;
    b.wait_for(
        "the error",
        "return !document.getElementById('def-error').hidden",
    )
    .await;
    let err = b.text("def-error").await;
    assert!(
        err.contains("invalid_expr") && err.contains("column") && err.contains('^'),
        "{err}"
    );
    b.fill("metric-expr", "COUNT(7d, transaction) BY device_id")
        .await;
    b.click("metric-save").await;
    b.wait_for(
        "the metric",
        "return document.getElementById('metrics-rows').textContent.includes('dev_tx_7d')",
    )
    .await;
    // Edit: the row fills the form; a changed window is a new version.
    b.fill("metric-id", "").await;
    b.fill("metric-expr", "").await;
    let edit = b
        .client
        .find(Locator::XPath(
            "//table[@id='metrics-rows']//button[text()='Edit']",
        ))
        .await
        .unwrap();
    edit.click().await.unwrap();
    assert_eq!(
        b.js("return document.getElementById('metric-expr').value;")
            .await,
        "COUNT(7d, transaction) BY device_id"
    );
    b.fill("metric-expr", "COUNT(1d, transaction) BY device_id")
        .await;
    b.click("metric-save").await;
    b.wait_for(
        "version 2",
        "return document.getElementById('metrics-rows').textContent.includes('COUNT(1d')",
    )
    .await;
    let (_, def) = api(&app, "GET", "/v1/metrics/dev_tx_7d", None).await;
    assert_eq!(def["version"], 2, "{def}");
    // Windows read as durations, not seconds.
    let cells = b
        .js("return [...document.querySelectorAll('#metrics-rows td')].map(td => td.textContent);")
        .await;
    assert!(
        cells.as_array().unwrap().iter().any(|c| c == "1d"),
        "{cells}"
    );
    assert!(!cells.to_string().contains("86400"), "{cells}");
    // A refused save leaves no earlier success showing beside its error.
    assert_eq!(b.text("status").await, "Metric saved");
    b.fill("metric-expr", "COUNT(1d, transaction) BY").await;
    b.click("metric-save").await;
    b.wait_for(
        "the error",
        "return !document.getElementById('def-error').hidden",
    )
    .await;
    assert_eq!(b.text("status").await, "", "only the error shows");
    b.fill("try-metrics", "dev_tx_7d").await;
    b.click("try-features").await;
    b.wait_for(
        "features",
        "return document.getElementById('try-out').textContent.includes('dev_tx_7d')",
    )
    .await;
    b.check_layouts("definitions-admin").await;

    // Deleting a metric asks first and can be undone.
    b.client
        .find(Locator::XPath(
            "//table[@id='metrics-rows']//button[text()='Delete']",
        ))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(b.text("confirm-text").await.contains("dev_tx_7d"));
    b.click("confirm-yes").await;
    b.wait_for(
        "the delete",
        "return !document.getElementById('metrics-rows').textContent.includes('dev_tx_7d')",
    )
    .await;
    let (status, _) = api(&app, "GET", "/v1/metrics/dev_tx_7d", None).await;
    assert_eq!(status, 404);
    b.click("undo-btn").await;
    b.wait_for(
        "the metric back",
        "return document.getElementById('metrics-rows').textContent.includes('dev_tx_7d')",
    )
    .await;
    let (status, def) = api(&app, "GET", "/v1/metrics/dev_tx_7d", None).await;
    assert_eq!(status, 200, "{def}");
    assert_eq!(def["expr"], "COUNT(1d, transaction) BY device_id", "{def}");

    // Health on the embedded store: said so, and nothing that only Redis has reads as
    // alarming or empty.
    b.open(&app, "health").await;
    b.wait_for(
        "the verdict",
        "return document.getElementById('health-verdict').textContent !== ''",
    )
    .await;
    let verdict = b.text("health-verdict").await;
    assert!(verdict.starts_with("Well"), "{verdict}");
    let summary = b.text("health-summary").await;
    assert!(summary.contains("Embedded store"), "{summary}");
    // No data directory in these tests: the summary says nothing survives the process.
    assert!(summary.contains("in memory only"), "{summary}");
    assert!(!summary.contains("invalidation"), "{summary}");
    let page = b.text("page-health").await;
    assert!(
        !page.contains("0.0 %") && !page.contains("refresh again"),
        "{page}"
    );
    b.check_layouts("health-embedded").await;
}
