//! Without tokens the console says so (the no-auth banner; the API reference under its
//! policy); the console is served with a strict policy (CSP, no inline script, style or
//! handler).

use crate::common::{spawn_app, test_settings};

use super::browser::Browser;
use super::displayed;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_console_says_so() {
    let app = spawn_app(test_settings()).await;
    let b = Browser::start().await;
    b.open(&app, "search").await;
    b.wait_for("the app", "return !document.getElementById('app').hidden")
        .await;
    assert!(displayed(&b, "banner-noauth").await);
    assert!(b.text("banner-noauth").await.contains("No authentication"));
    assert!(
        displayed(&b, "add-btn").await || {
            b.open(&app, "edit").await;
            displayed(&b, "add-btn").await
        }
    );
    b.check_layouts("no-auth").await;

    // The API reference renders under its policy, from the binary alone.
    b.client.goto(&app.url("/docs/")).await.unwrap();
    b.wait_for(
        "Swagger UI's operations",
        "return document.querySelectorAll('.opblock').length >= 20",
    )
    .await;
    b.check_layouts("docs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_a_strict_policy() {
    let app = spawn_app(test_settings()).await;
    let scripts =
        namelist::routes::console::SCRIPTS.map(|(name, _)| format!("/console/js/{name}.js"));
    let index = app.get("/console").await.text().await.unwrap();
    let loaded = index.match_indices("<script src=\"").map(|(i, m)| {
        let src = &index[i + m.len()..];
        src[..src.find('"').unwrap()].to_owned()
    });
    assert!(
        loaded.eq(scripts.iter().cloned()),
        "index.html runs every script, in order, and nothing else"
    );
    let assets = [("/console", "text/html"), ("/console/app.css", "text/css")]
        .into_iter()
        .map(|(p, k)| (p.to_owned(), k))
        .chain(scripts.iter().map(|p| (p.clone(), "text/javascript")));
    for (path, kind) in assets {
        let path = path.as_str();
        let res = app.get(path).await;
        assert_eq!(res.status(), 200, "{path}");
        let h = res.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        assert_eq!(
            h["content-security-policy"],
            namelist::routes::console::CONSOLE_CSP,
            "{path}"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
        let body = res.text().await.unwrap();
        if kind == "text/html" {
            // No inline script, style or handler: the policy would block them anyway.
            assert!(!body.contains("<script>"), "an inline script");
            assert!(!body.contains("<style"), "an inline style sheet");
            assert!(!body.contains(" style="), "an inline style");
            assert!(
                !body
                    .split([' ', '\n', '<'])
                    .any(|w| w.starts_with("on") && w.contains('=')),
                "an inline handler attribute"
            );
        }
        if kind == "text/javascript" {
            assert!(!body.contains("innerHTML"), "values are rendered as text");
            assert!(!body.contains("eval("));
        }
    }
    let csp = namelist::routes::console::CONSOLE_CSP;
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
}
