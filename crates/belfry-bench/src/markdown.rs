//! Rewriting one marked section of BENCHMARKS.md.
//!
//! The file holds one section per benchmark tool between `<!-- NAME:begin -->` and
//! `<!-- NAME:end -->`; this tool owns `server`. Inside it, each scenario keeps its own
//! sub-section (`server:ingest`, `server:fire`, ...), so running one scenario replaces only
//! its own results and leaves the others' in place. Nothing outside the markers is touched,
//! and writing the same body twice gives the same file.

use crate::error::BenchError;

/// The section of BENCHMARKS.md this tool owns.
pub const SERVER_SECTION: &str = "server";

/// What an unmeasured section says; dropped when the first sub-section is added.
const PLACEHOLDER: &str = "(not measured yet)";

fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    )
}

/// Byte range of the text strictly between the markers of section `name`.
fn section_range(doc: &str, name: &str) -> Result<std::ops::Range<usize>, BenchError> {
    let (begin, end) = markers(name);
    let missing = || BenchError::MissingMarkers {
        begin: begin.clone(),
        end: end.clone(),
    };
    let start = doc.find(&begin).ok_or_else(missing)? + begin.len();
    let stop = doc[start..].find(&end).ok_or_else(missing)? + start;
    Ok(start..stop)
}

/// Replaces the body of section `name` with `body` (surrounded by single newlines).
pub fn replace_section(doc: &str, name: &str, body: &str) -> Result<String, BenchError> {
    let range = section_range(doc, name)?;
    let mut out = String::with_capacity(doc.len() + body.len());
    out.push_str(&doc[..range.start]);
    out.push('\n');
    let body = body.trim_matches('\n');
    if !body.is_empty() {
        out.push_str(body);
        out.push('\n');
    }
    out.push_str(&doc[range.end..]);
    Ok(out)
}

/// Puts `body` into sub-section `outer:inner` inside section `outer`: replaces it when it
/// exists, otherwise appends it at the end of `outer` (dropping the placeholder text).
pub fn upsert_subsection(
    doc: &str,
    outer: &str,
    inner: &str,
    body: &str,
) -> Result<String, BenchError> {
    let range = section_range(doc, outer)?;
    let current = &doc[range.clone()];
    let inner_name = format!("{outer}:{inner}");
    let new_outer = if section_range(current, &inner_name).is_ok() {
        replace_section(current, &inner_name, body)?
    } else {
        let (begin, end) = markers(&inner_name);
        let kept = current.trim_matches('\n');
        let kept = if kept.trim() == PLACEHOLDER { "" } else { kept };
        let mut s = String::new();
        if !kept.is_empty() {
            s.push_str(kept);
            s.push_str("\n\n");
        }
        s.push_str(&begin);
        s.push('\n');
        s.push_str(body.trim_matches('\n'));
        s.push('\n');
        s.push_str(&end);
        s
    };
    replace_section(doc, outer, &new_outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Benchmarks\n\nintro\n\n<!-- engine:begin -->\nengine numbers\n<!-- engine:end -->\n\n## Server\n\n<!-- server:begin -->\n(not measured yet)\n<!-- server:end -->\n\ntrailer\n";

    #[test]
    fn replacing_touches_only_the_named_section() {
        let out = replace_section(DOC, "server", "new body").unwrap();
        assert!(out.contains("<!-- server:begin -->\nnew body\n<!-- server:end -->"));
        assert!(out.contains("engine numbers"));
        assert!(out.starts_with("# Benchmarks\n\nintro\n"));
        assert!(out.ends_with("<!-- server:end -->\n\ntrailer\n"));
        assert!(!out.contains("not measured"));
    }

    #[test]
    fn replacing_is_idempotent() {
        let once = replace_section(DOC, "server", "body\n\nmore").unwrap();
        let twice = replace_section(&once, "server", "body\n\nmore").unwrap();
        assert_eq!(once, twice);
    }

    #[test]
    fn missing_markers_are_an_error_not_an_append() {
        let err = replace_section("no markers here", "server", "x").unwrap_err();
        assert!(matches!(err, BenchError::MissingMarkers { .. }));
        let half = "<!-- server:begin -->\nno end";
        assert!(replace_section(half, "server", "x").is_err());
    }

    #[test]
    fn subsections_are_added_then_replaced_in_place() {
        let a = upsert_subsection(DOC, "server", "ingest", "ingest v1").unwrap();
        assert!(!a.contains("not measured"));
        let b = upsert_subsection(&a, "server", "fire", "fire v1").unwrap();
        let c = upsert_subsection(&b, "server", "ingest", "ingest v2").unwrap();
        assert!(c.contains("<!-- server:ingest:begin -->\ningest v2\n<!-- server:ingest:end -->"));
        assert!(c.contains("fire v1"));
        assert!(!c.contains("ingest v1"));
        // Ingest keeps its place before fire.
        assert!(c.find("ingest v2") < c.find("fire v1"));
        assert!(c.contains("engine numbers") && c.ends_with("trailer\n"));
        // Same input twice: same file.
        assert_eq!(
            upsert_subsection(&c, "server", "ingest", "ingest v2").unwrap(),
            c
        );
    }

    #[test]
    fn the_engine_section_is_never_changed() {
        let out = upsert_subsection(DOC, "server", "pending", "p").unwrap();
        let engine = |d: &str| d[section_range(d, "engine").unwrap()].to_string();
        assert_eq!(engine(&out), engine(DOC));
    }
}
