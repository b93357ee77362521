//! Record encoding (stub).

/// Why a byte sequence is not a valid record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad record: {0}")]
pub struct DecodeError(pub String);

/// Decodes one framed record from the front of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<(), DecodeError> {
    let _ = bytes;
    Err(DecodeError("not implemented".into()))
}
