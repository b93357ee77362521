//! The web console: a page, its scripts and styles, and a vendored chart library, embedded in
//! the binary and served under `/console/`. Nothing here knows the server's internals: the
//! page speaks the public HTTP API (`/v1/...`, `/metrics`) from the browser, with the bearer
//! token the operator pastes into its login form. So the page and its assets are public
//! (they hold no data), and every call they make is checked like any other client's.
//!
//! Own files are answered with an `ETag` (a hash of their bytes) and `Cache-Control:
//! no-cache`, so a new binary's console is picked up at once and an unchanged one costs a
//! `304`. Vendored files carry their version in their path and are cached for a year.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// Where the console lives.
pub const BASE: &str = "/console/";

/// The routes this crate serves (for the server's public-route list).
pub const ROUTES: &[&str] = &["/", "/console", "/console/", "/console/{*path}"];

/// What the page may load and call: only this origin; no inline script, no frames. Inline
/// styles are allowed because the chart library sizes its elements through `style`.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

struct Asset {
    /// The path under `/console/`.
    path: &'static str,
    body: &'static [u8],
    content_type: &'static str,
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            body: include_bytes!(concat!("../assets/", $path)),
            content_type: $type,
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
/// Vendored files: their directory names their version, so their bytes never change.
const VENDOR: &str = "vendor/";

static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", CSS),
    asset!("js/app.js", JS),
    asset!("js/api.js", JS),
    asset!("js/dom.js", JS),
    asset!("js/metrics.js", JS),
    asset!("js/overview.js", JS),
    asset!("js/queue.js", JS),
    asset!("js/dead.js", JS),
    asset!("js/tasks.js", JS),
    asset!("js/task.js", JS),
    asset!("js/schedules.js", JS),
    asset!("js/reminders.js", JS),
    asset!("vendor/uplot-1.6.32/uPlot.iife.min.js", JS),
    asset!("vendor/uplot-1.6.32/uPlot.min.css", CSS),
    asset!("vendor/uplot-1.6.32/LICENSE", "text/plain; charset=utf-8"),
];

/// The console's routes: `/` and `/console` redirect to `/console/`, which serves the page;
/// `/console/{path}` serves its assets.
pub fn router() -> Router {
    Router::new()
        .route("/", get(to_console))
        .route("/console", get(to_console))
        .route("/console/", get(index))
        .route("/console/{*path}", get(asset))
}

async fn to_console() -> Redirect {
    Redirect::temporary(BASE)
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some((at, asset)) = ASSETS.iter().enumerate().find(|(_, a)| a.path == path) else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such file in the console\n",
        )
            .into_response();
    };
    let etag = &etags()[at];
    let cache = if asset.path.starts_with(VENDOR) {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let common = [
        (header::ETAG, etag.clone()),
        (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    if matches {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.body,
    )
        .into_response()
}

/// One strong ETag per asset, in `ASSETS` order: a 64-bit FNV-1a hash of its bytes.
fn etags() -> &'static [HeaderValue] {
    static ETAGS: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let hash = a.body.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
                });
                HeaderValue::from_str(&format!("\"{hash:016x}\"")).expect("hex is a header value")
            })
            .collect()
    })
}

#[cfg(test)]
mod tests;
