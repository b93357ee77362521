//! The reminder service: reminders and their subscribers, over a [`Store`]. The fan-out is in
//! `fanout.rs`, the feed's selection in `feed.rs`.
//!
//! Like the schedule service it keeps no reminders in memory: every call reads the store, so
//! several nodes over one store see the same reminders. The one thing it remembers is what
//! the runner's last full look found (`quiet.rs`: the timetable of idle reminders and the
//! fan-outs running), dropped whenever a write is announced.
//! Time is passed in; the service never reads a clock. Callers run its calls on a blocking
//! thread.

use std::sync::Arc;

use belfry_core::{QueueName, UnixMs, UserId};
use belfry_store::{MetaChange, Store, StoreError};
use parking_lot::Mutex;

use crate::model::{
    InvalidReminder, InvalidReminderId, Reminder, ReminderDef, ReminderId, Urgency, When,
};
use crate::quiet::Looks;
use crate::record::{
    decode_reminder, encode_reminder, parse_uid_key, uid_key, FANOUTS_NAMESPACE, IDS_NAMESPACE,
    REMINDERS_NAMESPACE,
};

pub type Result<T, E = ReminderError> = std::result::Result<T, E>;

/// Most reminders one list page holds.
pub const LIST_LIMIT_MAX: usize = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum ReminderError {
    #[error(transparent)]
    InvalidId(#[from] InvalidReminderId),
    #[error("invalid reminder: {0}")]
    Invalid(#[from] InvalidReminder),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("queue {0} does not exist")]
    QueueNotFound(QueueName),
    #[error("reminder {0} does not exist")]
    NotFound(ReminderId),
    #[error("reminder {0} already exists")]
    AlreadyExists(ReminderId),
    #[error("reminder {0} fired once and for good; it takes no more subscribers (a PATCH of its time re-arms it)")]
    AlreadyFired(ReminderId),
    #[error("stored reminder {key:?} is unreadable: {detail}")]
    Corrupt { key: String, detail: String },
    #[error("storage failed: {0}")]
    Store(#[from] StoreError),
}

impl ReminderError {
    /// A stable machine-readable code for API errors. Never reused for another meaning.
    pub fn code(&self) -> &'static str {
        match self {
            ReminderError::InvalidId(_) => "invalid_reminder_id",
            ReminderError::Invalid(_) => "invalid_reminder",
            ReminderError::InvalidArgument(_) => "invalid_argument",
            ReminderError::QueueNotFound(_) => "queue_not_found",
            ReminderError::NotFound(_) => "reminder_not_found",
            ReminderError::AlreadyExists(_) => "reminder_exists",
            ReminderError::AlreadyFired(_) => "reminder_fired",
            ReminderError::Corrupt { .. } => "reminder_corrupt",
            ReminderError::Store(_) => "storage_error",
        }
    }
}

/// The changes of a `PATCH`: `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct ReminderPatch {
    pub content: Option<bytes::Bytes>,
    /// The new time. A `When::Cron` whose `timezone` is empty keeps the reminder's zone (UTC
    /// if it had none): changing "09:00 Paris" to "08:00" moved it to 08:00 UTC.
    pub when: Option<When>,
    pub urgency: Option<Urgency>,
}

pub struct ReminderService {
    pub(crate) store: Arc<dyn Store>,
    /// Serialises creates, patches and deletes (they read, then write two documents).
    writes: Mutex<()>,
    /// What the runner's last full look found.
    pub(crate) looks: Looks,
}

impl ReminderService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_timetable_max(store, belfry_core::TIMETABLE_MAX)
    }

    /// A service whose runner's timetable holds at most `timetable_max` idle reminders (at
    /// least 1), for tests of what happens past it.
    pub fn with_timetable_max(store: Arc<dyn Store>, timetable_max: usize) -> Self {
        ReminderService {
            store,
            writes: Mutex::new(()),
            looks: Looks::with_timetable_max(timetable_max),
        }
    }

    /// Reminders or fan-outs were written other than through this service (another node
    /// announced a change, or an embedder wrote the store): the next step reads them all.
    pub fn relook(&self) {
        self.looks.changed();
    }

    /// These reminders (by their keys in [`REMINDERS_NAMESPACE`], `uid_key`) were written
    /// other than through this service, and nothing else was (another node announced those
    /// keys): the next step reads only them again, with what is due.
    pub fn touched(&self, keys: impl IntoIterator<Item = String>) {
        self.looks.touch(keys);
    }

    pub fn create(
        &self,
        id: Option<ReminderId>,
        def: ReminderDef,
        now_ms: UnixMs,
    ) -> Result<Reminder> {
        def.validate()?;
        if self.store.get_queue(&def.queue)?.is_none() {
            return Err(ReminderError::QueueNotFound(def.queue));
        }
        // A one-shot time in the past fires at once; a cron fires at its next time.
        let next_fire_ms = match &def.when {
            When::At(at) => Some(*at),
            when => when.next_after(now_ms)?,
        };
        if next_fire_ms.is_none() {
            return Err(ReminderError::InvalidArgument(
                "the cron expression has no fire time after now".into(),
            ));
        }
        let id = id.unwrap_or_else(ReminderId::generate);
        let _writing = self.writes.lock();
        if self.store.get_meta(IDS_NAMESPACE, id.as_str())?.is_some() {
            return Err(ReminderError::AlreadyExists(id));
        }
        let reminder = Reminder {
            id,
            uid: fresh_uid(),
            def,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            next_fire_ms,
            firings: 0,
        };
        let key = uid_key(reminder.uid);
        self.store.write_meta(vec![
            MetaChange::put(REMINDERS_NAMESPACE, &key, encode_reminder(&reminder)),
            MetaChange::put(IDS_NAMESPACE, reminder.id.as_str(), key.clone().into()),
        ])?;
        self.looks.touch([key]);
        Ok(reminder)
    }

    pub fn get(&self, id: &ReminderId) -> Result<Reminder> {
        let uid = self.uid_of(id)?;
        self.by_uid(uid)?
            .ok_or_else(|| ReminderError::NotFound(id.clone()))
    }

    /// The reminder whose subscriber set is `uid`, if there is one.
    pub fn by_uid(&self, uid: u64) -> Result<Option<Reminder>> {
        let key = uid_key(uid);
        match self.store.get_meta(REMINDERS_NAMESPACE, &key)? {
            Some(bytes) => Ok(Some(decode(&key, &bytes)?)),
            None => Ok(None),
        }
    }

    fn uid_of(&self, id: &ReminderId) -> Result<u64> {
        let stored = self
            .store
            .get_meta(IDS_NAMESPACE, id.as_str())?
            .ok_or_else(|| ReminderError::NotFound(id.clone()))?;
        std::str::from_utf8(&stored)
            .ok()
            .and_then(parse_uid_key)
            .ok_or_else(|| ReminderError::Corrupt {
                key: id.to_string(),
                detail: "bad uid".into(),
            })
    }

    pub fn patch(&self, id: &ReminderId, patch: ReminderPatch, now_ms: UnixMs) -> Result<Reminder> {
        let _writing = self.writes.lock();
        let mut reminder = self.get(id)?;
        if let Some(content) = patch.content {
            reminder.def.content = content;
        }
        if let Some(urgency) = patch.urgency {
            reminder.def.urgency = urgency;
        }
        if let Some(mut when) = patch.when {
            if let When::Cron { timezone, .. } = &mut when {
                if timezone.is_empty() {
                    *timezone = match &reminder.def.when {
                        When::Cron { timezone, .. } => timezone.clone(),
                        When::At(_) => "UTC".into(),
                    };
                }
            }
            reminder.def.when = when;
            reminder.def.validate()?;
            reminder.next_fire_ms = match &reminder.def.when {
                When::At(at) => Some(*at),
                when => when.next_after(now_ms)?,
            };
        }
        reminder.def.validate()?;
        reminder.updated_at_ms = now_ms;
        let key = uid_key(reminder.uid);
        self.store
            .put_meta(REMINDERS_NAMESPACE, &key, encode_reminder(&reminder))?;
        self.looks.touch([key]);
        Ok(reminder)
    }

    /// Deletes the reminder, its fan-out in progress (chunks already made stay in the
    /// queue) and its subscribers. Returns the reminder's uid.
    pub fn delete(&self, id: &ReminderId) -> Result<u64> {
        let _writing = self.writes.lock();
        let uid = self.uid_of(id)?;
        let key = uid_key(uid);
        self.store.write_meta(vec![
            MetaChange::delete(IDS_NAMESPACE, id.as_str()),
            MetaChange::delete(REMINDERS_NAMESPACE, &key),
            MetaChange::delete(FANOUTS_NAMESPACE, &key),
        ])?;
        // Announced before the set is dropped: the reminder is gone even if that fails.
        self.looks.touch([key]);
        let dropped = self.store.drop_set(uid)?;
        self.looks
            .subscribed(-i64::try_from(dropped).unwrap_or(i64::MAX));
        Ok(uid)
    }

    /// A page of reminders in id order, of one queue or all, after `after`.
    pub fn list(
        &self,
        queue: Option<&QueueName>,
        after: Option<&ReminderId>,
        limit: usize,
    ) -> Result<Vec<Reminder>> {
        let mut out = Vec::new();
        for (id, stored) in self.store.list_meta(IDS_NAMESPACE)? {
            if after.is_some_and(|after| id.as_str() <= after.as_str()) {
                continue;
            }
            let Some(uid) = std::str::from_utf8(&stored).ok().and_then(parse_uid_key) else {
                continue;
            };
            let Some(reminder) = self.by_uid(uid)? else {
                continue;
            };
            if queue.is_none_or(|q| *q == reminder.def.queue) {
                out.push(reminder);
                if out.len() == limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Every reminder (for the fan-out runner and the feed's index).
    pub fn all(&self) -> Result<Vec<Reminder>> {
        self.store
            .list_meta(REMINDERS_NAMESPACE)?
            .into_iter()
            .map(|(key, bytes)| decode(&key, &bytes))
            .collect()
    }

    /// Subscribes `users`; returns how many were new. A one-shot reminder that has fired
    /// refuses subscribers.
    pub fn subscribe(&self, id: &ReminderId, users: &[UserId]) -> Result<u64> {
        let reminder = self.get(id)?;
        if reminder.has_fired_for_good() {
            return Err(ReminderError::AlreadyFired(id.clone()));
        }
        let added = self.store.subscribe(reminder.uid, users)?;
        self.looks
            .subscribed(i64::try_from(added).unwrap_or(i64::MAX));
        Ok(added)
    }

    pub fn unsubscribe(&self, id: &ReminderId, users: &[UserId]) -> Result<u64> {
        let uid = self.uid_of(id)?;
        let removed = self.store.unsubscribe(uid, users)?;
        self.note_unsubscribed(removed);
        Ok(removed)
    }

    /// Tells the runner's look that `removed` subscriptions ended.
    pub(crate) fn note_unsubscribed(&self, removed: u64) {
        self.looks
            .subscribed(-i64::try_from(removed).unwrap_or(i64::MAX));
    }

    pub fn count(&self, id: &ReminderId) -> Result<u64> {
        let uid = self.uid_of(id)?;
        Ok(self.store.subscriber_count(uid)?)
    }

    /// The fan-out in progress of the reminder whose set is `uid`, if any.
    pub fn fanout_of(&self, uid: u64) -> Result<Option<crate::record::Fanout>> {
        let key = uid_key(uid);
        match self.store.get_meta(FANOUTS_NAMESPACE, &key)? {
            Some(bytes) => crate::record::decode_fanout(&bytes)
                .map(Some)
                .map_err(|e| ReminderError::Corrupt { key, detail: e.0 }),
            None => Ok(None),
        }
    }

    /// The subscriber count of the reminder whose set is `uid`.
    pub fn count_of_uid(&self, uid: u64) -> Result<u64> {
        Ok(self.store.subscriber_count(uid)?)
    }

    /// [`Self::count_of_uid`] and [`Self::fanout_of`] of each of `uids`, in order: what a list
    /// page shows, in two batched store calls rather than a request per reminder.
    pub fn progress_of(&self, uids: &[u64]) -> Result<Vec<(u64, Option<crate::record::Fanout>)>> {
        let counts = self.store.subscriber_counts(uids)?;
        let keys: Vec<String> = uids.iter().map(|uid| uid_key(*uid)).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let fanouts = self.store.get_meta_many(FANOUTS_NAMESPACE, &keys)?;
        counts
            .into_iter()
            .zip(fanouts)
            .zip(keys)
            .map(|((count, fanout), key)| {
                let fanout = fanout
                    .map(|bytes| crate::record::decode_fanout(&bytes))
                    .transpose()
                    .map_err(|e| ReminderError::Corrupt {
                        key: key.to_owned(),
                        detail: e.0,
                    })?;
                Ok((count, fanout))
            })
            .collect()
    }

    pub fn is_subscribed(&self, id: &ReminderId, user: &UserId) -> Result<bool> {
        let uid = self.uid_of(id)?;
        Ok(self.store.is_subscribed(uid, user)?)
    }

    pub fn subscribers(
        &self,
        id: &ReminderId,
        after: Option<&UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>> {
        let uid = self.uid_of(id)?;
        Ok(self.store.subscribers(uid, after, limit)?)
    }
}

pub(crate) fn decode(key: &str, bytes: &[u8]) -> Result<Reminder> {
    decode_reminder(bytes).map_err(|e| ReminderError::Corrupt {
        key: key.to_owned(),
        detail: e.0,
    })
}

/// A new subscriber-set id: random and never 0, so ids of deleted reminders are not reused.
fn fresh_uid() -> u64 {
    loop {
        let uid = rand::random::<u64>();
        if uid != 0 {
            return uid;
        }
    }
}
