//! User ids: who subscribes to a reminder.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::limits::USER_ID_LEN_MAX;

/// A validated user id: 1 to [`USER_ID_LEN_MAX`] bytes of UTF-8 without control characters.
/// The id is opaque to belfry; a canonical decimal number (`"0"`, `"42"`, no sign, no leading
/// zero, at most `u64::MAX`) is stored as 8 bytes, anything else as its bytes.
///
/// Ids order as their stored keys do: numbers first, by value, then other ids bytewise.
/// Subscriber lists and fan-out chunks follow that order.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserId(Box<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "user ids are 1 to {USER_ID_LEN_MAX} bytes of UTF-8 without control characters; got {got:?}"
)]
pub struct InvalidUserId {
    pub got: String,
}

/// First byte of a stored key: which of the two encodings follows.
const KEY_NUMBER: u8 = 0;
const KEY_TEXT: u8 = 1;

impl UserId {
    pub fn new(id: impl AsRef<str>) -> Result<Self, InvalidUserId> {
        let id = id.as_ref();
        if id.is_empty() || id.len() > USER_ID_LEN_MAX || id.chars().any(char::is_control) {
            return Err(InvalidUserId {
                got: id.chars().take(USER_ID_LEN_MAX + 8).collect(),
            });
        }
        Ok(UserId(id.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as a number, if it is a canonical decimal `u64`.
    pub fn as_number(&self) -> Option<u64> {
        let s = self.as_str();
        let canonical = s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
        if canonical {
            s.parse().ok()
        } else {
            None
        }
    }

    /// Appends the stored key: `[0] + 8 bytes big-endian` for a number, `[1] + bytes`
    /// otherwise. Keys compare bytewise exactly as ids compare.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self.as_number() {
            Some(n) => {
                out.push(KEY_NUMBER);
                out.extend_from_slice(&n.to_be_bytes());
            }
            None => {
                out.push(KEY_TEXT);
                out.extend_from_slice(self.0.as_bytes());
            }
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1 + self.0.len().max(8));
        self.encode_into(&mut out);
        out
    }

    /// Reads a key written by [`UserId::encode_into`]; `None` if it is not one.
    pub fn decode(key: &[u8]) -> Option<UserId> {
        match key.split_first()? {
            (&KEY_NUMBER, rest) => {
                let n = u64::from_be_bytes(rest.try_into().ok()?);
                Some(UserId(n.to_string().into()))
            }
            (&KEY_TEXT, rest) => {
                let id = UserId::new(std::str::from_utf8(rest).ok()?).ok()?;
                // A text key never holds what encodes as a number.
                id.as_number().is_none().then_some(id)
            }
            _ => None,
        }
    }
}

impl Ord for UserId {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self.as_number(), other.as_number()) {
            (Some(a), Some(b)) => a.cmp(&b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => self.0.as_bytes().cmp(other.0.as_bytes()),
        }
    }
}

impl PartialOrd for UserId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for UserId {
    type Err = InvalidUserId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UserId::new(s)
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserId({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn validation() {
        let ok = |id: &str| assert!(UserId::new(id).is_ok(), "{id:?}");
        let bad = |id: &str| assert!(UserId::new(id).is_err(), "{id:?}");
        ok("1");
        ok("alice@example.com");
        ok("ユーザー");
        ok(&"x".repeat(USER_ID_LEN_MAX));
        bad("");
        bad(&"x".repeat(USER_ID_LEN_MAX + 1));
        bad("a\nb");
        bad("tab\there");
    }

    #[test]
    fn numbers_are_eight_bytes_and_only_canonical_ones() {
        assert_eq!(UserId::new("42").unwrap().encode().len(), 9);
        assert_eq!(
            UserId::new("18446744073709551615").unwrap().encode().len(),
            9
        );
        for text in ["042", "+1", "-1", "18446744073709551616", "1.0", "00"] {
            let id = UserId::new(text).unwrap();
            assert_eq!(id.as_number(), None, "{text}");
            assert_eq!(UserId::decode(&id.encode()), Some(id));
        }
    }

    #[test]
    fn decode_refuses_what_encode_never_writes() {
        assert_eq!(UserId::decode(&[]), None);
        assert_eq!(UserId::decode(&[2, b'a']), None);
        assert_eq!(UserId::decode(&[KEY_NUMBER, 1, 2]), None);
        assert_eq!(UserId::decode(&[KEY_TEXT]), None);
        assert_eq!(UserId::decode(&[KEY_TEXT, b'7']), None);
        assert_eq!(UserId::decode(&[KEY_TEXT, 0xff]), None);
    }

    fn any_id() -> impl Strategy<Value = UserId> {
        prop_oneof![
            any::<u64>().prop_map(|n| UserId::new(n.to_string()).unwrap()),
            "[a-z0-9@._-]{1,20}".prop_map(|s| UserId::new(s).unwrap()),
        ]
    }

    proptest! {
        #[test]
        fn keys_round_trip_and_order_as_ids(a in any_id(), b in any_id()) {
            prop_assert_eq!(UserId::decode(&a.encode()), Some(a.clone()));
            prop_assert_eq!(a.cmp(&b), a.encode().cmp(&b.encode()));
        }
    }
}
