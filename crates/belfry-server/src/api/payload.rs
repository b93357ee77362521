//! A payload as the API takes it: a task's or schedule's `payload` (JSON, kept as the
//! producer's text) or `payload_base64` (bytes), bounded in size and, as JSON, in nesting
//! depth; a reminder's content gets the same depth bound.

use base64::Engine as _;
use belfry_core::PayloadKind;
use bytes::Bytes;
use serde_json::value::RawValue;

use super::error::{ApiError, ErrorCode};

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A task's or schedule's payload: `payload` (JSON text, kept as given) or `payload_base64`
/// (bytes), at most one, `null` when neither; at most `max` bytes and, as JSON, at most
/// `PAYLOAD_NESTING_MAX` levels deep.
pub fn payload_from(
    json: Option<&RawValue>,
    base64: Option<&str>,
    max: usize,
) -> Result<(Bytes, PayloadKind), ApiError> {
    let (payload, kind) = match (json, base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::new(
                ErrorCode::InvalidPayload,
                "give either payload (JSON) or payload_base64 (bytes), not both",
            ))
        }
        (Some(json), None) => {
            check_nesting("payload", json.get())?;
            (
                Bytes::copy_from_slice(json.get().as_bytes()),
                PayloadKind::Json,
            )
        }
        (None, Some(text)) => {
            // Base64 is 4/3 of the bytes: refuse oversized text before decoding it.
            if text.len() / 4 * 3 > max + 3 {
                return Err(too_large(max));
            }
            let bytes = BASE64.decode(text.as_bytes()).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidPayload,
                    format!("payload_base64 is not valid standard base64: {e}"),
                )
            })?;
            (Bytes::from(bytes), PayloadKind::Binary)
        }
        (None, None) => (Bytes::from_static(b"null"), PayloadKind::Json),
    };
    if payload.len() > max {
        return Err(too_large(max));
    }
    Ok((payload, kind))
}

/// Refuses JSON nested deeper than `PAYLOAD_NESTING_MAX` (a task's or schedule's payload, a
/// reminder's content: `field` names it in the message). It is kept as the producer's text
/// (never parsed into a tree), so this one scan is the only bound; it is iterative, so no
/// depth can exhaust the stack.
///
/// Depth never exceeds the number of `[` and `{` in the text (strings included), and that
/// count takes one vectorised pass, so a payload with no more of them than the limit (nearly
/// every real one) is let through without the byte-by-byte walk, which cost a quarter of the
/// server's CPU in batched ingest of 200-byte payloads.
pub fn check_nesting(field: &str, json: &str) -> Result<(), ApiError> {
    use belfry_core::limits::PAYLOAD_NESTING_MAX;
    // Counted in byte lanes, 64 bytes at a time (a lane cannot overflow), which the compiler
    // turns into wide compares: a `usize` sum per byte is not.
    let openers = json
        .as_bytes()
        .chunks(64)
        .map(|chunk| {
            let lanes = chunk
                .iter()
                .fold(0u8, |n, &b| n + u8::from(b == b'[' || b == b'{'));
            usize::from(lanes)
        })
        .sum::<usize>();
    if openers <= PAYLOAD_NESTING_MAX {
        return Ok(());
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for byte in json.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > PAYLOAD_NESTING_MAX {
                    return Err(ApiError::new(
                        ErrorCode::InvalidPayload,
                        format!(
                            "{field} is nested deeper than {PAYLOAD_NESTING_MAX} levels of arrays and objects (the recursion limit of common JSON parsers)"
                        ),
                    ));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn too_large(max: usize) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("the payload is larger than the limit of {max} bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_is_bounded_by_depth_not_by_the_count_of_brackets() {
        use belfry_core::limits::PAYLOAD_NESTING_MAX as MAX;
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        // Few brackets: the counting pass decides.
        assert!(check_nesting("payload", &nested(MAX)).is_ok());
        assert!(check_nesting("payload", r#"{"a": [1, {"b": "[{"}]}"#).is_ok());
        // Many brackets: the walk decides, by depth.
        let siblings = format!("[{}1]", "[],".repeat(3 * MAX));
        assert!(check_nesting("payload", &siblings).is_ok());
        let in_strings = format!(
            r#"{{"s": "{}", "t": "\"{}"}}"#,
            "[".repeat(MAX),
            "{".repeat(MAX)
        );
        assert!(check_nesting("payload", &in_strings).is_ok());
        assert!(check_nesting("payload", &nested(MAX + 1)).is_err());
        assert!(check_nesting(
            "payload",
            &format!("{}{}", "[],".repeat(MAX), nested(MAX + 1))
        )
        .is_err());
    }
}
