//! Store events between nodes: changes are announced with `PUBLISH` on the namespace's
//! channel (a Redis Cluster broadcasts it to every node), and each node listens on a thread
//! of its own, reconnecting to the next seed when its connection fails.
//!
//! Pub/sub is at most once: a message sent while a node was reconnecting is gone. So a node
//! that (re)connects hears [`StoreEvent::Resync`] first (events were missed: caches go), and
//! [`StoreEvent::Recheck`] every `resync_every` while connected: the fallback sweep that
//! catches a wake-up whose `PUBLISH` failed, with nothing known lost, so caches stay.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use belfry_core::{QueueName, UserId};
use belfry_store::{EventSink, MetaEvent, StoreEvent};

use crate::conn::Timeouts;
use crate::ownership::Ownership;
use crate::target::RedisTarget;

pub(crate) fn wake_message(queue: &QueueName) -> Vec<u8> {
    format!("w {queue}").into_bytes()
}

pub(crate) fn queue_message(queue: &QueueName) -> Vec<u8> {
    format!("q {queue}").into_bytes()
}

/// Keys one metadata message names at most; a write of more says "any key" instead.
pub(crate) const META_KEYS_PER_EVENT_MAX: usize = 256;

/// `m NAMESPACE VERSION` (`-` when not counted), then the keys written, one per line; none
/// (any key) when there are more than [`META_KEYS_PER_EVENT_MAX`] or one holds a line break.
pub(crate) fn meta_message(event: &MetaEvent) -> Vec<u8> {
    let mut message = format!("m {} ", event.namespace);
    match event.version {
        Some(version) => message.push_str(&version.to_string()),
        None => message.push('-'),
    }
    let named = event.keys.as_ref().filter(|keys| {
        keys.len() <= META_KEYS_PER_EVENT_MAX && keys.iter().all(|k| !k.contains('\n'))
    });
    for key in named.into_iter().flatten() {
        message.push('\n');
        message.push_str(key);
    }
    message.into_bytes()
}

/// A metadata message: `NAMESPACE`, then ` VERSION` and the keys' lines when given.
fn parse_meta(rest: &str) -> Option<StoreEvent> {
    let (head, keys) = match rest.split_once('\n') {
        Some((head, keys)) => (head, Some(keys.split('\n').map(str::to_owned).collect())),
        None => (rest, None),
    };
    let (namespace, version) = match head.split_once(' ') {
        Some((namespace, version)) => (namespace, version.parse::<u64>().ok()),
        None => (head, None),
    };
    (!namespace.is_empty()).then(|| {
        StoreEvent::MetaChanged(MetaEvent {
            namespace: namespace.to_owned(),
            keys,
            version,
        })
    })
}

/// Users one subscriptions message names at most; a change of more users says "every user"
/// instead, so a bulk subscribe of a million users is one small message, not a million (each
/// node then reads the subscription lists it had cached again, once, as they are asked for).
pub(crate) const USERS_PER_EVENT_MAX: usize = 256;

/// `u` and the users, one per line (a user id holds no control character), or `U` for every
/// user when there are more than [`USERS_PER_EVENT_MAX`]. `None`: nobody to name.
pub(crate) fn users_message(users: &[UserId]) -> Option<Vec<u8>> {
    let mut named: Vec<&str> = users.iter().map(UserId::as_str).collect();
    named.sort_unstable();
    named.dedup();
    if named.is_empty() {
        return None;
    }
    if named.len() > USERS_PER_EVENT_MAX {
        return Some(every_user_message());
    }
    let mut message = b"u".to_vec();
    for user in named {
        message.push(b'\n');
        message.extend_from_slice(user.as_bytes());
    }
    Some(message)
}

/// Every user's subscriptions may have changed (a set dropped: its members are gone).
pub(crate) fn every_user_message() -> Vec<u8> {
    b"U".to_vec()
}

fn parse(message: &[u8]) -> Option<StoreEvent> {
    let text = std::str::from_utf8(message).ok()?;
    if text == "U" {
        return Some(StoreEvent::SubscriptionsChanged(None));
    }
    if let Some(users) = text.strip_prefix("u\n") {
        let users: Vec<UserId> = users
            .split('\n')
            .filter_map(|u| UserId::new(u).ok())
            .collect();
        return (!users.is_empty()).then_some(StoreEvent::SubscriptionsChanged(Some(users)));
    }
    let (kind, rest) = text.split_once(' ')?;
    match kind {
        "w" => QueueName::new(rest).ok().map(StoreEvent::Wake),
        "q" => QueueName::new(rest).ok().map(StoreEvent::QueueChanged),
        "m" => parse_meta(rest),
        _ => None,
    }
}

/// The listening thread; it stops (within a read timeout) once this is dropped.
pub(crate) struct Listener {
    stop: Arc<AtomicBool>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

pub(crate) fn listen(
    target: &RedisTarget,
    channel: String,
    sink: EventSink,
    resync_every: Duration,
    timeouts: Timeouts,
    ownership: Option<Arc<Ownership>>,
) -> std::io::Result<Listener> {
    let seeds = match target {
        RedisTarget::Single(url) => vec![url.clone()],
        RedisTarget::Cluster(nodes) => nodes.clone(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    if let Some(own) = ownership {
        let (sink, stopping) = (sink.clone(), stop.clone());
        std::thread::Builder::new()
            .name("belfry-redis-owned".into())
            .spawn(move || watch_ownership(&own, &*sink, &stopping))?;
    }
    let stopping = stop.clone();
    std::thread::Builder::new()
        .name("belfry-redis-events".into())
        .spawn(move || run(&seeds, &channel, &*sink, resync_every, timeouts, &stopping))?;
    Ok(Listener { stop })
}

/// Says [`StoreEvent::OwnershipChanged`] whenever this node's shards change, so the server
/// looks at every queue and singleton job at once instead of at its next recheck.
fn watch_ownership(own: &Ownership, sink: &(dyn Fn(StoreEvent) + Send + Sync), stop: &AtomicBool) {
    let mut seen = own.generation();
    while !stop.load(Ordering::Acquire) {
        let now = own.wait_changed(seen, Duration::from_millis(500));
        if now != seen {
            seen = now;
            sink(StoreEvent::OwnershipChanged);
        }
    }
}

fn run(
    seeds: &[String],
    channel: &str,
    sink: &(dyn Fn(StoreEvent) + Send + Sync),
    resync_every: Duration,
    timeouts: Timeouts,
    stop: &AtomicBool,
) {
    let mut next_seed = 0;
    let mut last_warning: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let seed = &seeds[next_seed % seeds.len()];
        next_seed += 1;
        let outcome = listen_on(seed, channel, sink, resync_every, timeouts, stop);
        if let Err(error) = outcome {
            if last_warning.is_none_or(|at| at.elapsed() > Duration::from_secs(30)) {
                tracing::warn!(%error, "store events: listening failed; reconnecting");
                last_warning = Some(Instant::now());
            }
            // A short pause before the next seed, so a Redis that is down is not hammered.
            let until = Instant::now() + Duration::from_millis(250);
            while Instant::now() < until && !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn listen_on(
    seed: &str,
    channel: &str,
    sink: &(dyn Fn(StoreEvent) + Send + Sync),
    resync_every: Duration,
    timeouts: Timeouts,
    stop: &AtomicBool,
) -> redis::RedisResult<()> {
    let client = redis::Client::open(seed)?;
    let mut con = client.get_connection_with_timeout(timeouts.connect)?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(channel)?;
    pubsub.set_read_timeout(Some(Duration::from_millis(500)))?;
    // Whatever was published while this node was not listening is lost: look at everything.
    sink(StoreEvent::Resync);
    let mut last_resync = Instant::now();
    while !stop.load(Ordering::Acquire) {
        match pubsub.get_message() {
            Ok(message) => {
                if let Some(event) = parse(message.get_payload_bytes()) {
                    sink(event);
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e),
        }
        if last_resync.elapsed() >= resync_every {
            sink(StoreEvent::Recheck);
            last_resync = Instant::now();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_message_names_its_keys_and_count_unless_it_cannot() {
        let event = |keys: Option<Vec<&str>>, version| MetaEvent {
            namespace: "reminders".into(),
            keys: keys.map(|k| k.into_iter().map(str::to_owned).collect()),
            version,
        };
        for sent in [
            event(Some(vec!["00000000000000a1", "00000000000000b2"]), Some(7)),
            event(Some(vec![""]), Some(1)),
            event(None, Some(3)),
            event(Some(vec!["k"]), None),
        ] {
            let message = meta_message(&sent);
            assert_eq!(parse(&message), Some(StoreEvent::MetaChanged(sent.clone())));
        }
        // Keys it cannot name in lines: the message says "any key", never a wrong key.
        let broken = event(Some(vec!["a\nb"]), Some(2));
        assert_eq!(
            parse(&meta_message(&broken)),
            Some(StoreEvent::MetaChanged(event(None, Some(2))))
        );
        let many: Vec<String> = (0..=META_KEYS_PER_EVENT_MAX)
            .map(|i| i.to_string())
            .collect();
        let bulk = MetaEvent {
            keys: Some(many),
            ..event(None, Some(9))
        };
        assert_eq!(
            parse(&meta_message(&bulk)),
            Some(StoreEvent::MetaChanged(event(None, Some(9))))
        );
        assert_eq!(parse(b"m "), None, "no namespace");
    }

    #[test]
    fn messages_round_trip_and_junk_is_ignored() {
        let q = QueueName::new("orders.eu-1").unwrap();
        assert_eq!(parse(&wake_message(&q)), Some(StoreEvent::Wake(q.clone())));
        assert_eq!(
            parse(&queue_message(&q)),
            Some(StoreEvent::QueueChanged(q.clone()))
        );
        // Written before keys and counts were announced: any key, not counted.
        assert_eq!(
            parse(b"m schedules"),
            Some(StoreEvent::MetaChanged(MetaEvent::namespace("schedules")))
        );
        let users: Vec<UserId> = ["ann", "bob smith", "ann", "7"]
            .iter()
            .map(|u| UserId::new(u).unwrap())
            .collect();
        let message = users_message(&users).expect("users to name");
        let mut named = users[..2].to_vec();
        named.push(users[3].clone());
        named.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        assert_eq!(
            parse(&message),
            Some(StoreEvent::SubscriptionsChanged(Some(named))),
            "each user once"
        );
        assert_eq!(users_message(&[]), None);
        let many: Vec<UserId> = (0..=USERS_PER_EVENT_MAX)
            .map(|i| UserId::new(format!("user-{i}")).unwrap())
            .collect();
        let bulk = users_message(&many).expect("users to name");
        assert_eq!(
            bulk,
            every_user_message(),
            "a bulk change is one small message"
        );
        assert_eq!(parse(&bulk), Some(StoreEvent::SubscriptionsChanged(None)));
        for junk in [
            &b""[..],
            b"w",
            b"x q",
            b"w bad name!",
            b"\xff\xfe",
            b"u",
            b"u\n",
        ] {
            assert_eq!(parse(junk), None);
        }
    }
}
