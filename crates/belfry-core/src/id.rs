//! Task ids.
//!
//! A [`TaskId`] is 128 bits, opaque to users and chosen by the store that accepts the task:
//! the embedded engine encodes where the task lives so it can find it without an in-memory id
//! index. Its text form is 32 lowercase hex digits, which sorts like the number.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub u128);

impl TaskId {
    pub const fn from_u128(value: u128) -> Self {
        TaskId(value)
    }

    pub const fn as_u128(self) -> u128 {
        self.0
    }

    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        TaskId(u128::from_be_bytes(bytes))
    }

    /// The text form's 32 lowercase hex digits, without the formatting machinery: every
    /// delivery writes its task id into a header, which made `{:032x}` a few percent of a
    /// stream burst's CPU.
    pub fn hex(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, byte) in self.0.to_be_bytes().into_iter().enumerate() {
            out[2 * i] = DIGITS[usize::from(byte >> 4)];
            out[2 * i + 1] = DIGITS[usize::from(byte & 0x0f)];
        }
        out
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({self})")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a task id is 32 hexadecimal digits, got {got:?}")]
pub struct ParseTaskIdError {
    pub got: String,
}

impl FromStr for TaskId {
    type Err = ParseTaskIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || ParseTaskIdError {
            got: s.chars().take(64).collect(),
        };
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(error());
        }
        u128::from_str_radix(s, 16).map(TaskId).map_err(|_| error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn text_round_trips_and_sorts_like_the_number(a: u128, b: u128) {
            let (ta, tb) = (TaskId(a), TaskId(b));
            prop_assert_eq!(ta.to_string().parse::<TaskId>().unwrap(), ta);
            prop_assert_eq!(ta.to_string().cmp(&tb.to_string()), a.cmp(&b));
            prop_assert_eq!(TaskId::from_bytes(ta.to_bytes()), ta);
            prop_assert_eq!(ta.to_string(), format!("{a:032x}"));
        }
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "",
            "xyz",
            "0123",
            &"g".repeat(32),
            &"0".repeat(33),
            "+0000000000000000000000000000001",
        ] {
            assert!(bad.parse::<TaskId>().is_err(), "{bad:?} parsed");
        }
    }
}
