//! In-process HTTP servers the bench runs itself: the trivial handler (the HTTP stack's
//! ceiling, on its own runtime and threads so it competes for the cores like a real server
//! would) and the webhook receiver that timestamps deliveries.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::BenchError;

/// Serves `handler` on `listener` until `stop` turns true, counting accepted connections in
/// `accepted`.
async fn serve<H, F>(
    listener: TcpListener,
    handler: H,
    mut stop: watch::Receiver<bool>,
    accepted_count: Arc<AtomicU64>,
) where
    H: Fn(Bytes, http::HeaderMap) -> F + Send + Sync + 'static,
    F: Future<Output = (StatusCode, Bytes)> + Send + 'static,
{
    let handler = Arc::new(handler);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return,
        };
        let Ok((stream, _)) = accepted else {
            // Out of file descriptors or a reset during accept: keep serving the others.
            continue;
        };
        accepted_count.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let handler = handler.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    // A body that fails mid-read is answered like an empty one: the
                    // client will count its own error.
                    let body = body
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let (status, response) = handler(body, parts.headers).await;
                    let mut response = Response::new(Full::new(response));
                    *response.status_mut() = status;
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The trivial handler: reads the request and answers `200 {}` — what any server on this
/// HTTP stack costs before doing real work.
pub struct TrivialServer {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TrivialServer {
    /// Starts on 127.0.0.1 (a free port) with its own `threads`-worker runtime.
    pub fn start(threads: usize) -> Result<Self, BenchError> {
        Self::start_answering(threads, Bytes::from_static(b"{}"))
    }

    /// Like [`start`](Self::start), answering `200` with `answer` (to compare a server whose
    /// answers are larger than `{}` with the HTTP stack sending the same bytes).
    pub fn start_answering(threads: usize, answer: Bytes) -> Result<Self, BenchError> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| BenchError::io("bind trivial server", "127.0.0.1:0", e))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| BenchError::io("bind trivial server", "127.0.0.1:0", e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| BenchError::io("bind trivial server", "127.0.0.1:0", e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("baseline-http")
            .enable_all()
            .build()
            .map_err(|e| BenchError::io("start trivial server runtime", "", e))?;
        let (stop, stop_rx) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name("baseline-http-main".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    serve(
                        listener,
                        move |_body, _headers| {
                            let answer = answer.clone();
                            async move { (StatusCode::OK, answer) }
                        },
                        stop_rx,
                        Arc::default(),
                    )
                    .await;
                });
                // Open connections are dropped with the runtime.
                runtime.shutdown_background();
            })
            .map_err(|e| BenchError::io("spawn trivial server thread", "", e))?;
        Ok(TrivialServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    pub fn target(&self) -> crate::http::Target {
        crate::http::Target::from_addr(self.addr)
    }

    fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TrivialServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A webhook receiver on the caller's runtime: each POST body is handed to `on_delivery`
/// with the receipt time taken as soon as the body is read; answers 200.
pub struct WebhookReceiver {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    accepted: Arc<AtomicU64>,
}

impl WebhookReceiver {
    pub async fn start<D>(on_delivery: D) -> Result<Self, BenchError>
    where
        D: Fn(Bytes, &http::HeaderMap, u64) + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| BenchError::io("bind webhook receiver", "127.0.0.1:0", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| BenchError::io("bind webhook receiver", "127.0.0.1:0", e))?;
        let (stop, stop_rx) = watch::channel(false);
        let on_delivery = Arc::new(on_delivery);
        let accepted = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(serve(
            listener,
            move |body, headers| {
                let receipt_us = crate::sys::unix_us();
                on_delivery(body, &headers, receipt_us);
                async { (StatusCode::OK, Bytes::new()) }
            },
            stop_rx,
            accepted.clone(),
        ));
        Ok(WebhookReceiver {
            addr,
            stop,
            task,
            accepted,
        })
    }

    /// Connections the receiver has accepted so far: a sender that reuses its connections
    /// opens few, one that churns opens one per request.
    pub fn connections(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn the_receiver_hands_every_body_to_the_callback() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let receiver = WebhookReceiver::start(move |body, headers, receipt_us| {
            let id = headers
                .get("belfry-task-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            sink.lock()
                .unwrap()
                .push((crate::workload::parse_index(&body), id, receipt_us));
        })
        .await
        .unwrap();
        let target = crate::http::Target::from_addr(receiver.addr);
        let mut conn = crate::http::HttpConn::connect(&target).await.unwrap();
        for i in 0..3u64 {
            let body = Bytes::from(crate::workload::payload(i, 64));
            let (status, _) = conn
                .request(http::Method::POST, "/hook", body)
                .await
                .unwrap();
            assert_eq!(status, StatusCode::OK);
        }
        receiver.stop().await;
        let seen = seen.lock().unwrap();
        let indices: Vec<_> = seen.iter().map(|s| s.0).collect();
        assert_eq!(indices, vec![Some(0), Some(1), Some(2)]);
        assert!(seen.iter().all(|s| s.2 > 0));
    }

    #[test]
    fn the_trivial_server_answers_200_until_stopped() {
        let server = TrivialServer::start(1).unwrap();
        let target = server.target();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut conn = crate::http::HttpConn::connect(&target).await.unwrap();
            let (status, body) = conn
                .request(
                    http::Method::POST,
                    "/v1/queues/q/tasks",
                    Bytes::from_static(b"{}"),
                )
                .await
                .unwrap();
            assert_eq!((status, &body[..]), (StatusCode::OK, &b"{}"[..]));
        });
        server.stop();
        rt.block_on(async {
            assert!(crate::http::HttpConn::connect(&target).await.is_err());
        });
    }
}
