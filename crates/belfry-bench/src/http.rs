//! A lean HTTP/1.1 client: one keep-alive connection per worker, requests in sequence on it.
//! Built directly on hyper's connection API so the client spends as little CPU per request
//! as possible (no pool, no redirects, no per-request allocation beyond the body).

use std::net::SocketAddr;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::error::BenchError;

/// Where the server under test listens: `http://host:port` (TLS is not needed on loopback).
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// Value of the Host header.
    pub host: String,
    /// Sent as `Authorization: Bearer` on every request, when set.
    pub token: Option<String>,
}

impl Target {
    pub fn from_addr(addr: SocketAddr) -> Self {
        Target {
            addr,
            host: addr.to_string(),
            token: None,
        }
    }

    /// Parses `http://host:port[/]`. Only literal addresses or names that resolve locally.
    pub fn parse(url: &str) -> Result<Self, BenchError> {
        let bad = |message: &str| BenchError::BadUrl {
            url: url.to_string(),
            message: message.to_string(),
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// urls are supported"))?;
        let host = rest.trim_end_matches('/');
        if host.is_empty() || host.contains('/') {
            return Err(bad("expected http://host:port with no path"));
        }
        use std::net::ToSocketAddrs;
        let with_port = if host.contains(':') {
            host.to_string()
        } else {
            format!("{host}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| bad(&e.to_string()))?
            .next()
            .ok_or_else(|| bad("host did not resolve"))?;
        Ok(Target {
            addr,
            host: host.to_string(),
            token: None,
        })
    }
}

/// One keep-alive connection.
pub struct HttpConn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    authorization: Option<http::HeaderValue>,
}

impl HttpConn {
    pub async fn connect(target: &Target) -> Result<Self, BenchError> {
        let stream =
            TcpStream::connect(target.addr)
                .await
                .map_err(|source| BenchError::Connect {
                    addr: target.addr.to_string(),
                    source,
                })?;
        // Small requests must not wait for Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // The connection ends when the sender is dropped or the server closes it; a
            // failure shows up as an error on the next request, where it is counted.
            let _ = connection.await;
        });
        let authorization = match &target.token {
            Some(token) => Some(
                http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                    BenchError::invalid("--token", "not a valid header value".to_string())
                })?,
            ),
            None => None,
        };
        Ok(HttpConn {
            sender,
            host: target.host.clone(),
            authorization,
        })
    }

    /// Whether the connection has ended (the server closed it, say after its idle timeout):
    /// a request on it would fail without reaching the server.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends one request and reads the whole response body.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), BenchError> {
        self.request_with_headers(method, path, body, &[]).await
    }

    /// [`request`](Self::request) with extra headers (name, value).
    pub async fn request_with_headers(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Bytes), BenchError> {
        self.sender.ready().await?;
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.host);
        if let Some(authorization) = &self.authorization {
            builder = builder.header(header::AUTHORIZATION, authorization);
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        // JSON unless the caller names its own type (the import's NDJSON).
        let typed = headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case(header::CONTENT_TYPE.as_str()));
        if !body.is_empty() && !typed {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        let request = builder.body(Full::new(body))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// Like [`request`](Self::request), but a non-2xx status is an error carrying the body.
    pub async fn expect_success(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<Bytes, BenchError> {
        let (status, response) = self.request(method.clone(), path, body).await?;
        if !status.is_success() {
            return Err(BenchError::Status {
                method: method.to_string(),
                path: path.to_string(),
                status: status.as_u16(),
                body: String::from_utf8_lossy(&response)
                    .chars()
                    .take(500)
                    .collect(),
            });
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_validated() {
        let t = Target::parse("http://127.0.0.1:7070").unwrap();
        assert_eq!(t.addr.port(), 7070);
        assert_eq!(t.host, "127.0.0.1:7070");
        assert!(Target::parse("http://127.0.0.1:7070/").is_ok());
        assert!(Target::parse("https://127.0.0.1:7070").is_err());
        assert!(Target::parse("127.0.0.1:7070").is_err());
        assert!(Target::parse("http://127.0.0.1:7070/v1").is_err());
        assert!(Target::parse("http://").is_err());
    }
}
