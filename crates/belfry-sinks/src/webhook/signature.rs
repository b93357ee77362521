//! Webhook signatures, each a `scheme=<hex HMAC-SHA256>` entry under the queue's secret, in
//! a header of its own:
//!
//! - `Belfry-Signature: v1=<hex>` signs `"{timestamp}.{body}"` (the scheme since the start,
//!   its header unchanged, so receivers written for it go on working);
//! - `Belfry-Signature-V2: v2=<hex>` signs `"{task_id}.{timestamp}.{body}"`, with the task id
//!   exactly as the `Belfry-Task-Id` header carries it (32 lower-case hex digits).
//!
//! The timestamp (unix seconds, also sent as `Belfry-Timestamp`) is inside both signed texts
//! so a receiver can refuse replays of old requests. `v2` also authenticates the task id, the
//! receiver's de-duplication key: under `v1` alone a captured request could be replayed
//! within the receiver's freshness window with a new `Belfry-Task-Id`, and de-duplication
//! would not catch it. New receivers should check `v2` and require it. The verifiers find
//! their entry in a comma-separated list, so a receiver may also hand them both headers
//! joined, as a proxy that merges header lines would.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The scheme prefixes of the entries of the signature header value.
pub const SIGNATURE_PREFIX: &str = "v1=";
pub const SIGNATURE_V2_PREFIX: &str = "v2=";

/// A MAC keyed once with the secret, cloned for each request so the key schedule is not redone.
pub(crate) fn keyed(secret: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length (long keys are hashed first), so this cannot fail; the
    // `expect` documents an impossibility, it does not check input.
    HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length")
}

/// The MAC of `parts` joined by `.`, from a MAC already keyed.
fn mac_of(mac: &HmacSha256, parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = mac.clone();
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            mac.update(b".");
        }
        mac.update(part);
    }
    mac
}

fn push_entry(value: &mut String, prefix: &str, mac: HmacSha256) {
    value.push_str(prefix);
    value.push_str(&hex::encode(mac.finalize().into_bytes()));
}

/// The two signature headers' values of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signatures {
    /// `Belfry-Signature`: `v1=<hex HMAC-SHA256(secret, "{timestamp}.{body}")>`.
    pub v1: String,
    /// `Belfry-Signature-V2`: `v2=<hex HMAC-SHA256(secret, "{task_id}.{timestamp}.{body}")>`.
    pub v2: String,
}

/// The signatures of a body of task `task_id` sent at `timestamp`, from a MAC already keyed.
pub(crate) fn sign_with(
    mac: &HmacSha256,
    task_id: &str,
    timestamp: &str,
    body: &[u8],
) -> Signatures {
    let entry = |prefix: &str, mac: HmacSha256| {
        let mut value = String::with_capacity(prefix.len() + 64);
        push_entry(&mut value, prefix, mac);
        value
    };
    Signatures {
        v1: entry(SIGNATURE_PREFIX, mac_of(mac, &[timestamp.as_bytes(), body])),
        v2: entry(
            SIGNATURE_V2_PREFIX,
            mac_of(mac, &[task_id.as_bytes(), timestamp.as_bytes(), body]),
        ),
    }
}

/// The `Belfry-Signature` and `Belfry-Signature-V2` header values of a request.
pub fn sign(secret: &[u8], task_id: &str, timestamp: &str, body: &[u8]) -> Signatures {
    sign_with(&keyed(secret), task_id, timestamp, body)
}

/// The entries of `scheme` (e.g. `v2=`) in a signature header value, as hex. Entries are
/// separated by commas, optionally followed by spaces (as a proxy that joins repeated header
/// lines writes them); a queue whose secret is being rotated sends one `v2` entry per secret.
fn entries<'a>(header: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    header
        .split(',')
        .map(str::trim)
        .filter_map(move |entry| entry.strip_prefix(prefix))
}

/// Whether any `prefix` entry of `header` is `mac`'s (each compared in constant time).
fn verify_entry(mac: HmacSha256, header: &str, prefix: &str) -> bool {
    entries(header, prefix).any(|hex_digest| {
        hex::decode(hex_digest).is_ok_and(|expected| mac.clone().verify_slice(&expected).is_ok())
    })
}

/// Checks the `v1` entry of a `Belfry-Signature` header value, in constant time, for
/// receivers (and tests). It does not authenticate the task id: prefer
/// [`verify_signature_v2`]. Checking the timestamp's age is the receiver's choice and is not
/// done here.
pub fn verify_signature(secret: &[u8], timestamp: &str, body: &[u8], header: &str) -> bool {
    let mac = mac_of(&keyed(secret), &[timestamp.as_bytes(), body]);
    verify_entry(mac, header, SIGNATURE_PREFIX)
}

/// Checks the `v2` entry of a `Belfry-Signature-V2` header value, in constant time: the body,
/// the timestamp and the task id (`Belfry-Task-Id`) are what the secret's holder sent. A value
/// without a `v2` entry fails (a forger could otherwise drop the header and keep `v1`).
pub fn verify_signature_v2(
    secret: &[u8],
    task_id: &str,
    timestamp: &str,
    body: &[u8],
    header: &str,
) -> bool {
    let mac = mac_of(
        &keyed(secret),
        &[task_id.as_bytes(), timestamp.as_bytes(), body],
    );
    verify_entry(mac, header, SIGNATURE_V2_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0011223344556677";

    /// Expected values computed independently with Python's `hmac` module, e.g.
    /// `hmac.new(b"whsec_test", b'1700000000.{"hello":"world"}', hashlib.sha256).hexdigest()`
    /// for v1, and the same with `ID + "."` in front for v2.
    #[test]
    fn known_vectors() {
        let check = |secret: &[u8], id: &str, timestamp: &str, body: &[u8], v1: &str, v2: &str| {
            let signed = sign(secret, id, timestamp, body);
            assert_eq!(
                (signed.v1.as_str(), signed.v2.as_str()),
                (&*format!("v1={v1}"), &*format!("v2={v2}"))
            );
            assert!(verify_signature(secret, timestamp, body, &signed.v1));
            assert!(verify_signature_v2(secret, id, timestamp, body, &signed.v2));
        };
        check(
            b"whsec_test",
            ID,
            "1700000000",
            br#"{"hello":"world"}"#,
            "f592bbf3951cfc94e560eecfb5d9dd4da6b0fff2e626235f8ab4b54860925d0b",
            "d2c8480d941f62fa5cb9dcb73cc0f848ec7845e88c80d95004472899d8ccb7de",
        );
        check(
            b"key",
            "00000000000000000000000000000001",
            "1",
            b"",
            "53123bc365c2fe4bee48bc5cc6cd6c19699147d43513154ed34277c7c063e80f",
            "fefadb8100e5b2b370767de165b3cb8329128a9de14c5ca8e2798a2bfa814fd9",
        );
        // A key longer than the SHA-256 block (hashed first) and a binary body: v1 only.
        let long = sign(&[b'k'; 100], ID, "42", &[0, 255, 10]);
        assert_eq!(
            long.v1,
            "v1=2a929cdd12ab6620fe4dc8412b9085b586326d6da5b170edafcdc86397ada9e1"
        );
    }

    #[test]
    fn verify_refuses_tampering() {
        let signed = sign(b"secret", ID, "100", b"body");
        let good = signed.v2.clone();
        assert!(verify_signature(b"secret", "100", b"body", &signed.v1));
        assert!(verify_signature_v2(b"secret", ID, "100", b"body", &good));
        let check_bad = |secret: &[u8], id: &str, timestamp: &str, body: &[u8], header: &str| {
            assert!(
                !verify_signature_v2(secret, id, timestamp, body, header),
                "v2 accepted {header:?} for {id:?} at {timestamp:?}"
            );
        };
        for (secret, timestamp, body) in [
            (&b"other"[..], "100", &b"body"[..]),
            (b"secret", "101", b"body"),
            (b"secret", "100", b"Body"),
        ] {
            check_bad(secret, ID, timestamp, body, &good);
            assert!(!verify_signature(secret, timestamp, body, &signed.v1));
        }
        check_bad(b"secret", ID, "100", b"body", &good.replace("v2=", ""));
        check_bad(b"secret", ID, "100", b"body", "v2=zz");
        check_bad(b"secret", ID, "100", b"body", "v2=");
        check_bad(b"secret", ID, "100", b"body", &good[..good.len() - 2]);
        // The v1 header handed in for v2 has no v2 entry: refused.
        check_bad(b"secret", ID, "100", b"body", &signed.v1);
        // Another task id: v1 still verifies (it never covered the id), v2 does not.
        let other_id = "ffffffffffffffffffffffffffffffff";
        assert!(verify_signature(b"secret", "100", b"body", &signed.v1));
        check_bad(b"secret", other_id, "100", b"body", &good);
        // The schemes are not interchangeable.
        let swapped = good.replace("v2=", "v1=");
        assert!(!verify_signature(b"secret", "100", b"body", &swapped));
    }

    #[test]
    fn entries_are_found_in_any_order_and_after_a_comma_and_space() {
        let signed = sign(b"secret", ID, "100", b"body");
        let (v1, v2) = (&signed.v1, &signed.v2);
        for header in [
            format!("{v2},{v1}"),
            format!("{v1}, {v2}"),
            format!("v9=00,{v2}"),
        ] {
            assert!(
                verify_signature_v2(b"secret", ID, "100", b"body", &header),
                "{header}"
            );
        }
        assert!(verify_signature(
            b"secret",
            "100",
            b"body",
            &format!("{v2}, {v1}")
        ));
    }
}
