//! The well-behaved client whose latency the hostile scenario measures: `GET /healthz` and a
//! single-task submit, each on a keep-alive connection opened before the hostile ones (a
//! pooled client) and on a fresh connection per request (a new client, which has to get
//! through the listener's accept and its connection cap).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Method;
use serde::Serialize;

use crate::http::{HttpConn, Target};
use crate::stats::{new_histogram, record_clamped, Percentiles};

/// How long one probe request may take, connect included, before it counts as failed (and
/// is recorded at this latency). Longer than the server's default idle timeout, so a client
/// that waits for a slot at the connection cap is measured rather than cut off.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// The four measured series.
pub const SERIES: [(Request, Connection); 4] = [
    (Request::Healthz, Connection::KeepAlive),
    (Request::Submit, Connection::KeepAlive),
    (Request::Healthz, Connection::Fresh),
    (Request::Submit, Connection::Fresh),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Request {
    Healthz,
    Submit,
}

impl Request {
    pub fn label(self) -> &'static str {
        match self {
            Request::Healthz => "GET /healthz",
            Request::Submit => "POST /v1/queues/{q}/tasks (one task)",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Connection {
    /// One connection opened before the phase, reused for every request.
    KeepAlive,
    /// A new connection per request; the latency includes the connect.
    Fresh,
}

impl Connection {
    pub fn label(self) -> &'static str {
        match self {
            Connection::KeepAlive => "kept alive",
            Connection::Fresh => "new per request",
        }
    }
}

/// What to probe, and how often.
#[derive(Debug, Clone)]
pub struct ProbePlan {
    pub target: Target,
    /// Path of the single-task submit.
    pub submit_path: String,
    /// Body of every submit (due far in the future, so nothing fires during the run).
    pub submit_body: Bytes,
    pub rounds: usize,
    /// One round (each of the four series once) starts every `interval`.
    pub interval: Duration,
}

/// One series' latencies.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SeriesOutcome {
    pub request: Request,
    pub connection: Connection,
    /// Requests answered with a 2xx.
    pub ok: u64,
    /// Requests that failed, timed out or were answered otherwise (recorded at their latency
    /// too, so they are not left out of the percentiles).
    pub failed: u64,
    /// Keep-alive connections that had to be opened again after a failure.
    pub reconnects: u64,
    pub latency: Percentiles,
}

/// Runs `plan.rounds` rounds; returns the four series in [`SERIES`] order.
///
/// The kept-alive series run in sequence on their connection, paced by the round clock
/// (a slow answer delays the next round of that connection only). The fresh-connection
/// requests are open-loop: each round starts its own, whatever the earlier ones are doing,
/// so a server that makes new clients wait shows as latency rather than as fewer samples.
pub async fn run(plan: &ProbePlan, mut kept: HttpConn) -> Vec<SeriesOutcome> {
    let plan = Arc::new(plan.clone());
    let started = tokio::time::Instant::now();
    let mut fresh = Vec::with_capacity(plan.rounds * 2);
    let mut kept_series = [Recorder::new(), Recorder::new()];
    for round in 0..plan.rounds {
        tokio::time::sleep_until(started + plan.interval * round as u32).await;
        for request in [Request::Healthz, Request::Submit] {
            let plan = plan.clone();
            fresh.push(tokio::spawn(async move {
                let sent = Instant::now();
                let attempt = async {
                    match HttpConn::connect(&plan.target).await {
                        Ok(mut conn) => send(&mut conn, &plan, request).await,
                        Err(_) => false,
                    }
                };
                let ok = tokio::time::timeout(PROBE_TIMEOUT, attempt)
                    .await
                    .unwrap_or(false);
                (request, ok, sent.elapsed())
            }));
        }
        for (slot, request) in [Request::Healthz, Request::Submit].into_iter().enumerate() {
            let sent = Instant::now();
            let mut ok = send(&mut kept, &plan, request).await;
            if !ok {
                // The server may have closed it (say, evicted as idle): a pooled client
                // opens another, and that time is part of this request's latency.
                kept_series[slot].reconnects += 1;
                if let Ok(conn) = HttpConn::connect(&plan.target).await {
                    kept = conn;
                    ok = send(&mut kept, &plan, request).await;
                }
            }
            kept_series[slot].record(ok, sent.elapsed());
        }
    }
    let mut fresh_series = [Recorder::new(), Recorder::new()];
    for task in fresh {
        if let Ok((request, ok, took)) = task.await {
            fresh_series[request as usize].record(ok, took);
        }
    }
    let [kh, ks] = kept_series;
    let [fh, fs] = fresh_series;
    SERIES
        .iter()
        .zip([kh, ks, fh, fs])
        .map(|(&(request, connection), r)| r.outcome(request, connection))
        .collect()
}

/// Sends one probe request within [`PROBE_TIMEOUT`]; true when answered with a 2xx.
async fn send(conn: &mut HttpConn, plan: &ProbePlan, request: Request) -> bool {
    let call = async {
        match request {
            Request::Healthz => conn.request(Method::GET, "/healthz", Bytes::new()).await,
            Request::Submit => {
                conn.request(Method::POST, &plan.submit_path, plan.submit_body.clone())
                    .await
            }
        }
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, call).await,
        Ok(Ok((status, _))) if status.is_success()
    )
}

struct Recorder {
    latency: Histogram<u64>,
    ok: u64,
    failed: u64,
    reconnects: u64,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            latency: new_histogram(),
            ok: 0,
            failed: 0,
            reconnects: 0,
        }
    }

    fn record(&mut self, ok: bool, took: Duration) {
        record_clamped(&mut self.latency, took.as_micros() as u64);
        if ok {
            self.ok += 1;
        } else {
            self.failed += 1;
        }
    }

    fn outcome(self, request: Request, connection: Connection) -> SeriesOutcome {
        SeriesOutcome {
            request,
            connection,
            ok: self.ok,
            failed: self.failed,
            reconnects: self.reconnects,
            latency: Percentiles::of(&self.latency),
        }
    }
}
