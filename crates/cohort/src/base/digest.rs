//! SHA-256 and HMAC-SHA256 as Cohort writes them: lower-case hex text.
//! One place for what the chain, the journal, erasure requests, peers and
//! the command handlers' signatures each need, so a digest is spelled the
//! same way everywhere.

use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

/// 64 zeros: the hash a chain's first link, or a journal's first entry,
/// points back to.
pub(crate) const ZERO_SHA256: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

/// The hex SHA-256 of `parts`, one after the other.
pub(crate) fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    hex::encode(h.finalize())
}

/// The hex HMAC-SHA256 under `key` of `parts`, one after the other.
pub(crate) fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // FIPS 180-2 "abc"; RFC 4231 test case 2.
        assert_eq!(
            sha256_hex(&[b"a", b"bc"]),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hmac_hex(b"Jefe", &[b"what do ya want ", b"for nothing?"]),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
