//! The bench's consumer of reminder chunks: leases them, checks every user arrived once,
//! and acks them, on a thread of its own.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::ReadLoad;
use crate::http::{HttpConn, Target};
use crate::sys::{on_own_thread, unix_ms};

/// Most chunks one lease asks for.
const LEASE_MAX: usize = 50;

/// What a drain received.
pub(super) struct Drained {
    pub(super) users: u64,
    pub(super) duplicates: u64,
    pub(super) last_ack_ms: Option<u64>,
    /// (receipt ms, users) of each chunk, in receipt order.
    pub(super) chunks: Vec<(u64, u64)>,
    /// Feed reads made meanwhile, if any.
    pub(super) feed: Option<ReadLoad>,
}

/// A lease answer of reminder chunks, read in place: only what the consumer checks.
#[derive(Deserialize)]
struct LeasedChunks<'a> {
    #[serde(borrow)]
    tasks: Vec<LeasedChunk<'a>>,
}

#[derive(Deserialize)]
struct LeasedChunk<'a> {
    id: &'a str,
    lease_id: &'a str,
    #[serde(borrow)]
    payload: ChunkUsers<'a>,
}

#[derive(Deserialize)]
struct ChunkUsers<'a> {
    /// The bench's user ids are decimal numbers, which JSON never escapes.
    #[serde(borrow, default)]
    users: Vec<&'a str>,
}

#[derive(Serialize)]
struct Acks<'a> {
    acks: Vec<Ack<'a>>,
}

#[derive(Serialize)]
struct Ack<'a> {
    id: &'a str,
    lease_id: &'a str,
}

/// Leases and acks chunks until `expected` users arrived (or `deadline` passed); users are
/// numeric ids, checked for duplicates with a bitmap.
///
/// The consumer runs on a thread of its own: parsing a lease answer of 50 chunks (2.5 MB)
/// would otherwise hold a worker of the bench's runtime, and the feed reads made meanwhile
/// would count that wait as the server's latency.
pub(super) async fn drain_users(
    target: &Target,
    queue: &str,
    expected: u64,
    bar: &indicatif::ProgressBar,
    deadline: Duration,
) -> anyhow::Result<Drained> {
    let (target, queue, bar) = (target.clone(), queue.to_owned(), bar.clone());
    on_own_thread("bench-consumer", move || async move {
        consume(&target, &queue, expected, &bar, deadline).await
    })
    .await?
}

async fn consume(
    target: &Target,
    queue: &str,
    expected: u64,
    bar: &indicatif::ProgressBar,
    deadline: Duration,
) -> anyhow::Result<Drained> {
    let mut conn = HttpConn::connect(target).await?;
    let mut seen = vec![0u64; (expected as usize / 64) + 1];
    let mut out = Drained {
        users: 0,
        duplicates: 0,
        last_ack_ms: None,
        chunks: Vec::new(),
        feed: None,
    };
    let lease = format!("/v1/queues/{queue}/lease");
    let ack = format!("/v1/queues/{queue}/ack");
    let lease_body = Bytes::from(
        json!({"max": LEASE_MAX, "wait_ms": 1000, "visibility_ms": 600_000}).to_string(),
    );
    let give_up = Instant::now() + deadline;
    while out.users < expected && Instant::now() < give_up {
        let answer = conn
            .expect_success(Method::POST, &lease, lease_body.clone())
            .await?;
        let received = unix_ms();
        let leased: LeasedChunks = serde_json::from_slice(&answer)
            .map_err(|e| anyhow::anyhow!("a lease answer of {queue} is not chunks: {e}"))?;
        if leased.tasks.is_empty() {
            continue;
        }
        for task in &leased.tasks {
            let users = &task.payload.users;
            for user in users {
                let id = user.parse::<u64>().unwrap_or(u64::MAX);
                let (word, bit) = ((id / 64) as usize, id % 64);
                match seen.get_mut(word) {
                    Some(w) if *w & (1 << bit) != 0 => out.duplicates += 1,
                    Some(w) => {
                        *w |= 1 << bit;
                        out.users += 1;
                    }
                    None => out.duplicates += 1,
                }
            }
            out.chunks.push((received, users.len() as u64));
            bar.inc(users.len() as u64);
        }
        let acks = Acks {
            acks: leased
                .tasks
                .iter()
                .map(|t| Ack {
                    id: t.id,
                    lease_id: t.lease_id,
                })
                .collect(),
        };
        conn.expect_success(Method::POST, &ack, Bytes::from(serde_json::to_vec(&acks)?))
            .await?;
        out.last_ack_ms = Some(unix_ms());
    }
    Ok(out)
}
