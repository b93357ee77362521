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
//! - `MetaChanged(event)`: schedules whose keys the event names → the schedule runner's next
//!   tick reads those again (`ScheduleService::touched`: a create or patch on one node had
//!   made every node read every schedule); schedules not named → it reads every schedule
//!   again (not its last look's memory, `ScheduleService::relook`); reminders whose keys the event
//!   names → the feed forgets those and the reminder runner's next step reads only those
//!   again (`ReminderService::touched`: every firing start moves a reminder's next fire
//!   time, so reading every reminder at each one cost each node a full read a firing);
//!   reminders not named → the feed's caches are emptied and the runner reads every
//!   reminder again (`ReminderService::relook`); a reminder's id → nothing, since it is
//!   written only with the reminder, whose event names it; schedule cursors and fan-out
//!   progress → nothing, since only the owner's runner writes them and it knows
//!   (`Concerns`);
//!   tokens made through the API → re-read, so a token made on one node works on all;
//! - `Resync`, `Recheck` and `OwnershipChanged`: re-reads every queue and the tokens, wakes
//!   every queue (the dispatcher claims only what this node owns, so after a takeover it finds
//!   the new shards' tasks) and wakes both runners, each reading every record again (not
//!   its last look's memory), which fire only the schedules and run only the fan-outs this
//!   node owns. After a bare `Recheck`, a runner reads everything again only if the store
//!   counted a write of its namespaces whose announcement this node never heard (`Heard`:
//!   events carry the namespace's write count, `Store::meta_versions` reads them): the
//!   recheck guards against a lost announcement, and the counts say whether there was
//!   one (an announcement gets one recheck period to arrive before it counts as lost).
//!   Only `Resync` (events were missed: the stream reconnected, or the inbox overflowed)
//!   also empties the feed's caches; the periodic `Recheck` keeps them,
//!   since every change that reaches them is announced and what a lost announcement leaves
//!   stale is bounded by the caches' own time to live.
//!
//! Events are hints: a failed re-read is kept and retried after a pause, never dropped.
//! Single-process stores send no events; then this task only waits.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use belfry_core::{QueueName, UserId};
use belfry_store::{EventSink, MetaEvent, StoreEvent};
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

/// Distinct keys of one namespace waiting in the inbox at most; past it they become "any key".
pub const INBOX_KEYS_MAX: usize = 10_000;

/// Pause after a failed re-read before the follower tries again.
const RETRY_PAUSE_MS: u64 = 500;

/// Events received and not yet handled, coalesced.
#[derive(Debug, Default)]
struct Pending {
    wakes: HashSet<QueueName>,
    queues: HashSet<QueueName>,
    /// Metadata namespaces written, with the keys written (`None`: any key).
    namespaces: HashMap<String, Option<HashSet<String>>>,
    /// The write counts the metadata announcements carried: (namespace, count).
    heard: Vec<(String, u64)>,
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
            StoreEvent::MetaChanged(event) => self.meta(event),
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

    fn meta(&mut self, event: MetaEvent) {
        if let Some(version) = event.version {
            self.heard.push((event.namespace.clone(), version));
        }
        let entry = self
            .namespaces
            .entry(event.namespace)
            .or_insert_with(|| Some(HashSet::new()));
        match (entry.as_mut(), event.keys) {
            (Some(keys), Some(more)) => {
                keys.extend(more);
                if keys.len() > INBOX_KEYS_MAX {
                    *entry = None;
                }
            }
            (_, None) => *entry = None,
            (None, Some(_)) => {}
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
        for (namespace, keys) in failed.namespaces {
            pending.meta(MetaEvent {
                namespace,
                keys: keys.map(|k| k.into_iter().collect()),
                version: None,
            });
        }
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
    /// Which of the runners' namespaces' writes this node heard announced, against the
    /// store's counts at the last recheck.
    pub heard: Mutex<Heard>,
}

/// The namespaces whose writes concern a runner ([`Concerns`]), whose write counts a recheck
/// compares.
const RUNNER_NAMESPACES: [&str; 3] = [
    belfry_schedule::SCHEDULES_NAMESPACE,
    belfry_reminders::REMINDERS_NAMESPACE,
    belfry_reminders::IDS_NAMESPACE,
];

/// Counts heard above a gap, per namespace, at most; past it they are dropped and the next
/// recheck finds the gap (a look at everything).
const HEARD_ABOVE_MAX: usize = 100_000;

/// The write counts this node heard in the announcements of [`RUNNER_NAMESPACES`], to tell on
/// a recheck whether a write went unannounced (its `PUBLISH` failed, or the message was lost)
/// without reading everything whenever anything was written. A write the store counted at
/// the last recheck, whose count was never heard, was missed: an announcement has a whole
/// recheck period to arrive, so one still on its way is not taken for lost.
#[derive(Debug, Default)]
pub(crate) struct Heard {
    /// The store's counts at the last recheck; `None`: none yet, or they could not be read.
    at_recheck: Option<Vec<u64>>,
    /// Per namespace: every count up to this one was heard, or covered by a look.
    through: [u64; RUNNER_NAMESPACES.len()],
    /// Per namespace: counts heard above `through`, waiting for the gap below them to close.
    above: [BTreeSet<u64>; RUNNER_NAMESPACES.len()],
}

impl Heard {
    /// An announcement of `namespace` carried its write count `version`.
    fn hear(&mut self, namespace: &str, version: u64) {
        let Some(i) = RUNNER_NAMESPACES.iter().position(|n| *n == namespace) else {
            return;
        };
        if version > self.through[i] {
            self.above[i].insert(version);
            self.close_gaps(i);
            if self.above[i].len() > HEARD_ABOVE_MAX {
                self.above[i].clear();
            }
        }
    }

    fn close_gaps(&mut self, i: usize) {
        let through = &mut self.through[i];
        self.above[i].retain(|v| *v > *through);
        while self.above[i].first() == Some(&(*through + 1)) {
            self.above[i].pop_first();
            *through += 1;
        }
    }

    /// A recheck read the store's counts `now` (by [`RUNNER_NAMESPACES`]); answers, per
    /// namespace, whether a write counted at the last recheck went unheard (every namespace
    /// when `all`, or when there is no last recheck). The runners then read everything,
    /// which covers every write counted in `now`.
    fn recheck(&mut self, now: &[u64], all: bool) -> Vec<bool> {
        let before = self.at_recheck.replace(now.to_vec());
        let mut missed = vec![true; now.len()];
        for (i, now) in now.iter().copied().enumerate() {
            let before = before.as_ref().filter(|_| !all).map(|b| b[i]);
            // Counts that went back (the store lost its data) say nothing of what was heard.
            if before.is_some_and(|before| now < before) || now < self.through[i] {
                self.above[i].clear();
                self.through[i] = now;
            } else if before.is_some_and(|before| self.through[i] >= before) {
                missed[i] = false;
                continue;
            }
            // Missed, or nothing to compare with: the runners' look covers every write to `now`.
            self.through[i] = self.through[i].max(now);
            self.close_gaps(i);
        }
        missed
    }

    /// The counts could not be read: the next recheck reads everything.
    fn unknown(&mut self) {
        self.at_recheck = None;
    }
}

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
        {
            let mut heard = self.heard.lock();
            for (namespace, version) in &pending.heard {
                heard.hear(namespace, *version);
            }
        }
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
            // the store counted a write of a schedule or a reminder that was not announced.
            let concerns = self.missed_since_last(pending.moved).await;
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
        self.follow_meta(&pending.namespaces);
        let tokens = self.tokens.0;
        if pending.namespaces.contains_key(tokens) && !self.follow_tokens().await {
            failed.namespaces.insert(tokens.to_owned(), None);
        }
        failed
    }

    /// Metadata written on some node (this one too): a schedule whose key is named is read
    /// again by the schedule runner's next tick, alone; one not named makes it read every
    /// schedule again. A reminder whose key is named is forgotten by the feed and
    /// read again by the runner's next step, alone; one not named (any key) empties the
    /// feed's caches and makes the runner read every reminder again. A reminder's id is
    /// written only with its document, whose announcement names the reminder.
    fn follow_meta(&self, namespaces: &HashMap<String, Option<HashSet<String>>>) {
        let (mut all_schedules, mut all_reminders) = (false, false);
        let (mut schedules, mut reminders) = (HashSet::new(), HashSet::new());
        for (namespace, keys) in namespaces {
            let concerns = Concerns::of(namespace);
            if concerns.schedules {
                match keys {
                    Some(keys) => schedules.extend(keys.iter().cloned()),
                    None => all_schedules = true,
                }
            }
            if !concerns.reminders {
                continue;
            }
            match keys {
                Some(keys) if namespace == belfry_reminders::REMINDERS_NAMESPACE => {
                    reminders.extend(keys.iter().cloned());
                }
                Some(_) if namespace == belfry_reminders::IDS_NAMESPACE => {}
                _ => all_reminders = true,
            }
        }
        if all_schedules {
            self.schedules.relook();
            self.schedules.wake();
        } else if !schedules.is_empty() {
            self.schedules.touched(schedules);
            self.schedules.wake();
        }
        if all_reminders {
            self.reminders.forget_cached();
            self.reminders.relook();
            self.reminders.wake();
        } else if !reminders.is_empty() {
            self.reminders.touched(reminders);
            self.reminders.wake();
        }
    }

    /// Which runners must read everything again: both after `moved`, and on a recheck those
    /// of the namespaces with a write whose announcement this node did not hear ([`Heard`];
    /// both when the store does not count writes, or they cannot be read). The counts are
    /// read before the runners look, so a write after the read shows at the next recheck.
    async fn missed_since_last(&self, moved: bool) -> Concerns {
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
                self.heard.lock().unknown();
                return Concerns::ALL;
            }
        };
        let missed = self.heard.lock().recheck(&now, moved);
        Concerns::of_missed(&missed)
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

    /// What the namespaces flagged in `missed` (by [`RUNNER_NAMESPACES`]) concern.
    fn of_missed(missed: &[bool]) -> Concerns {
        let mut concerns = Concerns {
            schedules: false,
            reminders: false,
        };
        for (namespace, _) in RUNNER_NAMESPACES.iter().zip(missed).filter(|(_, m)| **m) {
            let of = Concerns::of(namespace);
            concerns.schedules |= of.schedules;
            concerns.reminders |= of.reminders;
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
    fn a_takeover_or_a_resync_makes_the_runners_look_again_and_a_recheck_need_not() {
        let mut pending = Pending::default();
        pending.add(StoreEvent::Recheck);
        assert!(pending.resync && !pending.moved);
        pending.add(StoreEvent::OwnershipChanged);
        assert!(pending.moved && !pending.missed);
        let mut pending = Pending::default();
        pending.add(StoreEvent::Resync);
        assert!(pending.moved && pending.missed);
    }

    /// A recheck flags a namespace only when a write the store counted at the last recheck
    /// was never heard announced; one counted since has until the next recheck to arrive.
    #[test]
    fn a_recheck_flags_only_writes_whose_announcement_never_came() {
        let [schedules, reminders, ids] = RUNNER_NAMESPACES;
        let mut heard = Heard::default();
        assert_eq!(
            heard.recheck(&[3, 5, 7], false),
            [true; 3],
            "no last recheck"
        );
        // Every write announced, out of order; one reminder write (9) still on its way.
        for (namespace, version) in [
            (reminders, 7),
            (reminders, 6),
            (schedules, 4),
            (reminders, 8),
        ] {
            heard.hear(namespace, version);
        }
        assert_eq!(heard.recheck(&[4, 9, 7], false), [false; 3]);
        // 9 arrives late, which is no loss; the id write 8 never does.
        heard.hear(reminders, 9);
        heard.hear(ids, 9);
        assert_eq!(
            heard.recheck(&[4, 9, 9], false),
            [false; 3],
            "8 had a whole period"
        );
        assert_eq!(heard.recheck(&[4, 9, 9], false), [false, false, true]);
        assert_eq!(
            heard.recheck(&[4, 9, 9], false),
            [false; 3],
            "the look covered it"
        );
        // Counts heard twice or from other namespaces change nothing; a takeover flags all.
        heard.hear(reminders, 9);
        heard.hear("reminder_fanouts", 100);
        assert_eq!(heard.recheck(&[4, 9, 9], false), [false; 3]);
        assert_eq!(heard.recheck(&[4, 9, 9], true), [true; 3]);
        heard.unknown();
        assert_eq!(heard.recheck(&[4, 9, 9], false), [true; 3], "counts unread");
        // The store lost its data: counts from 0 again, then writes heard from there on.
        assert_eq!(heard.recheck(&[4, 2, 9], false), [false, true, false]);
        heard.hear(reminders, 3);
        assert_eq!(heard.recheck(&[4, 3, 9], false), [false; 3]);
        assert_eq!(heard.recheck(&[4, 3, 9], false), [false; 3]);
        let of = Concerns::of_missed(&[false, false, true]);
        assert!(!of.schedules && of.reminders, "a reminder's id");
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

    #[test]
    fn metadata_keys_coalesce_until_any_key_covers_them() {
        let keyed = |keys: &[&str], version| {
            StoreEvent::MetaChanged(MetaEvent {
                namespace: "reminders".into(),
                keys: Some(keys.iter().map(|k| k.to_string()).collect()),
                version: Some(version),
            })
        };
        let mut pending = Pending::default();
        pending.add(keyed(&["a", "b"], 1));
        pending.add(keyed(&["b", "c"], 2));
        let keys = pending.namespaces["reminders"].clone().expect("named keys");
        assert_eq!(keys.len(), 3);
        assert_eq!(pending.heard.len(), 2, "every count heard");
        pending.add(StoreEvent::MetaChanged(MetaEvent::namespace("reminders")));
        pending.add(keyed(&["d"], 3));
        assert_eq!(pending.namespaces["reminders"], None, "any key covers d");

        let mut pending = Pending::default();
        let many: Vec<String> = (0..=INBOX_KEYS_MAX).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        pending.add(keyed(&many, 1));
        assert_eq!(pending.namespaces["reminders"], None, "too many: any key");
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
            pending.add(StoreEvent::MetaChanged(MetaEvent::namespace("schedules")));
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
