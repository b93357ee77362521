//! The streamed task import (`POST /v1/queues/{queue}/tasks:import`): NDJSON of tasks, sent as
//! it is read, never held whole by this client.
//!
//! ```no_run
//! # async fn demo(client: belfry_client::Client) -> Result<(), belfry_client::Error> {
//! use belfry_client::BulkBody;
//! let file = tokio::fs::File::open("tasks.ndjson").await.expect("the file opens");
//! let answer = client.import_tasks("emails", BulkBody::reader(file)).await?;
//! println!("{} created, {} duplicates, {} refused", answer.created, answer.duplicates, answer.refused);
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};

use crate::model::{ApiErrorBody, NewTask};
use crate::reminders::StreamedAnswer;
use crate::request::Request;
use crate::{BulkBody, Client, Error, Result};

/// A line of an import that was not a valid task, and why.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct ImportLineError {
    pub line: u64,
    pub error: ApiErrorBody,
}

/// The answer of a task import.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct ImportAnswer {
    /// Tasks stored.
    pub created: u64,
    /// Lines whose idempotency key named a live task (that task stands).
    pub duplicates: u64,
    /// Lines that are not valid tasks; the first hundred are in `errors`.
    pub refused: u64,
    #[serde(default)]
    pub errors: Vec<ImportLineError>,
    /// Whether the server read and applied the whole body. If not, everything before
    /// `stopped_at_line` was applied and nothing from it on: resend from that line.
    pub complete: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_line: Option<u64>,
    /// Why the import stopped, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiErrorBody>,
}

impl StreamedAnswer for ImportAnswer {
    fn stop_error(&self) -> Option<&ApiErrorBody> {
        self.error.as_ref()
    }
}

impl BulkBody {
    /// Tasks in memory, as NDJSON (for a handful; stream a file with [`BulkBody::reader`]).
    pub fn tasks(tasks: &[NewTask]) -> Self {
        let mut body = Vec::new();
        for task in tasks {
            // A task always serialises: its fields are strings, numbers and JSON values.
            serde_json::to_writer(&mut body, task).expect("a task is JSON");
            body.push(b'\n');
        }
        BulkBody::from(body)
    }
}

impl Client {
    /// Imports the tasks of `body` (NDJSON, one task a line), streamed. An import the server
    /// stopped part way (cut off, too large, a batch the store refused) is
    /// `Error::ImportIncomplete`, carrying the counts of what it applied and the line to resume
    /// from.
    pub async fn import_tasks(&self, queue: &str, body: BulkBody) -> Result<ImportAnswer> {
        let request = Request::import_tasks(queue);
        self.streamed(&request, body, |status, code, message, answer| {
            Error::ImportIncomplete {
                status,
                code,
                message,
                answer: Box::new(answer),
            }
        })
        .await
    }
}
