//! Following the other nodes on a shared store: several belfry nodes over one networked store
//! behave as one service because each hears what the others changed and looks again.
//!
//! The store announces changes as [`StoreEvent`]s through the sink the builder subscribes at
//! start ([`Store::subscribe_events`](belfry_store::Store::subscribe_events)). The sink runs on
//! the store's own thread, so it only records the event in an [`Inbox`], coalescing repeats
//! (a thousand wakes of one queue are one wake), and pokes the follower task, which:
//!
//! - `Wake(queue)`: wakes the queue (its long-polls and the dispatcher);
//! - `QueueChanged(queue)`: re-reads the queue's configuration and follows it through the
//!   same path as a local `PUT` or `DELETE` (`Service::sync_queue`);
//! - `SubscriptionsChanged(users)`: the feed forgets the cached subscription lists of those
//!   users (of every user when the event names none: a bulk change or a dropped set), so a
//!   subscribe on one node shows in another node's feed at once, not after the cache's TTL;
//! - `MetaChanged(namespace)`: schedules → the schedule runner reads every schedule again
//!   (not its last look's memory, `ScheduleService::relook`); reminders or their ids → the
//!   feed's caches are emptied and the reminder runner reads every reminder again
//!   (`ReminderService::relook`); schedule cursors and fan-out progress → nothing, since only
//!   the owner's runner writes them and it knows (`Concerns`);
//!   tokens made through the API → re-read, so a token made on one node works on all;
//! - `Resync`, `Recheck` and `OwnershipChanged`: re-reads every queue and the tokens, wakes
//!   every queue (the dispatcher claims only what this node owns, so after a takeover it finds
//!   the new shards' tasks) and wakes both runners, each reading every record again (not
//!   its last look's memory), which fire only the schedules and run only the fan-outs this
//!   node owns. After a bare `Recheck`, a runner reads everything again only if the store's
//!   write counts of its namespaces moved since the last one (`Store::meta_versions`): the
//!   recheck guards against a lost announcement, and the counts say whether there was one. Only `Resync` (events were missed: the stream reconnected, or
//!   the inbox overflowed) also empties the feed's caches; the periodic `Recheck` keeps them,
//!   since every change that reaches them is announced and what a lost announcement leaves
//!   stale is bounded by the caches' own time to live.
//!
//! Events are hints: a failed re-read is kept and retried after a pause, never dropped.
//! Single-process stores send no events; then this task only waits.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{QueueName, UserId};
use belfry_store::{EventSink, StoreEvent};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::reminders::Reminders;
use crate::schedules::Schedules;
use crate::service::Service;

/// Distinct queues waiting in the inbox at most; past it the inbox turns into one `Resync`
/// (which covers every queue), so a flood of events cannot grow memory without bound.
pub const INBOX_QUEUES_MAX: usize = 100_000;

/// Distinct users waiting in the inbox at most; past it they become "every user".
pub const INBOX_USERS_MAX: usize = 100_000;

/// Pause after a failed re-read before the follower tries again.
const RETRY_PAUSE_MS: u64 = 500;

/// Events received and not yet handled, coalesced.
#[derive(Debug, Default)]
struct Pending {
    wakes: HashSet<QueueName>,
    queues: HashSet<QueueName>,
    namespaces: HashSet<String>,
    /// Users whose cached subscription lists are to be forgotten.
    users: HashSet<UserId>,
    /// Every user's cached subscription list is to be forgotten.
    all_users: bool,
    /// Look at everything again.
    resync: bool,
    /// Events may have been missed: what was cached on the strength of events goes too.
    missed: bool,
    /// Ownership may have moved, or events were missed: the runners read everything again,
    /// whatever the store's write counts say. (A bare `Recheck` leaves that to the counts.)
    moved: bool,
}

impl Pending {
    fn add(&mut self, event: StoreEvent) {
        match event {
            StoreEvent::Wake(queue) => {
                self.wakes.insert(queue);
            }
            StoreEvent::QueueChanged(queue) => {
                self.queues.insert(queue);
            }
            StoreEvent::MetaChanged(namespace) => {
                self.namespaces.insert(namespace);
            }
            StoreEvent::Resync => {
                self.resync = true;
                self.missed = true;
                self.moved = true;
            }
            StoreEvent::OwnershipChanged => {
                self.resync = true;
                self.moved = true;
            }
            StoreEvent::Recheck => self.resync = true,
            StoreEvent::SubscriptionsChanged(Some(users)) if !self.all_users => {
                self.users.extend(users);
                if self.users.len() > INBOX_USERS_MAX {
                    self.users = HashSet::new();
                    self.all_users = true;
                }
            }
            StoreEvent::SubscriptionsChanged(_) => {
                self.users = HashSet::new();
                self.all_users = true;
            }
        }
        if self.wakes.len() + self.queues.len() > INBOX_QUEUES_MAX {
            // The events dropped here are missed ones.
            *self = Pending {
                resync: true,
                missed: true,
                moved: true,
                ..Pending::default()
            };
        }
    }

    fn is_empty(&self) -> bool {
        !self.resync
            && self.wakes.is_empty()
            && self.queues.is_empty()
            && self.namespaces.is_empty()
            && self.users.is_empty()
            && !self.all_users
    }
}

/// Where the store's events wait for the follower task.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Inbox {
    /// The sink to subscribe: it takes a short lock and never blocks on the follower.
    pub(crate) fn sink(self: &Arc<Self>) -> EventSink {
        let inbox = self.clone();
        Arc::new(move |event| inbox.put(event))
    }

    fn put(&self, event: StoreEvent) {
        self.pending.lock().add(event);
        self.notify.notify_one();
    }

    fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.lock())
    }

    /// Puts back what could not be handled, to be retried.
    fn keep(&self, failed: Pending) {
        let mut pending = self.pending.lock();
        pending.resync |= failed.resync;
        pending.moved |= failed.moved;
        pending.queues.extend(failed.queues);
        pending.namespaces.extend(failed.namespaces);
    }
}

/// Re-reads the tokens made through the API; returns how many are held. The builder makes
/// it (over `api::tokens::follow`), so the follower does not import the API.
pub(crate) type FollowTokens = Arc<
    dyn Fn() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = crate::shared::Result<usize>> + Send>,
        > + Send
        + Sync,
>;

/// The follower: what it acts on.
pub(crate) struct Follower {
    pub inbox: Arc<Inbox>,
    pub service: Arc<Service>,
    pub schedules: Schedules,
    pub reminders: Reminders,
    /// The metadata namespace of the tokens made through the API, and how to re-read them.
    pub tokens: (&'static str, FollowTokens),
    /// The store's write counts of the runners' namespaces ([`RUNNER_NAMESPACES`]) when the
    /// runners last read everything on a recheck's account.
    pub seen: Mutex<Option<Vec<u64>>>,
}

/// The namespaces whose writes concern a runner ([`Concerns`]), whose write counts a recheck
/// compares.
const RUNNER_NAMESPACES: [&str; 3] = [
    belfry_schedule::SCHEDULES_NAMESPACE,
    belfry_reminders::REMINDERS_NAMESPACE,
    belfry_reminders::IDS_NAMESPACE,
];

impl Follower {
    /// Handles events until the server stops.
    pub(crate) async fn run(self) {
        let stop = self.service.stopping.clone();
        loop {
            tokio::select! {
                _ = self.inbox.notify.notified() => {}
                _ = stop.cancelled() => return,
            }
            let pending = self.inbox.take();
            if pending.is_empty() {
                continue;
            }
            let failed = self.handle(pending).await;
            if !failed.is_empty() {
                self.inbox.keep(failed);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)) => {}
                    _ = stop.cancelled() => return,
                }
                // Look again even if no new event comes.
                self.inbox.notify.notify_one();
            }
        }
    }

    /// Handles a batch of events; returns what failed (to retry).
    async fn handle(&self, mut pending: Pending) -> Pending {
        let mut failed = Pending::default();
        if pending.resync {
            // The store's fallback sweep first, so the wake-ups below find what it repaired.
            let swept = self
                .service
                .shared()
                .blocking(crate::shared::Caller::Internal, |s| Ok(s.sweep()?))
                .await;
            if let Err(error) = swept {
                tracing::warn!(%error, "the store's fallback sweep failed; the next resync tries again");
            }
            if let Err(error) = self.service.sync_all_queues().await {
                tracing::warn!(%error, "re-read every queue after a resync or an ownership change; retrying");
                failed.resync = true;
            }
            if !self.follow_tokens().await {
                failed.resync = true;
            }
            self.service.queues.wake_all();
            // Ownership may have moved, or announcements been lost: both runners read every
            // record again rather than trusting their last look. On a bare recheck, only if
            // the store's write counts say a schedule or a reminder changed since the last.
            let concerns = self.changed_since_seen(pending.moved).await;
            if concerns.schedules {
                self.schedules.relook();
            }
            if concerns.reminders {
                self.reminders.relook();
            }
            self.schedules.wake();
            self.reminders.wake();
            if pending.missed {
                self.reminders.forget_cached();
                return failed;
            }
            // Every queue was re-read and woken; the events that came with the recheck that
            // say more (users, namespaces) are handled below.
            pending.queues.clear();
            pending.wakes.clear();
        }
        for queue in pending.queues {
            if let Err(error) = self.service.sync_queue(queue.clone()).await {
                tracing::warn!(%queue, %error, "re-read a queue another node changed; retrying");
                failed.queues.insert(queue);
            }
        }
        for queue in &pending.wakes {
            if let Some(runtime) = self.service.queues.get(queue) {
                runtime.wake();
            }
        }
        if pending.all_users {
            self.reminders.forget_subscriptions(None);
        } else if !pending.users.is_empty() {
            self.reminders.forget_subscriptions(Some(&pending.users));
        }
        let (mut schedules, mut reminders) = (false, false);
        for namespace in &pending.namespaces {
            let concerns = Concerns::of(namespace);
            schedules |= concerns.schedules;
            reminders |= concerns.reminders;
        }
        if schedules {
            self.schedules.relook();
            self.schedules.wake();
        }
        if reminders {
            self.reminders.forget_cached();
            self.reminders.relook();
            self.reminders.wake();
        }
        let tokens = self.tokens.0;
        if pending.namespaces.contains(tokens) && !self.follow_tokens().await {
            failed.namespaces.insert(tokens.to_owned());
        }
        failed
    }

    /// Which runners must read everything again: both after `moved`, and on a recheck those
    /// whose namespaces the store counts writes of since the last time (both when it does not
    /// count, or cannot be read). The counts are read before the runners look, so a write
    /// after the read shows at the next recheck.
    async fn changed_since_seen(&self, moved: bool) -> Concerns {
        let counted = self
            .service
            .shared()
            .blocking(crate::shared::Caller::Internal, |s| {
                Ok(s.meta_versions(&RUNNER_NAMESPACES)?)
            })
            .await;
        let now = match counted {
            Ok(Some(now)) if now.len() == RUNNER_NAMESPACES.len() => now,
            Ok(_) => return Concerns::ALL,
            Err(error) => {
                tracing::warn!(%error, "read the store's metadata write counts; both runners look again");
                *self.seen.lock() = None;
                return Concerns::ALL;
            }
        };
        let before = self.seen.lock().replace(now.clone());
        match before {
            Some(before) if !moved => Concerns::since(&before, &now),
            _ => Concerns::ALL,
        }
    }

    /// Re-reads the tokens; false (reported) if the store could not be read.
    async fn follow_tokens(&self) -> bool {
        match (self.tokens.1)().await {
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(%error, "re-read the tokens made through the API; retrying");
                false
            }
        }
    }
}

/// Which runners a change to a metadata namespace concerns: those then read every record
/// again (and the reminder caches go).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Concerns {
    schedules: bool,
    reminders: bool,
}

impl Concerns {
    const ALL: Concerns = Concerns {
        schedules: true,
        reminders: true,
    };

    /// What the namespaces whose write counts went from `before` to `now` (by
    /// [`RUNNER_NAMESPACES`]) concern.
    fn since(before: &[u64], now: &[u64]) -> Concerns {
        let mut concerns = Concerns {
            schedules: false,
            reminders: false,
        };
        for ((namespace, before), now) in RUNNER_NAMESPACES.iter().zip(before).zip(now) {
            if before != now {
                let of = Concerns::of(namespace);
                concerns.schedules |= of.schedules;
                concerns.reminders |= of.reminders;
            }
        }
        concerns
    }

    /// A schedule's or a reminder's own document concerns its runner on every node: it may be
    /// new, moved or gone, and any node may own it. A runner's bookkeeping does not: a
    /// schedule's cursor and a fan-out's progress are written by the node that owns the
    /// record, whose runner accounts for its own writes, and a delete that removes them comes
    /// with the document's. A node hears its own announcements too, so on a shared store
    /// every tick's cursors and every paced chunk's progress used to make every node read
    /// every record again (and empty its feed caches) at once.
    fn of(namespace: &str) -> Concerns {
        Concerns {
            schedules: namespace == belfry_schedule::SCHEDULES_NAMESPACE,
            reminders: namespace == belfry_reminders::REMINDERS_NAMESPACE
                || namespace == belfry_reminders::IDS_NAMESPACE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recheck_leaves_it_to_the_write_counts_and_a_takeover_or_a_resync_does_not() {
        let mut pending = Pending::default();
        pending.add(StoreEvent::Recheck);
        assert!(pending.resync && !pending.moved);
        pending.add(StoreEvent::OwnershipChanged);
        assert!(pending.moved && !pending.missed);
        let mut pending = Pending::default();
        pending.add(StoreEvent::Resync);
        assert!(pending.moved && pending.missed);

        let none = Concerns {
            schedules: false,
            reminders: false,
        };
        assert_eq!(Concerns::since(&[3, 5, 7], &[3, 5, 7]), none);
        let schedules = Concerns::since(&[3, 5, 7], &[4, 5, 7]);
        assert!(schedules.schedules && !schedules.reminders);
        let reminders = Concerns::since(&[3, 5, 7], &[3, 5, 8]);
        assert!(
            !reminders.schedules && reminders.reminders,
            "a reminder's id"
        );
        assert_eq!(Concerns::since(&[0, 0, 0], &[1, 1, 0]), Concerns::ALL);
    }

    #[test]
    fn a_runners_bookkeeping_concerns_no_runner_and_its_documents_concern_theirs() {
        let of = |namespace: &str| {
            let c = Concerns::of(namespace);
            (c.schedules, c.reminders)
        };
        assert_eq!(of(belfry_schedule::SCHEDULES_NAMESPACE), (true, false));
        assert_eq!(of(belfry_reminders::REMINDERS_NAMESPACE), (false, true));
        assert_eq!(of(belfry_reminders::IDS_NAMESPACE), (false, true));
        assert_eq!(of(belfry_schedule::CURSORS_NAMESPACE), (false, false));
        assert_eq!(of(belfry_reminders::FANOUTS_NAMESPACE), (false, false));
        assert_eq!(of("tokens"), (false, false));
    }

    fn queue(name: &str) -> QueueName {
        QueueName::new(name).unwrap()
    }

    #[test]
    fn repeated_events_coalesce_and_a_flood_becomes_one_resync() {
        let mut pending = Pending::default();
        assert!(pending.is_empty());
        for _ in 0..1_000 {
            pending.add(StoreEvent::Wake(queue("a")));
            pending.add(StoreEvent::MetaChanged("schedules".into()));
        }
        assert_eq!(pending.wakes.len(), 1);
        assert_eq!(pending.namespaces.len(), 1);
        assert!(!pending.resync);
        pending.add(StoreEvent::OwnershipChanged);
        assert!(pending.resync);
        pending.add(StoreEvent::Recheck);
        assert!(
            pending.resync && !pending.missed,
            "a recheck misses nothing"
        );
        pending.add(StoreEvent::Resync);
        assert!(pending.missed, "a resync says events were missed");

        let mut pending = Pending::default();
        for i in 0..=INBOX_QUEUES_MAX {
            pending.add(StoreEvent::QueueChanged(queue(&format!("q{i}"))));
        }
        assert!(
            pending.resync && pending.missed,
            "too many distinct queues: one resync instead, the rest missed"
        );

        let mut pending = Pending::default();
        let user = |u: &str| UserId::new(u).unwrap();
        pending.add(StoreEvent::SubscriptionsChanged(Some(vec![user("ann")])));
        pending.add(StoreEvent::SubscriptionsChanged(Some(vec![
            user("ann"),
            user("bob"),
        ])));
        assert!(!pending.is_empty());
        assert_eq!(pending.users.len(), 2);
        assert!(!pending.all_users);
        pending.add(StoreEvent::SubscriptionsChanged(None));
        assert!(pending.all_users && pending.users.is_empty());
        pending.add(StoreEvent::SubscriptionsChanged(Some(vec![user("cy")])));
        assert!(pending.users.is_empty(), "every user covers any one");

        let mut pending = Pending::default();
        for i in 0..=INBOX_USERS_MAX / 1_000 {
            let users = (0..1_000).map(|j| user(&format!("u{i}-{j}"))).collect();
            pending.add(StoreEvent::SubscriptionsChanged(Some(users)));
        }
        assert!(
            pending.all_users,
            "too many distinct users: every user instead"
        );
        assert!(pending.users.is_empty());
        assert!(pending.queues.is_empty() && pending.wakes.is_empty());
    }
}
