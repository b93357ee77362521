//! Bearer tokens and their scopes: who may call what. Pure (no HTTP): `api::auth` maps each
//! route to the [`Need`] it has and asks [`Auth::check`].
//!
//! A token is a random string the operator hands to a client; the server keeps only its
//! SHA-256 (`sha256:<hex>` in `[[auth.tokens]]`), so neither the config file nor a memory dump
//! gives a usable token away. Tokens are long random strings, not passwords, so a fast hash
//! is enough: nothing short is there to brute-force. Lookup is by hash, so a wrong token costs
//! one hash and one map probe, and no comparison leaks timing about a right one.
//!
//! Scopes:
//! - `admin`: everything;
//! - `read`: every read (`GET`), including `/metrics`, except the token list (`admin`);
//! - `produce:<queue pattern>`: submit, get, cancel and reschedule tasks of matching queues;
//! - `consume:<queue pattern>`: lease, ack, nack and extend tasks of matching queues.
//!
//! A queue pattern is an exact queue name, or a prefix ending in `*` (`orders*`; `*` alone is
//! every queue).

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::queues::rate::TokenBucket;
use crate::queues::{BURST_MAX, RATE_PER_S_MAX, RATE_PER_S_MIN};

/// Longest bearer token considered (longer ones are refused before hashing).
pub const TOKEN_LEN_MAX: usize = 256;

/// Random bytes in a token [`generate_token`] makes (256 bits).
const TOKEN_RANDOM_BYTES: usize = 32;

/// What a token's holder may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Admin,
    Read,
    Produce(QueuePattern),
    Consume(QueuePattern),
}

/// An exact queue name or a prefix (written with a trailing `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueuePattern {
    Exact(String),
    Prefix(String),
}

impl QueuePattern {
    fn parse(text: &str) -> Result<QueuePattern, String> {
        let (name, prefix) = match text.strip_suffix('*') {
            Some(head) => (head, true),
            None => (text, false),
        };
        if name.contains('*') {
            return Err(format!(
                "queue pattern {text:?}: `*` may only end the pattern (a prefix)"
            ));
        }
        if !prefix && name.is_empty() {
            return Err("empty queue pattern: name a queue, a prefix ending in `*`, or `*`".into());
        }
        let queue_chars = name.len() <= belfry_core::limits::QUEUE_NAME_LEN_MAX
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !queue_chars {
            return Err(format!(
                "queue pattern {text:?}: not a queue name (letters, digits, `-`, `_`, `.`)"
            ));
        }
        Ok(if prefix {
            QueuePattern::Prefix(name.to_owned())
        } else {
            QueuePattern::Exact(name.to_owned())
        })
    }

    pub fn matches(&self, queue: &str) -> bool {
        match self {
            QueuePattern::Exact(name) => name == queue,
            QueuePattern::Prefix(prefix) => queue.starts_with(prefix.as_str()),
        }
    }
}

impl Scope {
    /// Parses `admin`, `read`, `produce:<pattern>` or `consume:<pattern>`.
    pub fn parse(text: &str) -> Result<Scope, String> {
        match text.split_once(':') {
            None if text == "admin" => Ok(Scope::Admin),
            None if text == "read" => Ok(Scope::Read),
            Some(("produce", pattern)) => Ok(Scope::Produce(QueuePattern::parse(pattern)?)),
            Some(("consume", pattern)) => Ok(Scope::Consume(QueuePattern::parse(pattern)?)),
            _ => Err(format!(
                "unknown scope {text:?}: expected admin, read, produce:<queue pattern> or \
                 consume:<queue pattern>"
            )),
        }
    }

    /// Whether this scope allows `need`.
    fn grants(&self, need: &Need) -> bool {
        match (self, need) {
            (_, Need::Public) | (Scope::Admin, _) => true,
            (_, Need::AnyToken) => true,
            (Scope::Read, Need::Read) => true,
            (Scope::Read, Need::Produce { read: true, .. }) => true,
            (Scope::Produce(pattern), Need::Produce { queue, .. }) => pattern.matches(queue),
            (Scope::Consume(pattern), Need::Consume { queue }) => pattern.matches(queue),
            _ => false,
        }
    }
}

impl fmt::Display for QueuePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueuePattern::Exact(name) => f.write_str(name),
            QueuePattern::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Admin => f.write_str("admin"),
            Scope::Read => f.write_str("read"),
            Scope::Produce(pattern) => write!(f, "produce:{pattern}"),
            Scope::Consume(pattern) => write!(f, "consume:{pattern}"),
        }
    }
}

/// What a request needs, decided from its route alone (`api::auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// No token: `/healthz`, `/readyz`.
    Public,
    /// Any valid token: a path no route serves (its 404 is no secret, but it is not public).
    AnyToken,
    Read,
    /// A task route of `queue`; `read` when it only reads (a `GET`, which `read` also allows).
    Produce {
        queue: String,
        read: bool,
    },
    Consume {
        queue: String,
    },
    Admin,
}

impl Need {
    /// The scope that would allow this, as a 403 names it.
    pub fn scope_text(&self) -> String {
        match self {
            Need::Public | Need::AnyToken => "any".into(),
            Need::Read => "read".into(),
            Need::Produce { queue, read: true } => format!("produce:{queue} or read"),
            Need::Produce { queue, read: false } => format!("produce:{queue}"),
            Need::Consume { queue } => format!("consume:{queue}"),
            Need::Admin => "admin".into(),
        }
    }
}

/// A token's SHA-256.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl TokenHash {
    pub fn of(token: &str) -> TokenHash {
        TokenHash(Sha256::digest(token.as_bytes()).into())
    }

    /// Parses `sha256:<64 hex digits>` (what `belfry token create` prints).
    pub fn parse(text: &str) -> Result<TokenHash, String> {
        // A token pasted where its hash goes: say so without echoing any of it.
        if text.starts_with(TOKEN_PREFIX) {
            return Err(
                "this is a token, not its hash (none of it is shown here): put the \
                        token's sha256:<64 hex digits> from `belfry token create`, and keep the \
                        token itself out of config files"
                    .into(),
            );
        }
        let hex_digits = text.strip_prefix("sha256:").ok_or_else(|| {
            format!(
                "expected sha256:<64 hex digits> (from `belfry token create`), got {:?}",
                cut(text)
            )
        })?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex_digits, &mut bytes)
            .map_err(|_| format!("expected 64 hex digits after sha256:, got {:?}", cut(text)))?;
        Ok(TokenHash(bytes))
    }
}

impl fmt::Display for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenHash(..)")
    }
}

fn cut(text: &str) -> String {
    text.chars().take(24).collect()
}

/// How every token belfry makes starts.
const TOKEN_PREFIX: &str = "bfy_";

/// A new random token: `bfy_` and 64 hex digits.
pub fn generate_token() -> String {
    let bytes: [u8; TOKEN_RANDOM_BYTES] = rand::random();
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// One configured token: a name (for logs and errors; never the token), its hash, its scopes,
/// and optionally a request rate limit.
#[derive(Debug, Clone)]
pub struct TokenEntry {
    pub name: String,
    pub hash: TokenHash,
    pub scopes: Vec<Scope>,
    pub rate: Option<TokenRate>,
}

/// Requests per second a token may make, with bursts of up to `burst` (`429 rate_limited`
/// past it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenRate {
    pub per_s: f64,
    pub burst: u32,
}

impl TokenRate {
    /// The limit `rate_per_s` and `burst` (as written in a config or a request) ask for:
    /// none, or a valid one; the error names the key to fix. `burst` defaults to one second's
    /// worth of requests.
    pub fn from_parts(rate_per_s: Option<f64>, burst: Option<u32>) -> Result<Option<Self>, String> {
        match (rate_per_s, burst) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err("burst: set rate_per_s too".into()),
            // A queue's bounds: a slower rate would make a refused client wait longer than any
            // Retry-After worth sending, a faster one is no limit.
            (Some(per_s), _) if !(RATE_PER_S_MIN..=RATE_PER_S_MAX).contains(&per_s) => {
                Err(format!(
                    "rate_per_s: between {RATE_PER_S_MIN} and {RATE_PER_S_MAX} (leave it out for \
                     no limit), got {per_s}"
                ))
            }
            (Some(_), Some(0)) => Err("burst: at least 1".into()),
            (Some(_), Some(burst)) if burst > BURST_MAX => {
                Err(format!("burst: at most {BURST_MAX}, got {burst}"))
            }
            (Some(per_s), burst) => Ok(Some(TokenRate {
                per_s,
                burst: burst
                    .unwrap_or_else(|| per_s.ceil().clamp(1.0, f64::from(BURST_MAX)) as u32),
            })),
        }
    }
}

/// A token as the server holds it: the entry and, when it is rate-limited, its bucket.
#[derive(Debug)]
struct Held {
    entry: TokenEntry,
    bucket: Option<Mutex<TokenBucket>>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No token, or one that is not known: 401.
    Unauthorized(String),
    /// A known token without the scope: 403, naming the scope needed.
    Forbidden { token: String, needed: String },
    /// A known token over its request rate: 429, with when to retry.
    RateLimited {
        token: String,
        retry_after: Duration,
    },
}

/// The tokens the server accepts. Empty: authentication is off, every request passes.
///
/// Two sets: the operator's (config and environment), fixed for the process's life, and the
/// ones made through the API (`POST /v1/tokens`), which the server stores and can revoke.
#[derive(Debug)]
pub struct Auth {
    tokens: HashMap<TokenHash, Held>,
    made: parking_lot::RwLock<HashMap<TokenHash, Held>>,
    /// The rate buckets' clock: monotonic time since this instant.
    epoch: Instant,
}

impl Default for Auth {
    fn default() -> Self {
        Auth {
            tokens: HashMap::new(),
            made: Default::default(),
            epoch: Instant::now(),
        }
    }
}

/// Where a token comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// `[[auth.tokens]]` or `BELFRY_ADMIN_TOKEN`: changed only by restarting with another
    /// config.
    Config,
    /// Made by `POST /v1/tokens`; revoked by `DELETE /v1/tokens/{name}`.
    Api,
}

fn held(entry: TokenEntry) -> Result<Held, String> {
    if entry.scopes.is_empty() {
        return Err(format!("token {:?} has no scopes", entry.name));
    }
    let bucket = match entry.rate {
        None => None,
        Some(rate) if rate.per_s > 0.0 && rate.per_s.is_finite() && rate.burst >= 1 => Some(
            Mutex::new(TokenBucket::new(f64::from(rate.burst), Duration::ZERO)),
        ),
        Some(_) => {
            return Err(format!(
                "token {:?}: rate_per_s must be above 0 and burst at least 1",
                entry.name
            ))
        }
    };
    Ok(Held { entry, bucket })
}

impl Auth {
    /// Authentication off.
    pub fn none() -> Auth {
        Auth::default()
    }

    /// These tokens; two entries with the same hash are refused (one token, two meanings).
    pub fn new(entries: Vec<TokenEntry>) -> Result<Auth, String> {
        let mut tokens: HashMap<TokenHash, Held> = HashMap::with_capacity(entries.len());
        for entry in entries {
            let name = entry.name.clone();
            if tokens.values().any(|h| h.entry.name == name) {
                return Err(format!("two tokens are named {name:?}: names must differ"));
            }
            if let Some(other) = tokens.insert(entry.hash, held(entry)?) {
                return Err(format!(
                    "tokens {:?} and {name:?} have the same hash: one token cannot have two names",
                    other.entry.name
                ));
            }
        }
        Ok(Auth {
            tokens,
            made: Default::default(),
            epoch: Instant::now(),
        })
    }

    /// Adds a token made through the API (or loaded from the store at start). Its name must
    /// not be taken, by a configured token or a made one.
    pub fn add_made(&self, entry: TokenEntry) -> Result<(), String> {
        let mut made = self.made.write();
        let taken = self
            .tokens
            .values()
            .chain(made.values())
            .any(|h| h.entry.name == entry.name || h.entry.hash == entry.hash);
        if taken {
            return Err(format!("a token named {:?} exists", entry.name));
        }
        made.insert(entry.hash, held(entry)?);
        Ok(())
    }

    /// Makes the made tokens exactly `entries`, as read from a store that several nodes share
    /// (tokens made and revoked on the others). A token already held, unchanged, keeps its
    /// rate bucket; one that clashes with a configured token is skipped and reported.
    /// Returns how many made tokens are held.
    pub fn follow_made(&self, entries: Vec<TokenEntry>) -> usize {
        let mut made = self.made.write();
        let mut next: HashMap<TokenHash, Held> = HashMap::with_capacity(entries.len());
        for entry in entries {
            let clash = self
                .tokens
                .values()
                .chain(next.values())
                .any(|h| h.entry.name == entry.name || h.entry.hash == entry.hash);
            if clash {
                tracing::warn!(name = %entry.name, "a stored API token clashes with another token; it will not be accepted");
                continue;
            }
            let kept = made.remove(&entry.hash).filter(|h| {
                h.entry.name == entry.name
                    && h.entry.scopes == entry.scopes
                    && h.entry.rate == entry.rate
            });
            let name = entry.name.clone();
            match kept.map_or_else(|| held(entry), Ok) {
                Ok(h) => {
                    next.insert(h.entry.hash, h);
                }
                Err(reason) => {
                    tracing::warn!(%name, %reason, "a stored API token could not be loaded; it will not be accepted")
                }
            }
        }
        *made = next;
        made.len()
    }

    /// Revokes the made token `name`: `Err` names why not (a configured one, or none).
    pub fn revoke_made(&self, name: &str) -> Result<(), String> {
        if self.tokens.values().any(|h| h.entry.name == name) {
            return Err(format!(
                "token {name:?} comes from the server's config: remove it there and restart"
            ));
        }
        let mut made = self.made.write();
        let before = made.len();
        made.retain(|_, h| h.entry.name != name);
        if made.len() == before {
            return Err(format!("no token is named {name:?}"));
        }
        Ok(())
    }

    /// Every token's entry (no token is ever kept, only hashes) and where it comes from,
    /// sorted by name.
    pub fn list(&self) -> Vec<(TokenEntry, TokenSource)> {
        let made = self.made.read();
        let mut all: Vec<_> = self
            .tokens
            .values()
            .map(|h| (h.entry.clone(), TokenSource::Config))
            .chain(made.values().map(|h| (h.entry.clone(), TokenSource::Api)))
            .collect();
        all.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        all
    }

    /// Whether calls need a token: once any token exists, configured or made.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty() || !self.made.read().is_empty()
    }

    /// Whether the bearer `token` (the `Authorization` header's, if any) allows `need` now.
    pub fn check(&self, token: Option<&str>, need: &Need) -> Result<(), Denied> {
        self.check_at(token, need, self.epoch.elapsed())
    }

    /// [`check`](Self::check) at monotonic time `now` (since this `Auth` was made): a call
    /// that passes takes one request from the token's rate bucket, if it has one.
    pub fn check_at(&self, token: Option<&str>, need: &Need, now: Duration) -> Result<(), Denied> {
        if !self.enabled() || *need == Need::Public {
            return Ok(());
        }
        let Some(token) = token else {
            return Err(Denied::Unauthorized(
                "this request needs a token: send `Authorization: Bearer <token>`".into(),
            ));
        };
        if token.len() > TOKEN_LEN_MAX {
            return Err(unknown_token());
        }
        let hash = TokenHash::of(token);
        if let Some(held) = self.tokens.get(&hash) {
            return allow(held, need, now);
        }
        match self.made.read().get(&hash) {
            Some(held) => allow(held, need, now),
            None => Err(unknown_token()),
        }
    }
}

fn unknown_token() -> Denied {
    Denied::Unauthorized(
        "the bearer token is not known to this server (revoked, mistyped, or for another \
         server)"
            .into(),
    )
}

/// Whether the known token `held` allows `need` at `now` (taking a request from its bucket).
fn allow(held: &Held, need: &Need, now: Duration) -> Result<(), Denied> {
    let entry = &held.entry;
    if !entry.scopes.iter().any(|scope| scope.grants(need)) {
        return Err(Denied::Forbidden {
            token: entry.name.clone(),
            needed: need.scope_text(),
        });
    }
    if let (Some(bucket), Some(rate)) = (&held.bucket, entry.rate) {
        let mut bucket = bucket.lock();
        let burst = f64::from(rate.burst);
        if bucket.take(rate.per_s, burst, now, 1) == 0 {
            return Err(Denied::RateLimited {
                token: entry.name.clone(),
                retry_after: bucket.time_to_token(rate.per_s),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(scopes: &[&str]) -> (Auth, String) {
        let token = generate_token();
        let entry = TokenEntry {
            name: "t".into(),
            hash: TokenHash::of(&token),
            scopes: scopes.iter().map(|s| Scope::parse(s).unwrap()).collect(),
            rate: None,
        };
        (Auth::new(vec![entry]).unwrap(), token)
    }

    fn produce(queue: &str, read: bool) -> Need {
        Need::Produce {
            queue: queue.into(),
            read,
        }
    }

    #[test]
    fn scopes_parse_and_print_back() {
        for text in [
            "admin",
            "read",
            "produce:orders",
            "produce:orders*",
            "consume:*",
        ] {
            assert_eq!(Scope::parse(text).unwrap().to_string(), text);
        }
        for bad in [
            "",
            "write",
            "produce",
            "produce:",
            "consume:a*b",
            "produce:bad name",
            "admin:x",
        ] {
            assert!(Scope::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn each_scope_allows_what_it_names_and_nothing_else() {
        let (a, token) = auth(&["produce:orders*", "consume:mail"]);
        let t = Some(token.as_str());
        assert_eq!(a.check(t, &produce("orders-eu", false)), Ok(()));
        assert_eq!(a.check(t, &produce("orders", true)), Ok(()));
        assert_eq!(
            a.check(
                t,
                &Need::Consume {
                    queue: "mail".into()
                }
            ),
            Ok(())
        );
        assert_eq!(a.check(t, &Need::AnyToken), Ok(()));
        for need in [
            produce("mail", false),
            Need::Consume {
                queue: "orders".into(),
            },
            Need::Consume {
                queue: "mail-2".into(),
            },
            Need::Read,
            Need::Admin,
        ] {
            let denied = a.check(t, &need).unwrap_err();
            assert_eq!(
                denied,
                Denied::Forbidden {
                    token: "t".into(),
                    needed: need.scope_text()
                }
            );
        }
        let (read, token) = auth(&["read"]);
        let t = Some(token.as_str());
        assert_eq!(read.check(t, &Need::Read), Ok(()));
        assert_eq!(
            read.check(t, &produce("any", true)),
            Ok(()),
            "a GET of a task"
        );
        assert!(read.check(t, &produce("any", false)).is_err(), "a submit");
        let (admin, token) = auth(&["admin"]);
        assert_eq!(admin.check(Some(&token), &Need::Admin), Ok(()));
        assert_eq!(admin.check(Some(&token), &produce("x", false)), Ok(()));
    }

    #[test]
    fn missing_and_unknown_tokens_are_unauthorized_and_public_needs_none() {
        let (a, _) = auth(&["admin"]);
        assert!(matches!(
            a.check(None, &Need::Read),
            Err(Denied::Unauthorized(_))
        ));
        assert!(matches!(
            a.check(Some("bfy_nope"), &Need::Read),
            Err(Denied::Unauthorized(_))
        ));
        let long = "x".repeat(TOKEN_LEN_MAX + 1);
        assert!(matches!(
            a.check(Some(&long), &Need::Read),
            Err(Denied::Unauthorized(_))
        ));
        assert_eq!(a.check(None, &Need::Public), Ok(()));
        assert_eq!(Auth::none().check(None, &Need::Admin), Ok(()), "auth off");
    }

    #[test]
    fn hashes_round_trip_and_bad_ones_say_what_is_expected() {
        let hash = TokenHash::of("secret");
        assert_eq!(TokenHash::parse(&hash.to_string()).unwrap(), hash);
        assert!(TokenHash::parse("secret").unwrap_err().contains("sha256:"));
        assert!(TokenHash::parse("sha256:abc").is_err());
        // A token where its hash goes: said, and none of it echoed.
        let token = generate_token();
        let refused = TokenHash::parse(&token).unwrap_err();
        assert!(refused.contains("a token, not its hash"), "{refused}");
        assert!(!refused.contains(&token[4..12]), "{refused}");
        assert!(!format!("{hash:?}").contains(&hex::encode(hash.0)));
        let token = generate_token();
        assert!(
            token.starts_with("bfy_") && token.len() == 4 + 64,
            "{token}"
        );
        assert_ne!(token, generate_token());
    }

    /// A token's rate has a queue's bounds: `1e-300` made a refused client wait (and told it
    /// `Retry-After: 18446744073709551615`), `1e300` a burst of four billion.
    #[test]
    fn token_rates_are_bounded() {
        for bad in [1e-300, 0.0009, 0.0, -1.0, f64::NAN, 1e300] {
            assert!(TokenRate::from_parts(Some(bad), None).is_err(), "{bad}");
        }
        assert!(TokenRate::from_parts(Some(5.0), Some(BURST_MAX + 1)).is_err());
        let slowest = TokenRate::from_parts(Some(RATE_PER_S_MIN), None)
            .unwrap()
            .unwrap();
        assert_eq!(slowest.burst, 1);
        let fastest = TokenRate::from_parts(Some(RATE_PER_S_MAX), None)
            .unwrap()
            .unwrap();
        assert_eq!(fastest.burst, BURST_MAX);
    }

    /// A token over its rate is refused (after its scopes are checked) with when to retry,
    /// and allowed again once its bucket has refilled; other tokens are not affected.
    #[test]
    fn a_rate_limited_token_is_refused_until_its_bucket_refills() {
        let (limited, free) = (generate_token(), generate_token());
        let auth = Auth::new(vec![
            TokenEntry {
                name: "limited".into(),
                hash: TokenHash::of(&limited),
                scopes: vec![Scope::Read],
                rate: Some(TokenRate {
                    per_s: 2.0,
                    burst: 3,
                }),
            },
            TokenEntry {
                name: "free".into(),
                hash: TokenHash::of(&free),
                scopes: vec![Scope::Read],
                rate: None,
            },
        ])
        .unwrap();
        let at = |ms| Duration::from_millis(ms);
        for _ in 0..3 {
            assert_eq!(auth.check_at(Some(&limited), &Need::Read, at(0)), Ok(()));
        }
        assert_eq!(
            auth.check_at(Some(&limited), &Need::Read, at(100)),
            Err(Denied::RateLimited {
                token: "limited".into(),
                retry_after: at(400)
            })
        );
        for _ in 0..100 {
            assert_eq!(auth.check_at(Some(&free), &Need::Read, at(100)), Ok(()));
        }
        assert_eq!(auth.check_at(Some(&limited), &Need::Read, at(500)), Ok(()));
        assert!(auth.check_at(Some(&limited), &Need::Read, at(500)).is_err());
        assert!(
            matches!(
                auth.check_at(Some(&limited), &Need::Admin, at(10_000)),
                Err(Denied::Forbidden { .. })
            ),
            "the scope is checked first and takes nothing from the bucket"
        );
        let bad = TokenEntry {
            name: "bad".into(),
            hash: TokenHash::of("x"),
            scopes: vec![Scope::Read],
            rate: Some(TokenRate {
                per_s: 0.0,
                burst: 1,
            }),
        };
        assert!(Auth::new(vec![bad]).is_err());
    }

    #[test]
    fn one_token_cannot_have_two_entries() {
        let hash = TokenHash::of("same");
        let entry = |name: &str| TokenEntry {
            name: name.into(),
            hash,
            scopes: vec![Scope::Read],
            rate: None,
        };
        assert!(Auth::new(vec![entry("a"), entry("b")]).is_err());
        assert!(Auth::new(vec![TokenEntry {
            scopes: vec![],
            ..entry("c")
        }])
        .is_err());
    }
}
