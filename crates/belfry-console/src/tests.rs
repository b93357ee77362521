use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::*;

async fn get(path: &str, if_none_match: Option<&str>) -> Response {
    let mut request = Request::get(path);
    if let Some(tag) = if_none_match {
        request = request.header(header::IF_NONE_MATCH, tag);
    }
    router()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

fn header_of(response: &Response, name: header::HeaderName) -> &str {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

#[tokio::test]
async fn root_and_bare_console_redirect_to_the_page() {
    for path in ["/", "/console"] {
        let response = get(path, None).await;
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT, "{path}");
        assert_eq!(header_of(&response, header::LOCATION), BASE);
    }
}

#[tokio::test]
async fn every_asset_is_served_with_its_type_and_a_validator() {
    for asset in ASSETS {
        let path = format!("{BASE}{}", asset.path);
        let response = get(&path, None).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(
            header_of(&response, header::CONTENT_TYPE),
            asset.content_type
        );
        assert_eq!(
            header_of(&response, header::X_CONTENT_TYPE_OPTIONS),
            "nosniff"
        );
        let etag = header_of(&response, header::ETAG).to_owned();
        assert!(etag.starts_with('"') && etag.len() == 18, "{path}: {etag}");
        let cache = header_of(&response, header::CACHE_CONTROL).to_owned();
        if asset.path.starts_with(VENDOR) {
            assert!(cache.contains("immutable"), "{path}: {cache}");
        } else {
            assert_eq!(cache, "no-cache", "{path}");
        }
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], asset.body, "{path}");
        let again = get(&path, Some(&etag)).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{path}");
    }
}

#[tokio::test]
async fn the_page_is_served_at_the_base_and_unknown_files_are_404() {
    let page = get(BASE, None).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert!(header_of(&page, header::CONTENT_TYPE).starts_with("text/html"));
    assert!(header_of(&page, header::CONTENT_SECURITY_POLICY).contains("script-src 'self'"));
    for missing in ["/console/nope.js", "/console/../Cargo.toml", "/console/js/"] {
        assert_eq!(
            get(missing, None).await.status(),
            StatusCode::NOT_FOUND,
            "{missing}"
        );
    }
}

/// Every file the page or a script refers to (`/console/...` in the page, `./x.js` imports)
/// is in the table: a file added to `assets/` but not to `ASSETS` would be a 404 in the browser.
#[test]
fn every_referenced_file_is_embedded() {
    let known = |path: &str| ASSETS.iter().any(|a| a.path == path);
    let page = std::str::from_utf8(ASSETS[0].body).unwrap();
    for reference in page.split(BASE).skip(1) {
        let path = reference.split('"').next().unwrap();
        assert!(
            known(path),
            "index.html refers to {path}, which is not embedded"
        );
    }
    for asset in ASSETS.iter().filter(|a| a.path.starts_with("js/")) {
        let text = std::str::from_utf8(asset.body).unwrap();
        for import in text.split("from \"./").skip(1) {
            let file = import.split('"').next().unwrap();
            let path = format!("js/{file}");
            assert!(
                known(&path),
                "{} imports {path}, which is not embedded",
                asset.path
            );
        }
    }
}
