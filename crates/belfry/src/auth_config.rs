//! The `[auth]` section: bearer tokens (by hash) and their scopes, plus `BELFRY_ADMIN_TOKEN`
//! for a first start; and `belfry token create`, which makes a token and the lines to add.

use anyhow::{anyhow, bail};
use belfry_server::auth::{generate_token, Auth, Scope, TokenEntry, TokenHash, TokenRate};
use serde::Deserialize;

/// The environment variable holding an admin token (plain, never written anywhere).
pub const ADMIN_TOKEN_ENV: &str = "BELFRY_ADMIN_TOKEN";

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// `[[auth.tokens]]`.
    #[serde(default)]
    pub tokens: Vec<TokenSection>,
    /// Serve a non-loopback address without any token (an explicit opt-out).
    pub allow_unauthenticated: Option<bool>,
    /// From `BELFRY_ADMIN_TOKEN`, not the file.
    #[serde(skip)]
    pub admin_token: Option<String>,
}

impl std::fmt::Debug for AuthSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSection")
            .field("tokens", &self.tokens)
            .field("allow_unauthenticated", &self.allow_unauthenticated)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// One `[[auth.tokens]]` entry: a hash, never the token.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSection {
    pub name: String,
    pub hash: String,
    pub scopes: Vec<String>,
    /// Requests per second this token may make (none: unlimited); `429 rate_limited` past it.
    pub rate_per_s: Option<f64>,
    /// Requests it may make at once before the rate applies (default: one second's worth).
    pub burst: Option<u32>,
}

impl AuthSection {
    /// The tokens the server accepts. Refuses a non-loopback `listen` with none unless
    /// `allow_unauthenticated` says so.
    pub fn resolve(&self) -> anyhow::Result<Auth> {
        let mut entries = Vec::with_capacity(self.tokens.len() + 1);
        for (at, token) in self.tokens.iter().enumerate() {
            let key = format!("auth.tokens[{at}] ({:?})", token.name);
            if token.name.trim().is_empty() {
                bail!("auth.tokens[{at}].name: required (it names the token in errors)");
            }
            let hash = TokenHash::parse(&token.hash).map_err(|e| anyhow!("{key}.hash: {e}"))?;
            let scopes = token
                .scopes
                .iter()
                .map(|s| Scope::parse(s).map_err(|e| anyhow!("{key}.scopes: {e}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            if scopes.is_empty() {
                bail!("{key}.scopes: give at least one (admin, read, produce:<queues>, consume:<queues>)");
            }
            let rate = TokenRate::from_parts(token.rate_per_s, token.burst)
                .map_err(|e| anyhow!("{key}.{e}"))?;
            entries.push(TokenEntry {
                name: token.name.clone(),
                hash,
                scopes,
                rate,
            });
        }
        if let Some(token) = self.admin_token.as_deref().map(str::trim) {
            if token.len() < 16 {
                bail!("{ADMIN_TOKEN_ENV}: at least 16 characters (make one with `belfry token create --offline`)");
            }
            entries.push(TokenEntry {
                name: ADMIN_TOKEN_ENV.into(),
                hash: TokenHash::of(token),
                scopes: vec![Scope::Admin],
                rate: None,
            });
        }
        // Whether an open API may be served beyond loopback is the server's check at start,
        // once the tokens made through the API are loaded too (`allow_unauthenticated`).
        Auth::new(entries).map_err(|e| anyhow!("auth.tokens: {e}"))
    }
}

/// `belfry token create`: a token made by the server (`POST /v1/tokens`), or with
/// `--offline` a random token and the config lines that accept it.
#[derive(Debug, clap::Args)]
pub struct TokenCreateArgs {
    /// The token's name (shown in 403 answers and logs; never the token).
    #[arg(long, default_value = "default")]
    pub name: String,
    /// A scope: admin, read, produce:PATTERN or consume:PATTERN, PATTERN naming queues (repeatable).
    #[arg(long = "scope", required = true)]
    pub scopes: Vec<String>,
    /// Requests per second the token may make (none: unlimited).
    #[arg(long, value_parser = crate::units::parse_rate)]
    pub rate: Option<f64>,
    /// Make the token here and print the `[[auth.tokens]]` lines for the server's config,
    /// instead of asking a running server (for a server's first token).
    #[arg(long)]
    pub offline: bool,
}

/// Runs `belfry token ...`.
pub async fn token(
    remote: &crate::commands::Remote,
    command: crate::cli::TokenCommand,
) -> anyhow::Result<()> {
    use crate::cli::TokenCommand;
    use belfry_client::Request;
    match command {
        TokenCommand::Create(args) if args.offline => {
            let text = create_token(&args)?;
            crate::commands::say(text.trim_end())
        }
        TokenCommand::Create(args) => {
            for scope in &args.scopes {
                Scope::parse(scope).map_err(|e| anyhow!("--scope: {e}"))?;
            }
            let request = Request::create_token(&args.name, &args.scopes, args.rate);
            crate::commands::run(remote, request, |made: serde_json::Value| {
                format!(
                    "token {} (shown once; give it to the client as BELFRY_TOKEN):\n{}",
                    made["name"].as_str().unwrap_or(""),
                    made["token"].as_str().unwrap_or("")
                )
            })
            .await
        }
        TokenCommand::List => {
            crate::commands::run(remote, Request::list_tokens(), |list: serde_json::Value| {
                let rows: Vec<String> = list["tokens"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|t| {
                        let scopes: Vec<&str> = t["scopes"]
                            .as_array()
                            .map(Vec::as_slice)
                            .unwrap_or_default()
                            .iter()
                            .filter_map(|s| s.as_str())
                            .collect();
                        format!(
                            "{:<24} {:<7} {}",
                            t["name"].as_str().unwrap_or(""),
                            t["source"].as_str().unwrap_or(""),
                            scopes.join(" ")
                        )
                    })
                    .collect();
                if rows.is_empty() {
                    "no tokens: the API is open".into()
                } else {
                    rows.join("\n")
                }
            })
            .await
        }
        TokenCommand::Revoke { name } => {
            let done = format!("revoked {name}");
            crate::commands::run_empty(remote, Request::revoke_token(&name), done).await
        }
    }
}

pub fn create_token(args: &TokenCreateArgs) -> anyhow::Result<String> {
    for scope in &args.scopes {
        Scope::parse(scope).map_err(|e| anyhow!("--scope: {e}"))?;
    }
    belfry_server::api::tokens::check_name(&args.name).map_err(|e| anyhow!("--{e}"))?;
    belfry_server::auth::TokenRate::from_parts(args.rate, None)
        .map_err(|e| anyhow!("--rate: {}", e.trim_start_matches("rate_per_s: ")))?;
    let token = generate_token();
    let rate = match args.rate {
        Some(rate) => format!("rate_per_s = {rate}\n"),
        None => String::new(),
    };
    let scopes = args
        .scopes
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "token (shown once; give it to the client as BELFRY_TOKEN or `Authorization: Bearer`):\n\
         {token}\n\n\
         add to the server's config file:\n\
         [[auth.tokens]]\n\
         name = \"{}\"\n\
         hash = \"{}\"\n\
         scopes = [{scopes}]\n{rate}",
        args.name,
        TokenHash::of(&token)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_token_variable_makes_an_admin_token() {
        assert!(!AuthSection::default().resolve().unwrap().enabled());
        let with_env = AuthSection {
            admin_token: Some("an-admin-token-of-some-length".into()),
            ..AuthSection::default()
        };
        assert!(with_env.resolve().unwrap().enabled());
        let short = AuthSection {
            admin_token: Some("short".into()),
            ..AuthSection::default()
        };
        assert!(short
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("at least 16"));
    }

    #[test]
    fn created_lines_parse_back_into_a_token_the_server_accepts() {
        let printed = create_token(&TokenCreateArgs {
            name: "shop".into(),
            scopes: vec!["produce:orders*".into(), "read".into()],
            rate: None,
            offline: true,
        })
        .unwrap();
        let token = printed.lines().nth(1).unwrap();
        let toml_part = &printed[printed.find("[[auth.tokens]]").unwrap()..];
        #[derive(Deserialize)]
        struct File {
            auth: AuthSection,
        }
        let file: File = toml::from_str(&format!("[auth]\n{toml_part}")).unwrap();
        let auth = file.auth.resolve().unwrap();
        let need = belfry_server::auth::Need::Produce {
            queue: "orders-eu".into(),
            read: false,
        };
        assert_eq!(auth.check(Some(token), &need), Ok(()));
        assert!(!printed.contains(&format!("hash = \"{token}")));
    }

    #[test]
    fn bad_entries_name_the_key() {
        let section = |hash: &str, scope: &str| AuthSection {
            tokens: vec![TokenSection {
                name: "x".into(),
                hash: hash.into(),
                scopes: vec![scope.into()],
                rate_per_s: None,
                burst: None,
            }],
            ..AuthSection::default()
        };
        let good_hash = TokenHash::of("t").to_string();
        let error = section("plain-token", "admin")
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("auth.tokens[0]") && error.contains("hash"),
            "{error}"
        );
        let error = section(&good_hash, "write")
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("scopes") && error.contains("write"),
            "{error}"
        );
        assert!(section(&good_hash, "admin").resolve().is_ok());
    }
}
