//! Which leases of a queue are outstanding, to enforce `max_in_flight`.
//!
//! Only leases handed out by this process are tracked: a lease ends on ack, nack, dead-letter
//! or when its deadline passes (the store then makes the task due again).

use std::collections::HashMap;

use belfry_core::{TaskId, UnixMs};

#[derive(Debug, Default)]
pub struct InFlight {
    until: HashMap<TaskId, UnixMs>,
}

impl InFlight {
    /// Leases still held at `now_ms`. Forgets expired ones first.
    pub fn count(&mut self, now_ms: UnixMs) -> usize {
        self.until.retain(|_, until| *until > now_ms);
        self.until.len()
    }

    /// Leases recorded, without pruning: cheap, may overcount expired ones.
    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn insert(&mut self, id: TaskId, until_ms: UnixMs) {
        self.until.insert(id, until_ms);
    }

    pub fn remove(&mut self, id: TaskId) -> bool {
        self.until.remove(&id).is_some()
    }

    /// The earliest lease deadline: when room may free up without an ack.
    pub fn earliest_until(&self) -> Option<UnixMs> {
        self.until.values().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_leases_free_room() {
        let mut f = InFlight::default();
        f.insert(TaskId(1), 100);
        f.insert(TaskId(2), 200);
        assert_eq!(f.count(50), 2);
        assert_eq!(f.earliest_until(), Some(100));
        assert_eq!(f.count(100), 1);
        assert!(f.remove(TaskId(2)));
        assert!(!f.remove(TaskId(2)));
        assert_eq!(f.count(0), 0);
    }
}
