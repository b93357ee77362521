//! Subscriber sets: not yet stored by the engine (in progress).

use belfry_core::UserId;

use super::Engine;
use crate::store::{Result, StoreError};

fn unsupported<T>() -> Result<T> {
    Err(StoreError::Invalid(
        "subscriber sets are not stored by the embedded engine yet".into(),
    ))
}

impl Engine {
    pub(super) fn subs_subscribe(&self, _set: u64, _users: &[UserId]) -> Result<u64> {
        unsupported()
    }
    pub(super) fn subs_unsubscribe(&self, _set: u64, _users: &[UserId]) -> Result<u64> {
        unsupported()
    }
    pub(super) fn subs_contains(&self, _set: u64, _user: &UserId) -> Result<bool> {
        unsupported()
    }
    pub(super) fn subs_count(&self, _set: u64) -> Result<u64> {
        unsupported()
    }
    pub(super) fn subs_members(
        &self,
        _set: u64,
        _after: Option<&UserId>,
        _limit: usize,
    ) -> Result<Vec<UserId>> {
        unsupported()
    }
    pub(super) fn subs_of_user(&self, _user: &UserId, _limit: usize) -> Result<Vec<u64>> {
        unsupported()
    }
    pub(super) fn subs_drop(&self, _set: u64) -> Result<u64> {
        unsupported()
    }
}
