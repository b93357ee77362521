//! A user's feed: which of their reminders to show, decided on compact entries (uid, next
//! fire time, urgency) before any content is read. This is the LINE seed's lesson: filter and
//! limit first, then fetch only what will be shown, in one batch.

use belfry_core::{UnixMs, UserId};

use crate::service::{ReminderService, Result};
use crate::Reminder;

/// `limit`: the default and the most one feed request may ask for.
pub const FEED_LIMIT_DEFAULT: usize = 50;
pub const FEED_LIMIT_MAX: usize = 1_000;

/// `within_ms`: the default (a day, the QQ seed's pre-download window) and the most.
pub const FEED_WITHIN_MS_DEFAULT: u64 = 24 * 60 * 60 * 1000;
pub const FEED_WITHIN_MS_MAX: u64 = 31 * 24 * 60 * 60 * 1000;

/// Most subscriptions of one user a feed looks at.
pub const USER_SUBSCRIPTIONS_MAX: usize = 10_000;

/// What the feed needs to know of a reminder to rank it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedEntry {
    pub uid: u64,
    pub next_fire_ms: UnixMs,
    pub urgent: bool,
}

impl FeedEntry {
    pub fn of(reminder: &Reminder) -> Option<FeedEntry> {
        Some(FeedEntry {
            uid: reminder.uid,
            next_fire_ms: reminder.next_fire_ms?,
            urgent: reminder.def.urgency == crate::Urgency::Urgent,
        })
    }
}

/// The entries due from `now_ms` to `now_ms + within_ms`, urgent first, then in due order,
/// at most `limit`: urgent reminders always make the cut.
pub fn select(
    entries: Vec<FeedEntry>,
    now_ms: UnixMs,
    within_ms: u64,
    limit: usize,
) -> Vec<FeedEntry> {
    select_by(entries, |e| *e, now_ms, within_ms, limit)
}

/// [`select`] over items that carry their entry (`entry` reads it), kept whole: the caller
/// gets the chosen items themselves, with no second lookup per item.
pub fn select_by<T>(
    mut items: Vec<T>,
    entry: impl Fn(&T) -> FeedEntry,
    now_ms: UnixMs,
    within_ms: u64,
    limit: usize,
) -> Vec<T> {
    let end = now_ms.saturating_add(within_ms);
    items.retain(|item| {
        let e = entry(item);
        e.next_fire_ms >= now_ms && e.next_fire_ms <= end
    });
    items.sort_by_key(|item| {
        let e = entry(item);
        (!e.urgent, e.next_fire_ms, e.uid)
    });
    items.truncate(limit);
    items
}

impl ReminderService {
    /// The subscriber sets (reminder uids) of `user`, from the per-user index.
    pub fn user_reminder_uids(&self, user: &UserId) -> Result<Vec<u64>> {
        Ok(self.store.user_sets(user, USER_SUBSCRIPTIONS_MAX)?)
    }

    /// The reminders of `uids` that still exist, in one pass over the store.
    pub fn by_uids(&self, uids: &[u64]) -> Result<Vec<Reminder>> {
        let mut out = Vec::with_capacity(uids.len());
        for &uid in uids {
            if let Some(reminder) = self.by_uid(uid)? {
                out.push(reminder);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(uid: u64, at: UnixMs, urgent: bool) -> FeedEntry {
        FeedEntry {
            uid,
            next_fire_ms: at,
            urgent,
        }
    }

    #[test]
    fn window_urgent_first_then_due_order_and_limit() {
        let entries = vec![
            e(1, 500, false),
            e(2, 100, false),
            e(3, 900, true),
            e(4, 50, false),   // already past
            e(5, 2_000, true), // beyond the window
            e(6, 300, true),
        ];
        let got: Vec<u64> = select(entries.clone(), 100, 1_000, 10)
            .iter()
            .map(|e| e.uid)
            .collect();
        assert_eq!(got, vec![6, 3, 2, 1]);
        // The cut keeps urgent reminders even when normal ones are due sooner.
        let got: Vec<u64> = select(entries, 100, 1_000, 2)
            .iter()
            .map(|e| e.uid)
            .collect();
        assert_eq!(got, vec![6, 3]);
    }
}
