//! Which leases of a queue are outstanding, to enforce `max_in_flight`.
//!
//! Only leases handed out by this process are tracked, by lease (a task whose lease ran out
//! may be leased again while its old holder still works on it: two slots). A pull lease ends
//! on ack, nack, dead-letter or when its deadline passes (the store then makes the task due
//! again). A push delivery's slot is held until its delivery ends ([`HELD`]), whatever the
//! wall clock says: a clock step forward or a sink outliving its timeout must not let the
//! dispatcher start more calls to the receiver than the queue's limit.

use std::collections::HashMap;

use belfry_core::{LeaseId, UnixMs};

/// The deadline of a slot that only a release ends (a push delivery's).
pub const HELD: UnixMs = UnixMs::MAX;

#[derive(Debug, Default)]
pub struct InFlight {
    until: HashMap<LeaseId, UnixMs>,
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

    pub fn insert(&mut self, lease: LeaseId, until_ms: UnixMs) {
        self.until.insert(lease, until_ms);
    }

    pub fn remove(&mut self, lease: LeaseId) -> bool {
        self.until.remove(&lease).is_some()
    }

    /// The earliest lease deadline: when room may free up without an ack (`None` when only
    /// releases free slots).
    pub fn earliest_until(&self) -> Option<UnixMs> {
        self.until.values().filter(|&&u| u != HELD).min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_leases_free_room() {
        let mut f = InFlight::default();
        f.insert(LeaseId(1), 100);
        f.insert(LeaseId(2), 200);
        assert_eq!(f.count(50), 2);
        assert_eq!(f.earliest_until(), Some(100));
        assert_eq!(f.count(100), 1);
        assert!(f.remove(LeaseId(2)));
        assert!(!f.remove(LeaseId(2)));
        assert_eq!(f.count(0), 0);
    }
}
