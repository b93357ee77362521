//! Schedules and reminders whose queue does not exist: each is named in the log once, not at
//! every firing, and again only after its queue came back and went again (or it was pointed
//! at another missing queue).

use std::collections::HashMap;

use parking_lot::Mutex;

/// Owners (schedule or reminder ids) already warned about, with the missing queue named.
#[derive(Debug, Default)]
pub(crate) struct MissingQueueWarnings(Mutex<HashMap<String, String>>);

impl MissingQueueWarnings {
    /// The `(owner, queue)` pairs of `missing` to warn about now; first forgets the owners
    /// whose queue `exists` again.
    pub(crate) fn fresh(
        &self,
        missing: &[(String, String)],
        exists: impl Fn(&str) -> bool,
    ) -> Vec<(String, String)> {
        let mut warned = self.0.lock();
        if missing.is_empty() && warned.is_empty() {
            return Vec::new();
        }
        warned.retain(|_, queue| !exists(queue));
        missing
            .iter()
            .filter(|(owner, queue)| {
                warned.insert(owner.clone(), queue.clone()).as_ref() != Some(queue)
            })
            .cloned()
            .collect()
    }
}

/// Whether this node serves the queue `name`.
pub(crate) fn queue_exists(shared: &crate::shared::Shared, name: &str) -> bool {
    belfry_core::QueueName::new(name).is_ok_and(|name| shared.queues.get(&name).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(owner: &str, queue: &str) -> (String, String) {
        (owner.to_owned(), queue.to_owned())
    }

    #[test]
    fn each_owner_is_named_once_until_its_queue_is_back() {
        let warnings = MissingQueueWarnings::default();
        let gone = |_: &str| false;
        assert_eq!(warnings.fresh(&[pair("s", "q")], gone), [pair("s", "q")]);
        assert!(warnings.fresh(&[pair("s", "q")], gone).is_empty(), "once");
        // Pointed at another missing queue: named again.
        assert_eq!(warnings.fresh(&[pair("s", "r")], gone), [pair("s", "r")]);
        // Its queue back, then gone again: named again.
        assert!(warnings.fresh(&[], |_| true).is_empty());
        assert_eq!(warnings.fresh(&[pair("s", "r")], gone), [pair("s", "r")]);
    }
}
