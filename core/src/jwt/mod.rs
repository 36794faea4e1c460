//! JSON Web Tokens (RFC 7519) signed with JWS compact serialization (RFC
//! 7515): key loading (an HMAC secret, a PEM public key, a JWK or JWKS
//! document), token verification and claim look-ups, for `sqldb_jwt_key`.
//!
//! The key decides which algorithms a token may use: an HMAC secret only
//! HS256/384/512, an RSA key only RS256/384/512, a P-256 key only ES256, a
//! P-384 key only ES384, an Ed25519 key only EdDSA (narrowed further by
//! `alg=` of the directive or a JWK's `alg`). The token's `alg` only picks
//! among what its key allows; `none` is never accepted.

mod claims;
mod error;
mod jwk;
mod keys;
mod keyset;
mod parse;
mod pem;
mod verify;

pub use claims::{parse_claim_path, Claims};
pub use error::{JwtError, KeyError};
pub use keyset::KeySet;
pub use parse::{b64url_decode, b64url_encode, bearer_token};
pub use verify::{TokenCache, MAX_CACHED_TOKEN};

/// Longest token accepted (bytes of the compact form).
pub const MAX_TOKEN: usize = 16 * 1024;

/// A signature algorithm of JWS (RFC 7518, RFC 8037).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    ES256,
    ES384,
    EdDSA,
}

impl Alg {
    pub const ALL: [Alg; 9] = [
        Alg::HS256,
        Alg::HS384,
        Alg::HS512,
        Alg::RS256,
        Alg::RS384,
        Alg::RS512,
        Alg::ES256,
        Alg::ES384,
        Alg::EdDSA,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Alg::HS256 => "HS256",
            Alg::HS384 => "HS384",
            Alg::HS512 => "HS512",
            Alg::RS256 => "RS256",
            Alg::RS384 => "RS384",
            Alg::RS512 => "RS512",
            Alg::ES256 => "ES256",
            Alg::ES384 => "ES384",
            Alg::EdDSA => "EdDSA",
        }
    }

    /// The algorithm of a name, exactly as JWS spells it.
    pub fn parse(name: &str) -> Option<Alg> {
        Alg::ALL.into_iter().find(|a| a.name() == name)
    }
}

// Not under Miri: ring's primitives are assembly and C, which Miri cannot run.
#[cfg(all(test, not(miri)))]
use {
    keys::Material,
    pem::{pem_block, spki},
};
#[cfg(all(test, not(miri)))]
mod tests;
