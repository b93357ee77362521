//! `Store::cancel_many` on Redis: the change script of every task in one pipeline (each
//! partition's calls reach its node in order, so a task named twice is cancelled once), then
//! one hint update per partition changed, instead of a round trip per task.

use belfry_core::{QueueName, TaskId, UnixMs};
use belfry_store::{ChangeOutcome, Store};

use crate::conn::Result;
use crate::each::ScriptCall;
use crate::keys::split_id;
use crate::scripts;
use crate::store::{Part, RedisStore};
use crate::tasks::change_reply;

impl RedisStore {
    pub(crate) fn cancel_tasks(
        &self,
        queue: &QueueName,
        ids: &[TaskId],
        now_ms: UnixMs,
    ) -> Result<Vec<ChangeOutcome>> {
        // With replicas to wait for, each write is waited for on the connection that made it.
        if ids.len() < 2 || self.waits_for_replicas() {
            return ids
                .iter()
                .map(|&id| self.cancel(queue, id, now_ms))
                .collect();
        }
        self.with_queue(queue, |this, c, uid| {
            let mut outcomes = vec![ChangeOutcome::NotFound; ids.len()];
            // (index in `ids`, partition, script arguments) of each id of this queue.
            let mut calls: Vec<(usize, Part, Vec<Vec<u8>>)> = Vec::with_capacity(ids.len());
            for (i, &id) in ids.iter().enumerate() {
                if let Some((p, seq)) = split_id(id, uid, this.keys.partitions) {
                    let args = this.change_args("cancel", &seq, 0, now_ms);
                    calls.push((i, this.part(p, uid), args));
                }
            }
            let each: Vec<ScriptCall<'_>> = calls
                .iter()
                .map(|(_, part, args)| (part.keys.as_slice(), args.as_slice()))
                .collect();
            let replies = this.scripts_pipelined(c, &scripts::CHANGE, &each, "cancel tasks")?;
            let mut earliest: Vec<(u16, i64)> = Vec::new();
            for ((i, part, _), reply) in calls.iter().zip(&replies) {
                let (outcome, at) = change_reply(reply)?;
                if outcome == ChangeOutcome::Ok {
                    match earliest.iter_mut().find(|(p, _)| *p == part.p) {
                        Some((_, known)) => *known = at,
                        None => earliest.push((part.p, at)),
                    }
                }
                outcomes[*i] = outcome;
            }
            this.hints_lower(c, queue, uid, &earliest)?;
            Ok(outcomes)
        })
    }
}
