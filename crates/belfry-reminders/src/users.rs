//! One user across reminders: every reminder they are subscribed to, and ending all their
//! subscriptions at once (an account closed, a user who asks to be forgotten).

use belfry_core::UserId;

use crate::feed::USER_SUBSCRIPTIONS_MAX;
use crate::service::{ReminderService, Result};
use crate::Reminder;

/// Sets one round of [`ReminderService::unsubscribe_everywhere`] reads from the user's index.
const UNSUBSCRIBE_ROUND_SETS: usize = 1_000;

/// The reminders a user is subscribed to.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    /// In id order, at most [`USER_SUBSCRIPTIONS_MAX`] (when there are more, which ones is
    /// not said).
    pub reminders: Vec<Reminder>,
    /// The user has more subscriptions than were read.
    pub truncated: bool,
}

impl ReminderService {
    /// The reminders `user` is subscribed to, fired or not, from the per-user index: at most
    /// [`USER_SUBSCRIPTIONS_MAX`] (the feed's bound too).
    pub fn subscriptions_of(&self, user: &UserId) -> Result<Subscriptions> {
        let uids = self.store.user_sets(user, USER_SUBSCRIPTIONS_MAX + 1)?;
        let truncated = uids.len() > USER_SUBSCRIPTIONS_MAX;
        let uids = &uids[..uids.len().min(USER_SUBSCRIPTIONS_MAX)];
        let mut reminders = self.by_uids(uids)?;
        reminders.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        Ok(Subscriptions {
            reminders,
            truncated,
        })
    }

    /// Ends every subscription of `user`, however many, a round of sets at a time: how many
    /// it ended. A subscription made meanwhile may survive it.
    pub fn unsubscribe_everywhere(&self, user: &UserId) -> Result<u64> {
        let user = std::slice::from_ref(user);
        let mut removed = 0u64;
        loop {
            let sets = self.store.user_sets(&user[0], UNSUBSCRIBE_ROUND_SETS)?;
            let mut round = 0;
            for set in &sets {
                round += self.store.unsubscribe(*set, user)?;
            }
            removed += round;
            // A set listed but no longer holding the user ends the loop rather than spin.
            if sets.len() < UNSUBSCRIBE_ROUND_SETS || round == 0 {
                break;
            }
        }
        self.note_unsubscribed(removed);
        Ok(removed)
    }
}
