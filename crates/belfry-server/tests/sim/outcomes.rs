//! Whether each delivery and each change the server makes to a leased task has a reason:
//! deliveries only of hand-outs not delivered yet, never before the due time the claim saw;
//! acks, retries and dead letters only as the sink (or, for pull queues, the attempts left)
//! allow.

use belfry_core::{LeaseId, Task, TaskId, UnixMs};
use belfry_sinks::Outcome;

use super::model::{Answer, LeaseCall, Model, QueueSpec};

impl Model {
    /// The sink was called: the call must belong to a hand-out not delivered yet, and (unless
    /// the clock stepped back since the claim) the clock must have reached the due time.
    pub fn on_delivery(&mut self, task: &Task, attempt: u32, now_ms: UnixMs) -> Option<QueueSpec> {
        let epoch = self.back_steps;
        let Some(model) = self.tasks.get_mut(&task.id) else {
            self.violation(format!("delivered unknown task {}", task.id));
            return None;
        };
        let spec = self.queues[&model.queue].clone();
        let mut problems = Vec::new();
        match model
            .handouts
            .iter_mut()
            .rev()
            .find(|h| h.attempt == attempt)
        {
            None => problems.push(format!("attempt {attempt} was never handed out")),
            Some(handout) => {
                if handout.delivered {
                    problems.push(format!("attempt {attempt} delivered twice"));
                }
                handout.delivered = true;
                if handout.epoch == epoch && now_ms < task.due_at_ms {
                    problems.push(format!("early: at {now_ms}, due {}", task.due_at_ms));
                }
            }
        }
        if attempt > spec.max_attempts {
            problems.push(format!("attempt {attempt} of {}", spec.max_attempts));
        }
        self.stats.deliveries += 1;
        for problem in problems {
            self.violation(format!("delivery of {}: {problem}", task.id));
        }
        Some(spec)
    }

    /// What the sink answered for a delivery (not called when the server crashed under it).
    pub fn on_answer(&mut self, id: TaskId, attempt: u32, outcome: &Outcome, now_ms: UnixMs) {
        let epoch = self.back_steps;
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        let Some(lease) = task
            .handouts
            .iter()
            .rev()
            .find(|h| h.attempt == attempt)
            .map(|h| h.lease)
        else {
            return;
        };
        task.answers.insert(
            lease,
            Answer {
                outcome: outcome.clone(),
                at_ms: now_ms,
                epoch,
            },
        );
    }

    /// Whether the server had a reason for this change of a leased task.
    pub(super) fn justify(
        &self,
        id: TaskId,
        lease: LeaseId,
        attempt: u32,
        call: LeaseCall<'_>,
    ) -> Result<(), String> {
        let task = &self.tasks[&id];
        let spec = &self.queues[&task.queue];
        let max = spec.max_attempts;
        // A re-claim after an expired lease past the last attempt: the claim dead-letters it,
        // and only that claim does so without counting its attempt.
        if let LeaseCall::DeadUntried { reason } = call {
            return if attempt > max && reason.starts_with("no acknowledgement after") {
                Ok(())
            } else {
                Err(format!(
                    "untried dead letter of a task with attempts left: {reason}"
                ))
            };
        }
        if spec.push_timeout_ms.is_none() {
            // The consumer decides; the server only chooses retry or dead by the attempts.
            return match call {
                LeaseCall::Nack { .. } if attempt >= max => {
                    Err(format!("retried past max_attempts {max}"))
                }
                LeaseCall::Dead { reason }
                    if attempt < max || !reason.starts_with("gave up after") =>
                {
                    Err(format!("dead letter with attempts left: {reason}"))
                }
                _ => Ok(()),
            };
        }
        let answer = task.answers.get(&lease);
        match (call, answer.map(|a| &a.outcome)) {
            (LeaseCall::Ack, Some(Outcome::Delivered)) => Ok(()),
            (
                LeaseCall::Nack { at_ms },
                Some(Outcome::Retry {
                    after: Some(after), ..
                }),
            ) => {
                let answer = answer.expect("matched");
                let earliest = answer.at_ms + after.as_millis() as u64;
                if attempt >= max {
                    Err(format!("retried past max_attempts {max}"))
                } else if answer.epoch == self.back_steps && at_ms < earliest {
                    Err(format!(
                        "retry due {at_ms}, before the sink's Retry-After allows ({earliest})"
                    ))
                } else {
                    Ok(())
                }
            }
            (LeaseCall::Dead { reason }, Some(Outcome::Reject { reason: said })) => {
                if reason == said {
                    Ok(())
                } else {
                    Err(format!("dead reason {reason:?}, the sink said {said:?}"))
                }
            }
            (LeaseCall::Dead { reason }, Some(Outcome::Retry { .. }))
                if attempt >= max && reason.starts_with("gave up after") =>
            {
                Ok(())
            }
            (_, answer) => Err(format!("no reason for it: the sink answered {answer:?}")),
        }
    }
}
