//! A streamed body cut into lines as its chunks arrive (NDJSON), each line bounded in length.
//! A line that lies whole within a chunk is handed out as a slice of that chunk, without a
//! copy; only a line that spans chunks is gathered, and never past the bound: the bytes of an
//! over-long line are dropped as they come, and reading picks up again after its newline.
//!
//! Lines are numbered from 1; a blank line has its number too. A `\r` before the newline is
//! not part of the line, nor is a UTF-8 byte order mark at the start of the body.

/// The UTF-8 byte order mark, as Windows editors start a text file with.
const UTF8_BOM: &[u8] = &[0xEF, 0xBB, 0xBF];

/// One line of the body.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A whole line, without its line ending.
    Text { number: u64, bytes: &'a [u8] },
    /// A line longer than the bound: its bytes were not kept.
    Overlong { number: u64 },
}

pub struct LineSplitter {
    /// Most bytes a line may hold (its line ending not counted).
    max: usize,
    /// The start of a line that the chunks so far did not end.
    partial: Vec<u8>,
    /// The number of the line being read (1-based).
    number: u64,
    /// The line being read is over `max`: its bytes are dropped until its newline.
    overlong: bool,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max,
            partial: Vec::new(),
            number: 1,
            overlong: false,
        }
    }

    /// The number of the line being read: after the body's end, one past its last line.
    pub fn line(&self) -> u64 {
        self.number
    }

    /// Hands each line that `chunk` ends to `each`, and keeps the start of the one it does
    /// not end (up to the bound).
    pub fn feed(&mut self, mut chunk: &[u8], mut each: impl FnMut(Line<'_>)) {
        while let Some(at) = chunk.iter().position(|&b| b == b'\n') {
            let (head, rest) = (&chunk[..at], &chunk[at + 1..]);
            if self.partial.is_empty() && !self.overlong {
                self.emit(head, &mut each);
            } else {
                self.keep(head);
                let gathered = std::mem::take(&mut self.partial);
                self.emit(&gathered, &mut each);
                // The buffer is reused for the next line that spans chunks.
                self.partial = gathered;
                self.partial.clear();
            }
            chunk = rest;
        }
        self.keep(chunk);
    }

    /// Ends the body: a last line without a newline is a line.
    pub fn finish(&mut self, mut each: impl FnMut(Line<'_>)) {
        if !self.partial.is_empty() || self.overlong {
            let gathered = std::mem::take(&mut self.partial);
            self.emit(&gathered, &mut each);
        }
    }

    /// Adds bytes to the line being gathered, or drops them once it is over the bound.
    fn keep(&mut self, bytes: &[u8]) {
        if self.overlong {
            return;
        }
        if self.partial.len() + bytes.len() > self.max + 1 {
            // One byte over is allowed while gathering: it may be the `\r` of a `\r\n`.
            self.overlong = true;
            self.partial = Vec::new();
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    fn emit(&mut self, line: &[u8], each: &mut impl FnMut(Line<'_>)) {
        let number = self.number;
        self.number += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // The mark is looked for in the whole first line, so that chunks that split it do
        // not matter.
        let line = match number {
            1 => line.strip_prefix(UTF8_BOM).unwrap_or(line),
            _ => line,
        };
        if std::mem::take(&mut self.overlong) || line.len() > self.max {
            each(Line::Overlong { number });
        } else {
            each(Line::Text {
                number,
                bytes: line,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of `body` fed in pieces of `step` bytes: `Ok(text)` or `Err(number)` when
    /// over-long, with each line's number.
    fn split(body: &[u8], step: usize, max: usize) -> Vec<(u64, Result<String, ()>)> {
        let mut splitter = LineSplitter::new(max);
        let mut lines = Vec::new();
        let mut take = |line: Line<'_>| {
            lines.push(match line {
                Line::Text { number, bytes } => {
                    (number, Ok(String::from_utf8_lossy(bytes).into_owned()))
                }
                Line::Overlong { number } => (number, Err(())),
            })
        };
        for piece in body.chunks(step.max(1)) {
            splitter.feed(piece, &mut take);
        }
        splitter.finish(&mut take);
        lines
    }

    fn text(number: u64, line: &str) -> (u64, Result<String, ()>) {
        (number, Ok(line.to_owned()))
    }

    #[test]
    fn lines_in_any_chunking() {
        let body = b"\xEF\xBB\xBFab\r\n\ncdef\nxxxxxxxxxxxx\r\ngh";
        for step in [1, 2, 3, 5, 7, 100] {
            assert_eq!(
                split(body, step, 6),
                vec![
                    text(1, "ab"),
                    text(2, ""),
                    text(3, "cdef"),
                    (4, Err(())),
                    text(5, "gh"),
                ],
                "step {step}"
            );
        }
    }

    #[test]
    fn the_bound_counts_the_line_not_its_ending() {
        for step in [1, 2, 4, 100] {
            let lines = split(b"abcd\r\nabcde\nabcd", step, 4);
            assert_eq!(
                lines,
                vec![text(1, "abcd"), (2, Err(())), text(3, "abcd")],
                "step {step}"
            );
        }
    }

    #[test]
    fn an_overlong_line_is_not_held() {
        let mut splitter = LineSplitter::new(10);
        let mut seen = Vec::new();
        splitter.feed(b"a\n", |l| seen.push(format!("{l:?}")));
        for _ in 0..1_000 {
            splitter.feed(&[b'x'; 4096], |l| seen.push(format!("{l:?}")));
            assert!(splitter.partial.capacity() <= 4096 + 11);
        }
        splitter.feed(b"\nb", |l| seen.push(format!("{l:?}")));
        splitter.finish(|l| seen.push(format!("{l:?}")));
        assert_eq!(seen.len(), 3);
        assert!(seen[1].contains("Overlong { number: 2 }"), "{seen:?}");
        assert_eq!(splitter.line(), 4);
    }

    #[test]
    fn an_empty_body_has_no_lines() {
        assert!(split(b"", 1, 4).is_empty());
        assert_eq!(split(b"\n", 1, 4), vec![text(1, "")]);
    }
}
