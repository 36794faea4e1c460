//! Why a token or a key file is refused.

use super::MAX_TOKEN;

/// Why a token is refused (each gives 401).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    /// Not three base64url parts, or too long.
    Malformed,
    /// A part that is not base64url.
    Encoding,
    /// The header is not a JSON object with a string `alg` (or has `crit`).
    Header,
    /// An algorithm no key of the set allows (`none` included).
    Algorithm(String),
    /// A `kid` the set does not hold.
    UnknownKid(String),
    Signature,
    /// Longer than MAX_TOKEN.
    TooLong,
    /// The claims are not a JSON object (or nest too deep to read).
    ClaimsJson,
    /// `exp` or `nbf` is not a number.
    Claims,
    /// A claim (name or value) holds `\u0000`.
    ClaimsNul,
    Expired,
    NotYetValid,
}

impl std::fmt::Display for JwtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JwtError::Malformed => write!(f, "the token is not three base64url parts"),
            JwtError::Encoding => write!(f, "a part of the token is not base64url"),
            JwtError::Header => write!(f, "the token's header is not a JSON object with a string \"alg\""),
            JwtError::Algorithm(a) => write!(f, "the algorithm \"{a}\" is not allowed by the key"),
            JwtError::UnknownKid(k) => write!(f, "no key has the kid \"{k}\""),
            JwtError::Signature => write!(f, "the signature does not verify"),
            JwtError::TooLong => write!(f, "the token is longer than {MAX_TOKEN} bytes"),
            JwtError::ClaimsJson => write!(
                f,
                "the token's claims are not a JSON object (or nest deeper than 127 levels)"
            ),
            JwtError::Claims => write!(f, "the token's \"exp\" or \"nbf\" is not a number"),
            JwtError::ClaimsNul => write!(
                f,
                "the token's claims hold \\u0000, which PostgreSQL's text cannot hold"
            ),
            JwtError::Expired => write!(f, "the token has expired"),
            JwtError::NotYetValid => write!(f, "the token is not valid yet (nbf)"),
        }
    }
}

/// Why a key file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub(super) fn key_err<T>(msg: impl Into<String>) -> Result<T, KeyError> {
    Err(KeyError(msg.into()))
}
