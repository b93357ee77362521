//! What a runner's last full look at the store found, kept until something says it may be
//! out of date.
//!
//! The schedule and reminder runners step every second. A full look lists and decodes every
//! record, so with many idle records most of their CPU went to finding, again, that nothing
//! is due. A look that found nothing to do is remembered, and a step answers from it until a
//! change is announced ([`LastLook::changed`]), the runner's own condition says it is due (a
//! fire time came), or it is `max_age_ms` old.
//!
//! A change is a counter bumped *after* its write, and a look records the counter *before* it
//! reads ([`LastLook::begin`]): a write that the read may have missed leaves the counter ahead
//! of the look's, and the next step looks again.
//!
//! A change that names the records it wrote need not void the look ([`LastLook::touch`]): its
//! keys wait in a short list that the next step reads along with what is due
//! ([`LastLook::take_touched`]), and a full look that begins after them empties the list (it
//! reads them anyway). On a store shared by several nodes, each create or patch on one node
//! had made every node read every record again; past [`TOUCHED_MAX`] waiting keys, touching
//! is a change like any other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::UnixMs;

/// Touched keys that wait for a step at most; past it the list is dropped and the next step
/// is a full look.
pub const TOUCHED_MAX: usize = 4_096;

/// The last look that found nothing to do, and the count of changes announced.
#[derive(Debug)]
pub struct LastLook<T> {
    max_age_ms: u64,
    changes: AtomicU64,
    memo: Mutex<Option<Memo<T>>>,
    /// Keys written since the last full look began ([`LastLook::touch`]), which the next
    /// step reads.
    touched: Mutex<Vec<String>>,
}

#[derive(Debug)]
struct Memo<T> {
    /// [`LastLook::changes`] when the look began.
    changes: u64,
    looked_ms: UnixMs,
    found: T,
}

/// What [`LastLook::begin`] hands to [`LastLook::end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct LookStart(u64);

impl<T: Clone> LastLook<T> {
    /// Looks are remembered for at most `max_age_ms`: that bounds how long a change nobody
    /// announced goes unseen.
    pub fn new(max_age_ms: u64) -> Self {
        LastLook {
            max_age_ms,
            changes: AtomicU64::new(0),
            memo: Mutex::new(None),
            touched: Mutex::new(Vec::new()),
        }
    }

    /// The records at `keys` were written: the next step reads them again, without voiding
    /// the look (a change, if more than [`TOUCHED_MAX`] keys wait). Like
    /// [`LastLook::changed`], it comes after the write.
    pub fn touch(&self, keys: impl IntoIterator<Item = String>) {
        let mut touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        touched.extend(keys);
        if touched.len() > TOUCHED_MAX {
            *touched = Vec::new();
            self.changed();
        }
    }

    /// Whether keys touched since the last full look began wait for a step.
    pub fn has_touched(&self) -> bool {
        !self
            .touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Adds to `keys` those touched since the last full look began that it does not hold,
    /// each once, and forgets them: the step that takes them reads them.
    pub fn take_touched(&self, keys: &mut Vec<String>) {
        let touched = std::mem::take(&mut *self.touched.lock().unwrap_or_else(|e| e.into_inner()));
        if touched.is_empty() {
            return;
        }
        let mut seen: std::collections::HashSet<String> = keys.iter().cloned().collect();
        keys.extend(touched.into_iter().filter(|k| seen.insert(k.clone())));
    }

    /// Something a look reads was written: the next step looks again.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// What the last look found, if no change was announced since it began and it is younger
    /// than `max_age_ms` at `now_ms` (a clock that stepped back also voids it).
    pub fn recall(&self, now_ms: UnixMs) -> Option<T> {
        let guard = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        let memo = guard.as_ref()?;
        let current = memo.changes == self.changes.load(Ordering::SeqCst);
        let young = now_ms >= memo.looked_ms && now_ms - memo.looked_ms < self.max_age_ms;
        (current && young).then(|| memo.found.clone())
    }

    /// A full look begins. It reads every record after this, the touched ones too, so the
    /// keys touched so far are dropped; those touched while it reads wait for the next step.
    pub fn begin(&self) -> LookStart {
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        LookStart(self.changes.load(Ordering::SeqCst))
    }

    /// The look that began at `start` ran at `now_ms` and found `found` (`None`: it found
    /// something to do, or failed, and is not to be remembered). A look ages from `now_ms`:
    /// a runner that keeps what it found up to date itself (the schedule runner's timetable,
    /// shared by `found`) still looks again once `max_age_ms` has passed.
    pub fn end(&self, start: LookStart, now_ms: UnixMs, found: Option<T>) {
        *self.memo.lock().unwrap_or_else(|e| e.into_inner()) = found.map(|found| Memo {
            changes: start.0,
            looked_ms: now_ms,
            found,
        });
    }

    /// Drops what the last look found: the next step looks again (after a step that kept it
    /// up to date failed, or found something it cannot keep).
    pub fn forget(&self) {
        *self.memo.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_is_recalled_until_it_is_max_age_old() {
        let look = LastLook::new(30_000);
        assert_eq!(look.recall(1_000), None, "no look yet");
        let start = look.begin();
        look.end(start, 1_000, Some(7));
        assert_eq!(look.recall(1_000), Some(7));
        assert_eq!(look.recall(30_999), Some(7));
        assert_eq!(look.recall(31_000), None);
        assert_eq!(look.recall(999), None, "the clock stepped back");
    }

    /// A change announced after the look began (its read may have missed it) voids the look;
    /// one announced before the look began was seen by it.
    #[test]
    fn a_change_during_or_after_a_look_voids_it() {
        let look = LastLook::new(30_000);
        look.changed();
        let start = look.begin();
        look.end(start, 1_000, Some(()));
        assert_eq!(look.recall(1_001), Some(()), "seen by the look");

        let start = look.begin();
        look.changed();
        look.end(start, 2_000, Some(()));
        assert_eq!(look.recall(2_001), None, "written while reading");

        let start = look.begin();
        look.end(start, 3_000, Some(()));
        look.changed();
        assert_eq!(look.recall(3_001), None, "written after");
    }

    /// Touched keys keep the look, wait for the step that takes them (each once, and not
    /// those it already reads), and are dropped by a full look that begins after them; too
    /// many void the look.
    #[test]
    fn touched_keys_keep_the_look_until_too_many_wait() {
        let look = LastLook::new(30_000);
        let start = look.begin();
        look.end(start, 1_000, Some(()));
        look.touch(["b".to_owned(), "a".to_owned(), "b".to_owned()]);
        assert!(look.has_touched());
        assert_eq!(look.recall(1_001), Some(()), "a touch is not a change");
        let mut keys = vec!["a".to_owned()];
        look.take_touched(&mut keys);
        assert_eq!(keys, ["a", "b"]);
        assert!(!look.has_touched());

        look.touch(["c".to_owned()]);
        let start = look.begin();
        assert!(!look.has_touched(), "the full look reads c");
        look.touch(["d".to_owned()]);
        look.end(start, 2_000, Some(()));
        assert_eq!(look.recall(2_001), Some(()));
        let mut keys = Vec::new();
        look.take_touched(&mut keys);
        assert_eq!(
            keys,
            ["d"],
            "touched while the look read: the next step reads it"
        );

        look.touch((0..TOUCHED_MAX).map(|i| i.to_string()));
        assert_eq!(look.recall(2_002), Some(()), "as many as may wait");
        look.touch(["one too many".to_owned()]);
        assert_eq!(look.recall(2_003), None);
        assert!(!look.has_touched(), "the full look reads them all");
    }

    #[test]
    fn a_forgotten_look_is_not_recalled() {
        let look = LastLook::new(30_000);
        let start = look.begin();
        look.end(start, 1_000, Some(1));
        look.forget();
        assert_eq!(look.recall(1_001), None);
    }

    #[test]
    fn a_look_that_found_work_is_not_remembered() {
        let look = LastLook::new(30_000);
        let start = look.begin();
        look.end(start, 1_000, Some(1));
        let start = look.begin();
        look.end(start, 2_000, None);
        assert_eq!(look.recall(2_001), None);
    }
}
