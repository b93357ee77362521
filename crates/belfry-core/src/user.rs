//! User ids: who subscribes to a reminder.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::limits::USER_ID_LEN_MAX;

/// A validated user id: 1 to [`USER_ID_LEN_MAX`] bytes of UTF-8 without control characters,
/// not `.` or `..` ([`crate::limits::is_dot_segment`]).
/// The id is opaque to belfry; a canonical decimal number (`"0"`, `"42"`, no sign, no leading
/// zero, at most `u64::MAX`) is stored as 8 bytes, anything else as its bytes.
///
/// Ids order as their stored keys do: numbers first, by value, then other ids bytewise.
/// Subscriber lists and fan-out chunks follow that order.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserId(Box<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "user ids are 1 to {USER_ID_LEN_MAX} bytes of UTF-8 without control characters, not \".\" or \"..\" (a URL path cannot name them); got {got:?}"
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
        if !is_valid(id) {
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
        canonical_number(self.as_str())
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
        let mut text = String::new();
        decode_into(key, &mut text).then(|| UserId(text.into()))
    }
}

fn is_valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= USER_ID_LEN_MAX
        && !id.chars().any(char::is_control)
        && !crate::limits::is_dot_segment(id)
}

/// `s` as a number, if it is a canonical decimal `u64`.
fn canonical_number(s: &str) -> Option<u64> {
    let canonical = s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical {
        s.parse().ok()
    } else {
        None
    }
}

/// Appends the id a stored key holds to `out`; `false`, with nothing appended, if the key is
/// not one [`UserId::encode_into`] writes.
fn decode_into(key: &[u8], out: &mut String) -> bool {
    match key.split_first() {
        Some((&KEY_NUMBER, rest)) => {
            let Ok(bytes) = <[u8; 8]>::try_from(rest) else {
                return false;
            };
            out.push_str(itoa::Buffer::new().format(u64::from_be_bytes(bytes)));
            true
        }
        Some((&KEY_TEXT, rest)) => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return false;
            };
            // A text key never holds what encodes as a number.
            if !is_valid(text) || canonical_number(text).is_some() {
                return false;
            }
            out.push_str(text);
            true
        }
        _ => false,
    }
}

/// Ids a page at a time in one buffer, instead of an allocation each: what a fan-out reads by
/// the thousand. Every id in it is valid (pushed as a [`UserId`], or decoded from a stored
/// key and checked).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct UserPage {
    text: String,
    /// Where each id's text ends in `text`.
    ends: Vec<usize>,
}

impl UserPage {
    /// A page with room for `ids` ids of `text_bytes` bytes in all.
    pub fn with_capacity(ids: usize, text_bytes: usize) -> Self {
        UserPage {
            text: String::with_capacity(text_bytes),
            ends: Vec::with_capacity(ids),
        }
    }

    pub fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of all the ids' text together.
    pub fn text_len(&self) -> usize {
        self.text.len()
    }

    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1],
        };
        Some(&self.text[start..end])
    }

    pub fn last(&self) -> Option<&str> {
        self.get(self.len().checked_sub(1)?)
    }

    /// The last id as a [`UserId`].
    pub fn last_id(&self) -> Option<UserId> {
        self.last().map(|id| UserId(id.into()))
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// Keeps the first `len` ids.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            self.ends.truncate(len);
            self.text.truncate(self.ends.last().copied().unwrap_or(0));
        }
    }

    pub fn push(&mut self, id: &UserId) {
        self.text.push_str(id.as_str());
        self.ends.push(self.text.len());
    }

    /// Appends the id of a key written by [`UserId::encode_into`]; `false`, with nothing
    /// appended, if the key is not one.
    pub fn push_key(&mut self, key: &[u8]) -> bool {
        let pushed = decode_into(key, &mut self.text);
        if pushed {
            self.ends.push(self.text.len());
        }
        pushed
    }
}

impl fmt::Debug for UserPage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
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
        // A URL path cannot name them.
        bad(".");
        bad("..");
        ok("...");
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

    #[test]
    fn a_page_holds_its_ids_in_order_and_refuses_bad_keys() {
        let mut page = UserPage::with_capacity(4, 16);
        assert!(page.is_empty());
        assert_eq!(page.last(), None);
        assert!(page.push_key(&UserId::new("42").unwrap().encode()));
        page.push(&UserId::new("alice").unwrap());
        assert!(!page.push_key(&[KEY_TEXT, b'7']));
        assert!(!page.push_key(&[KEY_NUMBER, 1]));
        assert!(page.push_key(&UserId::new("ユーザー").unwrap().encode()));
        assert_eq!(page.iter().collect::<Vec<_>>(), ["42", "alice", "ユーザー"]);
        assert_eq!(page.text_len(), "42aliceユーザー".len());
        assert_eq!(page.last_id(), Some(UserId::new("ユーザー").unwrap()));
        page.truncate(2);
        assert_eq!(page.iter().collect::<Vec<_>>(), ["42", "alice"]);
        assert_eq!(page.get(2), None);
        page.truncate(5);
        assert_eq!(page.len(), 2);
        page.clear();
        assert!(page.is_empty() && page.text_len() == 0);
    }

    fn any_id() -> impl Strategy<Value = UserId> {
        prop_oneof![
            any::<u64>().prop_map(|n| UserId::new(n.to_string()).unwrap()),
            "[a-z0-9@._-]{1,20}".prop_filter_map("not a dot segment", |s| UserId::new(s).ok()),
        ]
    }

    proptest! {
        #[test]
        fn keys_round_trip_and_order_as_ids(a in any_id(), b in any_id()) {
            prop_assert_eq!(UserId::decode(&a.encode()), Some(a.clone()));
            prop_assert_eq!(a.cmp(&b), a.encode().cmp(&b.encode()));
        }

        #[test]
        fn a_page_decodes_keys_as_decode_does(ids in proptest::collection::vec(any_id(), 0..20)) {
            let mut page = UserPage::default();
            for id in &ids {
                prop_assert!(page.push_key(&id.encode()));
            }
            prop_assert_eq!(page.iter().collect::<Vec<_>>(), ids.iter().map(UserId::as_str).collect::<Vec<_>>());
            prop_assert_eq!(page.last_id(), ids.last().cloned());
        }
    }
}
