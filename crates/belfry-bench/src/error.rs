//! Errors of the load generator's own machinery (connections, files, child processes).
//! Scenario code wraps these with `anyhow` context; callers see one message per failure.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid argument {name}: {message}")]
    InvalidArgument { name: &'static str, message: String },
    #[error("bad target url {url:?}: {message}")]
    BadUrl { url: String, message: String },
    #[error("connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    #[error("build http request: {0}")]
    HttpRequest(#[from] http::Error),
    #[error("{method} {path} answered {status}: {body}")]
    Status {
        method: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("decode response of {path}: {source}")]
    Decode {
        path: String,
        source: serde_json::Error,
    },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("markdown file has no section markers {begin:?} … {end:?}")]
    MissingMarkers { begin: String, end: String },
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("server process: {0}")]
    Server(String),
    #[error("plot: {0}")]
    Plot(String),
}

/// `Err(InvalidArgument)` naming `name` and the range when `value` is outside `lo..=hi`.
pub(crate) fn within<T: PartialOrd + std::fmt::Display>(
    name: &'static str,
    value: T,
    lo: T,
    hi: T,
) -> Result<(), BenchError> {
    if value < lo || value > hi {
        return Err(BenchError::invalid(name, format!("must be {lo}..={hi}")));
    }
    Ok(())
}

impl BenchError {
    pub(crate) fn invalid(name: &'static str, message: impl Into<String>) -> Self {
        BenchError::InvalidArgument {
            name,
            message: message.into(),
        }
    }

    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        BenchError::Io {
            context,
            path: path.into(),
            source,
        }
    }
}
