//! Queue names.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::limits::QUEUE_NAME_LEN_MAX;

/// A validated queue name: 1 to 128 characters of `[A-Za-z0-9_.-]`.
///
/// Shared, not copied: every task carries its queue's name, so a clone is a reference-count
/// increment rather than an allocation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueName(Arc<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("queue names are 1 to {QUEUE_NAME_LEN_MAX} characters of A-Z, a-z, 0-9, '_', '.' and '-', not \".\" or \"..\"; got {got:?}")]
pub struct InvalidQueueName {
    pub got: String,
}

impl QueueName {
    /// Validates `name`; the one allocation is the shared name itself (a `&str` from a
    /// request path is not first copied into a `String`).
    pub fn new(name: impl AsRef<str>) -> Result<Self, InvalidQueueName> {
        let name = name.as_ref();
        let valid = !name.is_empty()
            && name.len() <= QUEUE_NAME_LEN_MAX
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        // "." and ".." are refused: a URL path cannot name them, and queue names become file
        // names.
        if valid && !crate::limits::is_dot_segment(name) {
            Ok(QueueName(Arc::from(name)))
        } else {
            Err(InvalidQueueName {
                got: name.chars().take(QUEUE_NAME_LEN_MAX + 8).collect(),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for QueueName {
    type Err = InvalidQueueName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        QueueName::new(s)
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QueueName({:?})", self.0)
    }
}

impl AsRef<str> for QueueName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names() {
        let check = |name: &str, ok: bool| assert_eq!(QueueName::new(name).is_ok(), ok, "{name:?}");
        check("orders", true);
        check("a.b-c_D9", true);
        check(&"x".repeat(128), true);
        check(&"x".repeat(129), false);
        check("", false);
        check(".", false);
        check("..", false);
        check("a/b", false);
        check("a b", false);
        check("ü", false);
    }
}
