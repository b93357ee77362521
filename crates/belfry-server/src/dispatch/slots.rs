//! The dispatcher's bookkeeping of push queues: which are ready (in round-robin order), which
//! are idle until a timer, which are being claimed, which wait for budget. Plain data under
//! one mutex, no I/O and no clock reads (the caller passes `now`), so it is tested alone.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use belfry_core::QueueName;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::Push;

/// How a turn ended: when to look at the queue again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    /// It may have more due now: back of the line.
    Again,
    /// Look again after this long (its next due time, a rate-limit token, a recheck).
    After(Duration),
    /// The global or target budget ran out: wait until a delivery returns some.
    WaitBudget,
    /// The queue no longer exists.
    Gone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Idle,
    Ready,
    Claiming,
    Waiting,
}

struct Slot {
    push: Arc<Push>,
    status: Status,
    /// Woken while claiming: look again right after the claim.
    rewake: bool,
    /// The idle timer in force (older heap entries for this queue are stale).
    timer: Option<Instant>,
}

#[derive(Default)]
pub struct Slots {
    queues: HashMap<QueueName, Slot>,
    ready: VecDeque<QueueName>,
    timers: BinaryHeap<Reverse<(Instant, QueueName)>>,
    waiting: VecDeque<QueueName>,
    /// One semaphore per target, shared by the queues that deliver to it; dropped with the
    /// last of them.
    targets: HashMap<String, Weak<Semaphore>>,
}

impl Slots {
    /// The in-flight calls semaphore of `target`, made on first use.
    pub fn target(&mut self, target: &str, per_target_max: usize) -> Arc<Semaphore> {
        if let Some(existing) = self.targets.get(target).and_then(Weak::upgrade) {
            return existing;
        }
        self.targets.retain(|_, weak| weak.strong_count() > 0);
        let made = Arc::new(Semaphore::new(per_target_max));
        self.targets
            .insert(target.to_owned(), Arc::downgrade(&made));
        made
    }

    /// Adds or replaces a queue's sink; returns the replaced one. A new queue starts idle
    /// (the caller marks it).
    pub fn attach(&mut self, queue: QueueName, push: Arc<Push>) -> Option<Arc<Push>> {
        match self.queues.get_mut(&queue) {
            Some(slot) => Some(std::mem::replace(&mut slot.push, push)),
            None => {
                self.queues.insert(
                    queue,
                    Slot {
                        push,
                        status: Status::Idle,
                        rewake: false,
                        timer: None,
                    },
                );
                None
            }
        }
    }

    /// The sink a queue delivers through now.
    pub fn push(&self, queue: &QueueName) -> Option<Arc<Push>> {
        self.queues.get(queue).map(|slot| slot.push.clone())
    }

    pub fn detach(&mut self, queue: &QueueName) -> Option<Arc<Push>> {
        // Entries left in the line, timers or the waiting list are skipped when they come up.
        self.queues.remove(queue).map(|slot| slot.push)
    }

    pub fn detach_all(&mut self) -> Vec<Arc<Push>> {
        self.ready.clear();
        self.timers.clear();
        self.waiting.clear();
        self.queues.drain().map(|(_, slot)| slot.push).collect()
    }

    /// The queue may have work. Returns whether the loop should wake (it became ready).
    pub fn mark(&mut self, queue: &QueueName) -> bool {
        let Some(slot) = self.queues.get_mut(queue) else {
            return false;
        };
        match slot.status {
            Status::Idle => {
                slot.status = Status::Ready;
                slot.timer = None;
                self.ready.push_back(queue.clone());
                true
            }
            Status::Claiming => {
                slot.rewake = true;
                false
            }
            // Already in line, or waiting for budget (which a release brings back).
            Status::Ready | Status::Waiting => false,
        }
    }

    /// Budget came back: every queue waiting for it goes back in line. Returns whether any did.
    pub fn release_waiting(&mut self) -> bool {
        let mut any = false;
        while let Some(queue) = self.waiting.pop_front() {
            if let Some(slot) = self.queues.get_mut(&queue) {
                if slot.status == Status::Waiting {
                    slot.status = Status::Ready;
                    self.ready.push_back(queue);
                    any = true;
                }
            }
        }
        any
    }

    /// The next queue to claim (now marked as claiming), or when none is ready, the earliest
    /// timer to sleep until (`None`: until woken).
    pub fn next(&mut self, now: Instant) -> Result<(QueueName, Arc<Push>), Option<Instant>> {
        self.fire_timers(now);
        while let Some(queue) = self.ready.pop_front() {
            let Some(slot) = self.queues.get_mut(&queue) else {
                continue;
            };
            if slot.status != Status::Ready {
                continue;
            }
            slot.status = Status::Claiming;
            slot.rewake = false;
            return Ok((queue, slot.push.clone()));
        }
        Err(self.timers.peek().map(|Reverse((at, _))| *at))
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, queue))) = self.timers.pop() else {
                break;
            };
            if let Some(slot) = self.queues.get_mut(&queue) {
                if slot.status == Status::Idle && slot.timer == Some(at) {
                    slot.status = Status::Ready;
                    slot.timer = None;
                    self.ready.push_back(queue);
                }
            }
        }
    }

    /// A claim turn ended. Returns whether the loop should wake (the queue is ready again).
    pub fn finish(&mut self, queue: &QueueName, end: TurnEnd, now: Instant) -> bool {
        let Some(slot) = self.queues.get_mut(queue) else {
            return false;
        };
        if slot.status != Status::Claiming {
            return false;
        }
        let end = match end {
            // A wake-up during the claim may mean new work that the claim did not see.
            TurnEnd::After(_) if slot.rewake => TurnEnd::Again,
            other => other,
        };
        slot.rewake = false;
        match end {
            TurnEnd::Again => {
                slot.status = Status::Ready;
                self.ready.push_back(queue.clone());
                true
            }
            TurnEnd::After(wait) => {
                let at = now + wait;
                slot.status = Status::Idle;
                slot.timer = Some(at);
                // The loop may be asleep until a later timer: if this one is now the earliest,
                // it must wake to sleep until this one instead.
                let earliest = self
                    .timers
                    .peek()
                    .is_none_or(|Reverse((first, _))| at < *first);
                self.timers.push(Reverse((at, queue.clone())));
                earliest
            }
            TurnEnd::WaitBudget => {
                slot.status = Status::Waiting;
                self.waiting.push_back(queue.clone());
                false
            }
            TurnEnd::Gone => {
                self.queues.remove(queue);
                false
            }
        }
    }

    #[cfg(test)]
    fn status(&self, queue: &QueueName) -> Option<Status> {
        self.queues.get(queue).map(|slot| slot.status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use belfry_sinks::testing::ScriptedSink;
    use tokio_util::task::TaskTracker;

    fn push() -> Arc<Push> {
        Arc::new(Push {
            sink: Arc::new(ScriptedSink::new()),
            kind: "scripted",
            visibility_ms: 1_000,
            batch_max: 1,
            target: Arc::new(Semaphore::new(1)),
            deliveries: TaskTracker::new(),
        })
    }

    fn q(name: &str) -> QueueName {
        QueueName::new(name).unwrap()
    }

    fn names(slots: &mut Slots, now: Instant, n: usize) -> Vec<String> {
        (0..n)
            .filter_map(|_| slots.next(now).ok().map(|(q, _)| q.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn ready_queues_take_turns_and_a_busy_queue_goes_to_the_back() {
        let now = Instant::now();
        let mut slots = Slots::default();
        for name in ["big", "a", "b"] {
            slots.attach(q(name), push());
            assert!(slots.mark(&q(name)));
        }
        assert_eq!(names(&mut slots, now, 1), ["big"]);
        // The big queue had more: it queues behind the others.
        assert!(slots.finish(&q("big"), TurnEnd::Again, now));
        assert_eq!(names(&mut slots, now, 3), ["a", "b", "big"]);
    }

    #[tokio::test]
    async fn idle_queue_wakes_on_its_timer_or_on_a_mark_whichever_is_first() {
        let now = Instant::now();
        let mut slots = Slots::default();
        slots.attach(q("a"), push());
        slots.mark(&q("a"));
        slots.next(now).unwrap();
        slots.finish(&q("a"), TurnEnd::After(Duration::from_millis(50)), now);
        assert_eq!(slots.status(&q("a")), Some(Status::Idle));
        // Not yet: the loop is told when to wake.
        assert_eq!(
            slots.next(now).err(),
            Some(Some(now + Duration::from_millis(50)))
        );
        // The timer fires.
        let later = now + Duration::from_millis(50);
        assert_eq!(names(&mut slots, later, 1), ["a"]);
        // A mark beats a timer, and the timer it replaced is then stale.
        slots.finish(&q("a"), TurnEnd::After(Duration::from_secs(10)), later);
        assert!(slots.mark(&q("a")));
        assert_eq!(names(&mut slots, later, 1), ["a"]);
        slots.finish(&q("a"), TurnEnd::After(Duration::from_secs(60)), later);
        let stale = later + Duration::from_secs(10);
        assert_eq!(
            slots.next(stale).err(),
            Some(Some(later + Duration::from_secs(60))),
            "the stale timer must not make the queue ready"
        );
    }

    #[tokio::test]
    async fn a_timer_earlier_than_all_others_wakes_the_loop() {
        let now = Instant::now();
        let mut slots = Slots::default();
        for name in ["a", "b"] {
            slots.attach(q(name), push());
            slots.mark(&q(name));
        }
        slots.next(now).unwrap();
        slots.next(now).unwrap();
        // The first timer: the loop must learn of it.
        assert!(slots.finish(&q("a"), TurnEnd::After(Duration::from_secs(10)), now));
        // A later one changes nothing for a loop asleep until the first.
        assert!(!slots.finish(&q("b"), TurnEnd::After(Duration::from_secs(20)), now));
        slots.mark(&q("a"));
        slots.next(now).unwrap();
        // An earlier one than the loop's sleep: it must wake (the bug: it slept 10 s).
        assert!(slots.finish(&q("a"), TurnEnd::After(Duration::from_secs(1)), now));
    }

    #[tokio::test]
    async fn a_mark_during_a_claim_brings_the_queue_back_at_once() {
        let now = Instant::now();
        let mut slots = Slots::default();
        slots.attach(q("a"), push());
        slots.mark(&q("a"));
        slots.next(now).unwrap();
        assert!(
            !slots.mark(&q("a")),
            "claiming: remembered, not queued twice"
        );
        assert!(slots.finish(&q("a"), TurnEnd::After(Duration::from_secs(5)), now));
        assert_eq!(names(&mut slots, now, 2), ["a"]);
    }

    #[tokio::test]
    async fn queues_waiting_for_budget_return_when_budget_is_released() {
        let now = Instant::now();
        let mut slots = Slots::default();
        slots.attach(q("a"), push());
        slots.mark(&q("a"));
        slots.next(now).unwrap();
        assert!(!slots.finish(&q("a"), TurnEnd::WaitBudget, now));
        assert!(
            !slots.mark(&q("a")),
            "waiting queues are not queued by a mark"
        );
        assert!(slots.next(now).is_err());
        assert!(slots.release_waiting());
        assert_eq!(names(&mut slots, now, 1), ["a"]);
    }

    #[tokio::test]
    async fn detached_and_gone_queues_are_skipped() {
        let now = Instant::now();
        let mut slots = Slots::default();
        slots.attach(q("a"), push());
        slots.attach(q("b"), push());
        slots.mark(&q("a"));
        slots.mark(&q("b"));
        assert!(slots.detach(&q("a")).is_some());
        assert_eq!(names(&mut slots, now, 2), ["b"]);
        slots.finish(&q("b"), TurnEnd::Gone, now);
        assert!(!slots.mark(&q("b")));
        assert_eq!(slots.status(&q("b")), None);
    }

    #[test]
    fn queues_on_one_target_share_its_semaphore() {
        let mut slots = Slots::default();
        let a = slots.target("http://h:80", 3);
        let b = slots.target("http://h:80", 3);
        assert!(Arc::ptr_eq(&a, &b));
        let other = slots.target("http://other:80", 3);
        assert!(!Arc::ptr_eq(&a, &other));
        drop((a, b));
        let fresh = slots.target("http://h:80", 5);
        assert_eq!(fresh.available_permits(), 5, "made anew once unused");
    }
}
