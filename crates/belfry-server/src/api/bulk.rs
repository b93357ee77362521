//! Bulk subscriber bodies, parsed as they stream in: NDJSON (one id a line: a JSON string, a
//! number, or bare text) or one JSON array of strings and numbers. Nothing holds the whole
//! body: the parser keeps at most one id's bytes between chunks.
//!
//! Items are numbered from 1: lines for NDJSON, elements for an array. A bad item is reported
//! by its number and skipped; the others still count.

use belfry_core::limits::USER_ID_LEN_MAX;
use belfry_core::UserId;

/// Most bytes one item may span before it is refused (an id, its quotes and escapes).
const ITEM_BYTES_MAX: usize = 8 * USER_ID_LEN_MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A user id, and its item number.
    User(UserId, u64),
    Bad {
        line: u64,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before the first byte that is not whitespace.
    Unknown,
    Lines,
    Array(ArrayState),
    /// After the array's `]`.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArrayState {
    /// After `[` or `,`: a value, or `]` right after `[`.
    Value,
    /// Inside a string; `escaped` after a backslash.
    String { escaped: bool },
    /// Inside a number or a bare word.
    Word,
    /// After a value: `,` or `]`.
    Separator,
    /// Skipping a value that is not a string or a number (nested arrays and objects).
    Skip {
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

pub struct BulkParser {
    mode: Mode,
    item: Vec<u8>,
    /// The current item's number (1-based).
    line: u64,
    /// The current item is over the length limit: its bytes are dropped.
    overlong: bool,
    /// Something other than whitespace followed the array.
    trailing: bool,
    /// The array element being read came after another without a comma: it is refused,
    /// whatever it holds.
    no_comma: bool,
    /// Bytes of a UTF-8 byte order mark skipped at the body's start (as Windows editors save
    /// text files): up to 3, and [`BOM_DONE`] once the first other byte came.
    bom: usize,
}

/// Why an array element that follows another without a comma is refused.
const MISSING_COMMA: &str =
    "no comma before this element (expected , or ] after the one before): it is not applied";

/// The UTF-8 byte order mark; not a part of the first id.
const UTF8_BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];
const BOM_DONE: usize = usize::MAX;

impl Default for BulkParser {
    fn default() -> Self {
        BulkParser {
            mode: Mode::Unknown,
            item: Vec::new(),
            line: 1,
            overlong: false,
            trailing: false,
            no_comma: false,
            bom: 0,
        }
    }
}

impl BulkParser {
    /// The number of the item being read (the last one, once the body ended).
    pub fn line(&self) -> u64 {
        self.line
    }

    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Item>) {
        for &byte in chunk {
            if self.bom != BOM_DONE {
                if self.bom < UTF8_BOM.len() && byte == UTF8_BOM[self.bom] {
                    self.bom += 1;
                    continue;
                }
                // Not a whole mark: the bytes taken for one are the first item's.
                let taken = if self.bom < UTF8_BOM.len() {
                    self.bom
                } else {
                    0
                };
                self.bom = BOM_DONE;
                self.feed(&UTF8_BOM[..taken], out);
            }
            match self.mode {
                Mode::Unknown => {
                    if byte.is_ascii_whitespace() {
                        if byte == b'\n' {
                            self.line += 1;
                        }
                        continue;
                    }
                    if byte == b'[' {
                        self.mode = Mode::Array(ArrayState::Value);
                    } else {
                        self.mode = Mode::Lines;
                        self.push_byte(byte);
                    }
                }
                Mode::Lines => {
                    if byte == b'\n' {
                        self.end_line(out);
                    } else {
                        self.push_byte(byte);
                    }
                }
                Mode::Array(state) => self.array_byte(state, byte, out),
                Mode::Done => self.trailing |= !byte.is_ascii_whitespace(),
            }
        }
    }

    /// Ends the body. `Err` says why it is incomplete (an array without its `]`, text after
    /// it); a last NDJSON line without a newline is complete.
    pub fn finish(&mut self, out: &mut Vec<Item>) -> Result<(), String> {
        match self.mode {
            Mode::Unknown => Ok(()),
            Mode::Lines => {
                if !self.item.is_empty() || self.overlong {
                    self.end_line(out);
                }
                Ok(())
            }
            Mode::Array(_) => Err(format!(
                "the body ended inside the JSON array, at element {}: it was cut off, or lacks its closing ]",
                self.line
            )),
            Mode::Done if self.trailing => Err("text follows the JSON array's closing ]".into()),
            Mode::Done => Ok(()),
        }
    }

    fn push_byte(&mut self, byte: u8) {
        if self.item.len() < ITEM_BYTES_MAX {
            self.item.push(byte);
        } else {
            self.overlong = true;
        }
    }

    fn end_line(&mut self, out: &mut Vec<Item>) {
        let raw = std::mem::take(&mut self.item);
        if self.overlong {
            out.push(self.bad(format!("longer than {ITEM_BYTES_MAX} bytes")));
        } else {
            match std::str::from_utf8(&raw) {
                Ok(text) if text.trim().is_empty() => {}
                Ok(text) => out.push(self.parse(text.trim(), true)),
                Err(e) => out.push(self.not_utf8(&e)),
            }
        }
        self.overlong = false;
        self.line += 1;
    }

    fn end_element(&mut self, out: &mut Vec<Item>) {
        let raw = std::mem::take(&mut self.item);
        let item = if std::mem::take(&mut self.no_comma) {
            self.bad(MISSING_COMMA.into())
        } else if self.overlong {
            self.bad(format!("longer than {ITEM_BYTES_MAX} bytes"))
        } else {
            match std::str::from_utf8(&raw) {
                Ok(text) => self.parse(text.trim(), false),
                Err(e) => self.not_utf8(&e),
            }
        };
        out.push(item);
        self.overlong = false;
    }

    /// An item whose bytes are not UTF-8 is refused, not read with replacement characters
    /// (which would subscribe a user nobody sent, and merge different ids into one).
    fn not_utf8(&self, error: &std::str::Utf8Error) -> Item {
        self.bad(format!(
            "not valid UTF-8 (byte {} of the id): user ids are UTF-8 text",
            error.valid_up_to() + 1
        ))
    }

    /// An id from a JSON string, a number (as written: `-3`, `1.5`), or (NDJSON only) bare
    /// text. Bare text never starts a JSON object or array: a line such as `{"user":1}` is a
    /// mistake to report, not an id to subscribe. In an array, an element must be JSON: `01`
    /// or `true` is refused.
    fn parse(&self, text: &str, bare_allowed: bool) -> Item {
        let id = if text.starts_with('"') {
            match serde_json::from_str::<String>(text) {
                Ok(id) => id,
                Err(e) => return self.bad(format!("not a JSON string: {e}")),
            }
        } else if bare_allowed && (text.starts_with('{') || text.starts_with('[')) {
            return self.bad(
                "a JSON object or array is not a user id: send one id a line, as \"alice\", 42 \
                 or alice"
                    .into(),
            );
        } else if bare_allowed || serde_json::from_str::<serde_json::Number>(text).is_ok() {
            text.to_owned()
        } else {
            return self.bad("expected a user id as a JSON string or a number".into());
        };
        match UserId::new(id) {
            Ok(user) => Item::User(user, self.line),
            Err(e) => self.bad(e.to_string()),
        }
    }

    fn bad(&self, message: String) -> Item {
        Item::Bad {
            line: self.line,
            message,
        }
    }

    /// One byte of a JSON array body: each state decides the next.
    fn array_byte(&mut self, state: ArrayState, byte: u8, out: &mut Vec<Item>) {
        self.mode = match state {
            ArrayState::Value => self.array_value(byte, out),
            ArrayState::String { escaped } => self.array_string(escaped, byte, out),
            ArrayState::Word => self.array_word(byte, out),
            ArrayState::Separator => self.array_separator(byte, out),
            ArrayState::Skip {
                depth,
                in_string,
                escaped,
            } => self.array_skip(depth, in_string, escaped, byte, out),
        };
    }

    /// After `[` or `,`: the first byte of a value.
    fn array_value(&mut self, byte: u8, out: &mut Vec<Item>) -> Mode {
        let next = match byte {
            b if b.is_ascii_whitespace() => ArrayState::Value,
            b']' => {
                // `[]` is an empty list; `[1,]` has a trailing comma.
                if self.line > 1 {
                    out.push(self.bad("a trailing comma before ]".into()));
                }
                return Mode::Done;
            }
            b'"' => {
                self.push_byte(byte);
                ArrayState::String { escaped: false }
            }
            b'[' | b'{' => ArrayState::Skip {
                depth: 1,
                in_string: false,
                escaped: false,
            },
            _ => {
                self.push_byte(byte);
                ArrayState::Word
            }
        };
        Mode::Array(next)
    }

    fn array_string(&mut self, escaped: bool, byte: u8, out: &mut Vec<Item>) -> Mode {
        self.push_byte(byte);
        Mode::Array(match byte {
            _ if escaped => ArrayState::String { escaped: false },
            b'\\' => ArrayState::String { escaped: true },
            b'"' => {
                self.end_element(out);
                ArrayState::Separator
            }
            _ => ArrayState::String { escaped: false },
        })
    }

    /// Inside a number or a bare word: it ends at a separator or whitespace.
    fn array_word(&mut self, byte: u8, out: &mut Vec<Item>) -> Mode {
        match byte {
            b',' | b']' => {
                self.end_element(out);
                self.separator(byte)
            }
            b if b.is_ascii_whitespace() => {
                self.end_element(out);
                Mode::Array(ArrayState::Separator)
            }
            _ => {
                self.push_byte(byte);
                Mode::Array(ArrayState::Word)
            }
        }
    }

    fn array_separator(&mut self, byte: u8, out: &mut Vec<Item>) -> Mode {
        match byte {
            b if b.is_ascii_whitespace() => Mode::Array(ArrayState::Separator),
            b',' | b']' => self.separator(byte),
            _ => {
                // Two values without a comma: this one is read to its end and refused (one
                // item, counted once), and the array goes on.
                self.line += 1;
                self.no_comma = true;
                self.array_value(byte, out)
            }
        }
    }

    /// Skipping a nested array or object, strings inside it included, to its end.
    fn array_skip(
        &mut self,
        depth: u32,
        in_string: bool,
        escaped: bool,
        byte: u8,
        out: &mut Vec<Item>,
    ) -> Mode {
        let (depth, in_string, escaped) = match (in_string, escaped, byte) {
            (true, true, _) => (depth, true, false),
            (true, false, b'\\') => (depth, true, true),
            (true, false, b'"') => (depth, false, false),
            (true, false, _) => (depth, true, false),
            (false, _, b'"') => (depth, true, false),
            (false, _, b'[' | b'{') => (depth + 1, false, false),
            (false, _, b']' | b'}') => (depth - 1, false, false),
            _ => (depth, false, false),
        };
        if depth == 0 {
            let message = if std::mem::take(&mut self.no_comma) {
                MISSING_COMMA
            } else {
                "expected a user id as a JSON string or a number"
            };
            out.push(self.bad(message.into()));
            return Mode::Array(ArrayState::Separator);
        }
        Mode::Array(ArrayState::Skip {
            depth,
            in_string,
            escaped,
        })
    }

    /// A `,` starts the next element; a `]` ends the array.
    fn separator(&mut self, byte: u8) -> Mode {
        if byte == b']' {
            return Mode::Done;
        }
        self.line += 1;
        Mode::Array(ArrayState::Value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `body` fed in pieces of `step` bytes: users, bad item numbers, and the end.
    fn run(body: impl AsRef<[u8]>, step: usize) -> (Vec<String>, Vec<u64>, Result<(), String>) {
        let mut parser = BulkParser::default();
        let mut items = Vec::new();
        for piece in body.as_ref().chunks(step.max(1)) {
            parser.feed(piece, &mut items);
        }
        let end = parser.finish(&mut items);
        let mut users = Vec::new();
        let mut bad = Vec::new();
        for item in items {
            match item {
                Item::User(u, _) => users.push(u.to_string()),
                Item::Bad { line, .. } => bad.push(line),
            }
        }
        (users, bad, end)
    }

    #[test]
    fn ndjson_lines_in_any_chunking() {
        let body = "\"alice\"\n42\nbob smith\n\n\"bad\\x\"\n\"\"\n7\n{\"user\":8}\n[9]\nx{y}";
        for step in [1, 2, 3, 7, 100] {
            let (users, bad, end) = run(body, step);
            assert_eq!(
                users,
                vec!["alice", "42", "bob smith", "7", "x{y}"],
                "step {step}"
            );
            assert_eq!(bad, vec![5, 6, 8, 9], "step {step}");
            assert_eq!(end, Ok(()));
        }
    }

    #[test]
    fn json_arrays_in_any_chunking() {
        let body = r#" [ "a", 12 ,{"x":[1,"]"]}, "b\"c", true, "" , 9 ] "#;
        for step in [1, 2, 5, 100] {
            let (users, bad, end) = run(body, step);
            assert_eq!(users, vec!["a", "12", "b\"c", "9"], "step {step}");
            assert_eq!(bad, vec![3, 5, 6], "step {step}");
            assert_eq!(end, Ok(()));
        }
        assert_eq!(run("[]", 1).0, Vec::<String>::new());
        assert_eq!(run("[]", 1).2, Ok(()));
        assert_eq!(run("[1,]", 1).1, vec![2]);
        // Any JSON number is an id as written; what is not JSON is refused.
        let (users, bad, _) = run("[-3, 1.5, 01, null, 7]", 2);
        assert_eq!(users, vec!["-3", "1.5", "7"]);
        assert_eq!(bad, vec![3, 4]);
    }

    #[test]
    fn a_cut_array_says_where_it_stopped() {
        let (users, _, end) = run(r#"["a","b","c"#, 4);
        assert_eq!(users, vec!["a", "b"]);
        assert!(end.unwrap_err().contains("element 3"));
        assert!(run(r#"["a"] x"#, 3).2.is_err());
    }

    #[test]
    fn an_overlong_item_is_refused_without_holding_it() {
        let body = format!("a\n{}\nb\n", "x".repeat(100_000));
        let (users, bad, _) = run(&body, 4096);
        assert_eq!(users, vec!["a", "b"]);
        assert_eq!(bad, vec![2]);
    }

    /// Bytes that are not UTF-8 are refused by item, not read with replacement characters
    /// (`\xff` and `\xfe` would both have become one user, U+FFFD).
    #[test]
    fn an_element_without_its_comma_is_refused_once_and_not_applied() {
        for step in 1..5 {
            let (users, bad, end) = run(r#"["a1" "b1" "c1"]"#, step);
            assert_eq!((users, bad, end), (vec!["a1".into()], vec![2, 3], Ok(())));
            let (users, bad, _) = run(r#"["a" x, "b"]"#, step);
            assert_eq!((users, bad), (vec!["a".into(), "b".into()], vec![2]));
            let (users, bad, _) = run(r#"["a" ["x", "y"], 7]"#, step);
            assert_eq!((users, bad), (vec!["a".into(), "7".into()], vec![2]));
        }
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_id() {
        for body in ["\u{feff}a\nb\n", "\u{feff}[\"a\", \"b\"]"] {
            for step in 1..4 {
                let (users, bad, end) = run(body, step);
                assert_eq!(
                    (users, bad, end),
                    (vec!["a".into(), "b".into()], vec![], Ok(()))
                );
            }
        }
        // Only at the start: further in, it is an id's text.
        let (users, _, _) = run("a\n\u{feff}b\n", 1);
        assert_eq!(users, vec!["a".to_string(), "\u{feff}b".to_string()]);
        // A cut mark is not one: its bytes stay, and the line is not UTF-8.
        let (users, bad, _) = run(b"\xEF\xBBa\nb\n", 1);
        assert_eq!((users, bad), (vec!["b".to_string()], vec![1]));
    }

    #[test]
    fn ids_that_are_not_utf8_are_refused() {
        for step in [1, 3, 100] {
            let (users, bad, end) = run(b"\xff\nok\n\xfe\nx\xc0\x80\n", step);
            assert_eq!(
                (users, bad, end),
                (vec!["ok".to_owned()], vec![1, 3, 4], Ok(()))
            );
            let (users, bad, _) = run(b"[\"\xff\", \"ok\", 7]", step);
            assert_eq!(
                (users, bad),
                (vec!["ok".to_owned(), "7".to_owned()], vec![1])
            );
        }
    }
}
