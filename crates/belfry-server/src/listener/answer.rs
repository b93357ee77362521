//! Answers the listener writes itself, outside hyper, before it closes a connection: plain
//! HTTP sent to the HTTPS port, TLS sent to the plain port, and a request head that did not
//! arrive within `http.header_read_timeout` (hyper's timer closes the connection, writing
//! nothing). Each is the standard error JSON with a stable
//! code, as every other 4xx, so that a client (or the person reading its log) learns what
//! to fix instead of seeing a reset, a TLS alert or an empty answer.
//!
//! These are rare, so they are built when needed. The connection is then closed gently:
//! the answer, the end of the sending side, and a short wait that reads and drops whatever
//! the client still sends. Closing a socket with unread bytes sends a reset, and a reset can
//! make the client's system drop the answer before the client reads it.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::api::{ApiError, ErrorCode};

/// The first byte of every TLS connection: a handshake record.
pub(super) const TLS_HANDSHAKE: u8 = 0x16;

/// How long a connection being closed with an answer may take to receive it and close its
/// side: the write, and the reading of what it still sends.
const LINGER: Duration = Duration::from_secs(2);

/// The most a closing connection's late bytes are read (and dropped) before it is cut.
const LINGER_BYTES: usize = 64 * 1024;

/// The whole answer: status line, `content-type`, `connection: close`, `content-length`,
/// and the standard error body.
fn error_answer(code: ErrorCode, message: &str) -> Vec<u8> {
    let body = ApiError::new(code, message).to_json_bytes();
    let status = code.status();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\nconnection: close\r\n\
         content-length: {}\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error"),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    answer
}

/// To a connection on the HTTPS port whose first byte is not a TLS handshake.
pub(super) fn plain_http_on_tls_port() -> Vec<u8> {
    error_answer(
        ErrorCode::MalformedHttp,
        "this port serves HTTPS: use https://, not http:// (the request was sent without TLS)",
    )
}

/// To a connection on the plain HTTP port whose first byte is a TLS handshake.
pub(super) fn tls_on_plain_port() -> Vec<u8> {
    error_answer(
        ErrorCode::MalformedHttp,
        "this port serves plain HTTP, without TLS: use http://, not https:// (the server has \
         no tls.cert and tls.key configured)",
    )
}

/// To a connection whose request head (line and headers) did not all arrive in time.
pub(super) fn head_too_slow(timeout: Duration) -> Vec<u8> {
    error_answer(
        ErrorCode::RequestTimeout,
        &format!(
            "the request line and headers did not all arrive within http.header_read_timeout \
             ({} ms): send the whole head at once",
            timeout.as_millis()
        ),
    )
}

/// Writes `answer`, ends the sending side, and reads (and drops) what the client still sends
/// until it closes, for at most `LINGER` and `LINGER_BYTES`; then the connection is dropped.
pub(super) async fn answer_and_close<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    answer: &[u8],
) {
    let closing = async {
        stream.write_all(answer).await?;
        stream.shutdown().await?;
        let mut buf = [0u8; 4096];
        let mut read = 0;
        while read < LINGER_BYTES {
            match stream.read(&mut buf).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(LINGER, closing).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%error, "close a connection with an answer"),
        Err(_) => tracing::debug!("close a connection with an answer: the client did not close"),
    }
}
