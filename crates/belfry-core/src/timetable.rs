//! What a runner's last full look learned about when each of its records (schedules,
//! reminders) fires next, so that the steps after it read only the records that are due.
//!
//! A full look reads every record. Daily schedules or reminders spread over the day's
//! minutes have something due every minute, so every minute a full look read them all to
//! fire a few: 100,000 schedules cost about 0.4 s of CPU a read. A full look now leaves a
//! timetable: the next fire time of each record it saw (active, readable, owned by this
//! node), earliest first. The steps after it take from the timetable the records due by
//! then, read just those from the store, fire them, and put each back at its new next fire
//! time.
//!
//! The timetable is only as good as the full look it came from, and a runner keeps it inside
//! that look ([`crate::LastLook`]): a write through the runner's service, a change another
//! node announces or the look's age voids both, and the next step is a full look again.
//!
//! A record is in the timetable at most once: putting it again moves it, and a record whose
//! write was announced by key can be taken out ([`Timetable::forget`]) before it is read
//! again, so no stale fire time is left behind to wake a runner for nothing.
//!
//! Memory is bounded: at most a capacity's worth of records are kept, the earliest ones
//! ([`TIMETABLE_MAX`] by default). [`Timetable::beyond_ms`] remembers the earliest fire time
//! of those left out; a step that reaches it is a full look, which builds the next timetable.

use std::collections::{BTreeSet, HashMap};

use crate::UnixMs;

/// Records one timetable holds at most by default (about 120 bytes each, both indexes).
pub const TIMETABLE_MAX: usize = 16_384;

/// The next fire times of the records a full look saw, earliest first.
#[derive(Debug, Default)]
pub struct Timetable {
    capacity: usize,
    entries: BTreeSet<(UnixMs, Box<str>)>,
    /// Each record's fire time in `entries`, by key.
    at: HashMap<Box<str>, UnixMs>,
    /// The earliest next fire time among the records left out for want of room: past it,
    /// the timetable no longer knows every record that is due.
    beyond_ms: Option<UnixMs>,
}

impl Timetable {
    /// The timetable of `next` (each record's next fire time and key), keeping the
    /// `capacity` earliest.
    pub fn new(capacity: usize, mut next: Vec<(UnixMs, Box<str>)>) -> Timetable {
        let capacity = capacity.max(1);
        let mut beyond_ms = None;
        if next.len() > capacity {
            next.select_nth_unstable(capacity);
            beyond_ms = next[capacity..].iter().map(|(at, _)| *at).min();
            next.truncate(capacity);
        }
        let mut table = Timetable {
            capacity,
            entries: BTreeSet::new(),
            at: HashMap::with_capacity(next.len()),
            beyond_ms,
        };
        for (at, id) in next {
            table.insert(id, at);
        }
        table
    }

    /// Puts `id` at `at`, moving it if it was elsewhere.
    fn insert(&mut self, id: Box<str>, at: UnixMs) {
        if let Some(old) = self.at.insert(id.clone(), at) {
            self.entries.remove(&(old, id.clone()));
        }
        self.entries.insert((at, id));
    }

    /// Takes `id` out of the timetable, if it is in: its record was written, and the step
    /// that reads it again puts it back at its new fire time, if it has one.
    pub fn forget(&mut self, id: &str) {
        if let Some(at) = self.at.remove(id) {
            self.entries.remove(&(at, Box::from(id)));
        }
    }

    /// Whether every record due by `until_ms` is in the timetable.
    pub fn covers(&self, until_ms: UnixMs) -> bool {
        self.beyond_ms.is_none_or(|beyond| until_ms < beyond)
    }

    /// The earliest next fire time the timetable knows of (including the left-out ones').
    pub fn next_ms(&self) -> Option<UnixMs> {
        let first = self.entries.first().map(|(at, _)| *at);
        match (first, self.beyond_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a record in the timetable is due by `until_ms`.
    pub fn has_due(&self, until_ms: UnixMs) -> bool {
        self.entries.first().is_some_and(|(at, _)| *at <= until_ms)
    }

    /// Takes out the records due by `until_ms`, earliest first.
    pub fn take_due(&mut self, until_ms: UnixMs) -> Vec<Box<str>> {
        let mut due = Vec::new();
        while self.has_due(until_ms) {
            if let Some((_, id)) = self.entries.pop_first() {
                self.at.remove(&id);
                due.push(id);
            }
        }
        due
    }

    /// Puts a record back at its next fire time after a step handled it (moving it, if it is
    /// still in at another time). One that falls at or past [`Timetable::beyond_ms`] is left
    /// out: the full look there finds it again.
    pub fn put(&mut self, id: Box<str>, next_ms: UnixMs) {
        self.forget(&id);
        if self.beyond_ms.is_some_and(|beyond| next_ms >= beyond) {
            return;
        }
        if self.entries.len() >= self.capacity {
            // Full (only when a caller puts more than it took): the latest entry makes room.
            if let Some((at, last)) = self.entries.pop_last() {
                self.at.remove(&last);
                self.beyond_ms = Some(self.beyond_ms.map_or(at, |b| b.min(at)));
            }
            if self.beyond_ms.is_some_and(|beyond| next_ms >= beyond) {
                return;
            }
        }
        self.insert(id, next_ms);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The earliest next fire time of the records left out for want of room, if any.
    pub fn beyond_ms(&self) -> Option<UnixMs> {
        self.beyond_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(capacity: usize, times: &[(UnixMs, &str)]) -> Timetable {
        Timetable::new(
            capacity,
            times.iter().map(|&(at, id)| (at, id.into())).collect(),
        )
    }

    #[test]
    fn it_keeps_the_earliest_and_remembers_where_the_rest_begin() {
        let t = table(2, &[(50, "e"), (10, "a"), (40, "d"), (20, "b"), (30, "c")]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.beyond_ms(), Some(30));
        assert_eq!(t.next_ms(), Some(10));
        assert!(t.covers(29));
        assert!(
            !t.covers(30),
            "c is due at 30 and the timetable does not hold it"
        );

        let all = table(10, &[(20, "b"), (10, "a")]);
        assert_eq!((all.len(), all.beyond_ms()), (2, None));
        assert!(all.covers(UnixMs::MAX));
        let empty = table(10, &[]);
        assert_eq!(empty.next_ms(), None);
        assert!(!empty.has_due(UnixMs::MAX) && empty.covers(UnixMs::MAX));
        // Only left-out records: the next fire time is theirs.
        assert_eq!(table(1, &[(7, "a"), (9, "b")]).next_ms(), Some(7));
    }

    #[test]
    fn due_records_are_taken_in_order_and_put_back_at_their_next_time() {
        let mut t = table(10, &[(30, "c"), (10, "a"), (20, "b"), (20, "b2")]);
        assert!(!t.has_due(9));
        assert_eq!(t.take_due(9), Vec::<Box<str>>::new());
        let due = t.take_due(20);
        assert_eq!(
            due,
            vec!["a".into(), "b".into(), "b2".into()] as Vec<Box<str>>
        );
        assert_eq!(t.next_ms(), Some(30));
        t.put("a".into(), 110);
        t.put("b".into(), 25);
        assert_eq!(
            t.take_due(30),
            vec!["b".into(), "c".into()] as Vec<Box<str>>
        );
        assert_eq!(t.next_ms(), Some(110));
    }

    /// A record is in at most once: put again it moves; forgotten, it is out until put back.
    #[test]
    fn a_record_is_in_once_and_can_be_forgotten() {
        let mut t = table(10, &[(10, "a"), (20, "b")]);
        t.put("b".into(), 5);
        assert_eq!((t.len(), t.next_ms()), (2, Some(5)));
        assert_eq!(
            t.take_due(10),
            vec!["b".into(), "a".into()] as Vec<Box<str>>
        );
        t.put("a".into(), 30);
        t.put("a".into(), 40);
        t.forget("never there");
        assert_eq!((t.len(), t.next_ms()), (1, Some(40)));
        t.forget("a");
        assert_eq!((t.len(), t.next_ms()), (0, None));
        assert!(!t.has_due(UnixMs::MAX));
        t.put("a".into(), 50);
        assert_eq!(t.take_due(50), vec!["a".into()] as Vec<Box<str>>);
    }

    #[test]
    fn a_record_put_back_past_the_left_out_ones_is_left_out_too() {
        let mut t = table(2, &[(10, "a"), (20, "b"), (30, "c")]);
        assert_eq!(t.beyond_ms(), Some(30));
        assert_eq!(t.take_due(10), vec!["a".into()] as Vec<Box<str>>);
        t.put("a".into(), 40);
        assert_eq!(
            t.len(),
            1,
            "a now fires after c: the full look at 30 finds both"
        );
        t.put("a2".into(), 15);
        t.put("a3".into(), 16);
        assert_eq!(t.len(), 2, "never over capacity");
        assert_eq!(t.beyond_ms(), Some(20), "b made room and is now left out");
        assert!(t.covers(19) && !t.covers(20));
    }
}
