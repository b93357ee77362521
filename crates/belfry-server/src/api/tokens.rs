//! Token endpoints: `POST /v1/tokens` makes a token (shown once), `GET /v1/tokens` lists them
//! (names, scopes and limits; never a token or a hash), `DELETE /v1/tokens/{name}` revokes
//! one made here. All need `admin`.
//!
//! A made token is kept in the store's metadata (namespace [`TOKENS_NAMESPACE`], by name) as
//! its SHA-256 with its scopes, so it survives a restart; the builder loads them at start, and
//! a node follows the tokens other nodes on a shared store make and revoke ([`follow`]).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use belfry_core::UnixMs;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ErrorCode};
use super::extract::JsonBody;
use crate::auth::{generate_token, Auth, Scope, TokenEntry, TokenHash, TokenRate, TokenSource};
use crate::shared::{Caller, Shared};

/// Metadata namespace of the tokens made through the API.
pub const TOKENS_NAMESPACE: &str = "auth.tokens";

/// Longest token name.
pub const TOKEN_NAME_LEN_MAX: usize = 64;

/// A token name's rule (`belfry token create --offline` applies it too, so that the config
/// lines it prints load): the error says what a name may be.
pub fn check_name(name: &str) -> Result<(), String> {
    let fits = !name.is_empty()
        && name.len() <= TOKEN_NAME_LEN_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && !belfry_core::limits::is_dot_segment(name);
    if fits {
        Ok(())
    } else {
        Err(format!(
            "name: 1 to {TOKEN_NAME_LEN_MAX} characters of A-Z a-z 0-9 _ . -, not \".\" or \"..\""
        ))
    }
}

/// What the token routes use.
pub struct TokensState {
    pub(crate) auth: Arc<Auth>,
    pub(crate) shared: Arc<Shared>,
    /// Serialises this node's token writes with `follow`, so following the store never
    /// drops a token whose create is between memory and store.
    pub(crate) writes: tokio::sync::Mutex<()>,
}

type AppState = Arc<TokensState>;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/tokens", post(create).get(list))
        .route("/v1/tokens/{name}", delete(revoke))
        .with_state(state)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    name: String,
    scopes: Vec<String>,
    rate_per_s: Option<f64>,
    burst: Option<u32>,
}

/// A token as listed: never the token, never its hash.
#[derive(Debug, Serialize)]
pub struct TokenView {
    name: String,
    scopes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u32>,
    /// `config` (the server's config file or environment) or `api`.
    source: &'static str,
}

#[derive(Debug, Serialize)]
struct Created {
    /// The token itself: shown here once, never again.
    token: String,
    #[serde(flatten)]
    view: TokenView,
    created_at_ms: UnixMs,
}

/// What the store keeps of a made token.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    hash: String,
    scopes: Vec<String>,
    rate_per_s: Option<f64>,
    burst: Option<u32>,
    created_at_ms: UnixMs,
}

fn view(entry: &TokenEntry, source: TokenSource) -> TokenView {
    TokenView {
        name: entry.name.clone(),
        scopes: entry.scopes.iter().map(ToString::to_string).collect(),
        rate_per_s: entry.rate.map(|r| r.per_s),
        burst: entry.rate.map(|r| r.burst),
        source: match source {
            TokenSource::Config => "config",
            TokenSource::Api => "api",
        },
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message)
}

/// The entry a create asks for, validated (everything but the name's uniqueness).
fn entry_of(body: &CreateBody, hash: TokenHash) -> Result<TokenEntry, ApiError> {
    check_name(&body.name).map_err(invalid)?;
    if body.scopes.is_empty() {
        return Err(invalid(
            "scopes: give at least one (admin, read, produce:<queues>, consume:<queues>)",
        ));
    }
    let scopes = body
        .scopes
        .iter()
        .map(|s| Scope::parse(s).map_err(|e| invalid(format!("scopes: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let rate = TokenRate::from_parts(body.rate_per_s, body.burst).map_err(invalid)?;
    Ok(TokenEntry {
        name: body.name.clone(),
        hash,
        scopes,
        rate,
    })
}

async fn store_call<T: Send + 'static>(
    state: &TokensState,
    call: impl FnOnce(&dyn belfry_store::Store) -> Result<T, belfry_store::StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let answer = state
        .shared
        .blocking(Caller::Api, move |store| Ok(call(store)?))
        .await?;
    Ok(answer)
}

pub async fn create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<Response, ApiError> {
    let token = generate_token();
    let entry = entry_of(&body, TokenHash::of(&token))?;
    let _writes = state.writes.lock().await;
    // The first token turns authentication on: without the admin scope, nobody could make
    // or revoke tokens afterwards.
    if !state.auth.enabled() && !entry.scopes.contains(&Scope::Admin) {
        return Err(invalid(
            "the first token turns authentication on, so it needs the admin scope (otherwise \
             nobody could make or revoke tokens afterwards); make an admin token first",
        ));
    }
    let now_ms = state.shared.now_ms();
    let stored = Stored {
        hash: entry.hash.to_string(),
        scopes: body.scopes.clone(),
        rate_per_s: entry.rate.map(|r| r.per_s),
        burst: entry.rate.map(|r| r.burst),
        created_at_ms: now_ms,
    };
    let bytes =
        Bytes::from(serde_json::to_vec(&stored).map_err(|e| {
            ApiError::new(ErrorCode::InternalError, format!("encode the token: {e}"))
        })?);
    // In memory first, which settles a race for the name; undone if the store refuses.
    state
        .auth
        .add_made(entry.clone())
        .map_err(|e| ApiError::new(ErrorCode::TokenExists, e))?;
    let name = entry.name.clone();
    let written = store_call(&state, move |store| {
        store.put_meta(TOKENS_NAMESPACE, &name, bytes)
    })
    .await;
    if let Err(error) = written {
        let _ = state.auth.revoke_made(&entry.name);
        return Err(error);
    }
    tracing::info!(name = %entry.name, "token made through the API");
    let created = Created {
        token,
        view: view(&entry, TokenSource::Api),
        created_at_ms: now_ms,
    };
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

#[derive(Debug, Serialize)]
pub struct TokenList {
    tokens: Vec<TokenView>,
}

pub async fn list(State(state): State<AppState>) -> Json<TokenList> {
    Json(TokenList {
        tokens: state
            .auth
            .list()
            .iter()
            .map(|(entry, source)| view(entry, *source))
            .collect(),
    })
}

pub async fn revoke(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let _writes = state.writes.lock().await;
    match state.auth.list().iter().find(|(e, _)| e.name == name) {
        None => {
            return Err(ApiError::new(
                ErrorCode::TokenNotFound,
                format!("no token is named {name:?}"),
            ))
        }
        Some((_, TokenSource::Config)) => {
            return Err(ApiError::new(
                ErrorCode::TokenExists,
                format!(
                    "token {name:?} comes from the server's config: remove it there and restart"
                ),
            ))
        }
        Some((_, TokenSource::Api)) => {}
    }
    let admins_left = state
        .auth
        .list()
        .iter()
        .filter(|(e, _)| e.name != name && e.scopes.contains(&Scope::Admin))
        .count();
    if admins_left == 0 {
        return Err(ApiError::new(
            ErrorCode::LastAdminToken,
            format!(
                "{name:?} is the last token with the admin scope: without it nobody could \
                 manage tokens, and with no token left the API would be open to anyone; make \
                 another admin token first"
            ),
        ));
    }
    // The store first: a revoke that is answered must not come back at the next start.
    let key = name.clone();
    store_call(&state, move |store| {
        store.delete_meta(TOKENS_NAMESPACE, &key).map(|_| ())
    })
    .await?;
    state
        .auth
        .revoke_made(&name)
        .map_err(|e| ApiError::new(ErrorCode::TokenNotFound, e))?;
    tracing::info!(%name, "token revoked through the API");
    Ok(StatusCode::NO_CONTENT)
}

/// Loads the tokens made through the API into `auth` (at start). An unreadable record is
/// skipped and logged, never fatal: its token simply stops working.
pub fn load(
    store: &dyn belfry_store::Store,
    auth: &Auth,
) -> Result<usize, belfry_store::StoreError> {
    let mut loaded = 0;
    for entry in stored(store)? {
        let name = entry.name.clone();
        match auth.add_made(entry) {
            Ok(()) => loaded += 1,
            Err(reason) => {
                tracing::warn!(%name, %reason, "a stored API token could not be loaded; it will not be accepted")
            }
        }
    }
    Ok(loaded)
}

/// Makes this node's made tokens those of the store: tokens made or revoked on another node
/// that shares it (see `crate::follow`). Returns how many are held.
pub async fn follow(state: &TokensState) -> Result<usize, crate::ServiceError> {
    let _writes = state.writes.lock().await;
    let entries = state
        .shared
        .blocking(Caller::Internal, |store| Ok(stored(store)?))
        .await?;
    Ok(state.auth.follow_made(entries))
}

/// The stored tokens; an unreadable record is skipped and logged.
fn stored(store: &dyn belfry_store::Store) -> Result<Vec<TokenEntry>, belfry_store::StoreError> {
    let mut entries = Vec::new();
    for (name, bytes) in store.list_meta(TOKENS_NAMESPACE)? {
        let entry = serde_json::from_slice::<Stored>(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|stored| {
                let body = CreateBody {
                    name: name.clone(),
                    scopes: stored.scopes,
                    rate_per_s: stored.rate_per_s,
                    burst: stored.burst,
                };
                let hash = TokenHash::parse(&stored.hash)?;
                entry_of(&body, hash).map_err(|e| e.message)
            });
        match entry {
            Ok(entry) => entries.push(entry),
            Err(reason) => {
                tracing::warn!(%name, %reason, "a stored API token could not be loaded; it will not be accepted")
            }
        }
    }
    Ok(entries)
}
