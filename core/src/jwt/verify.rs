//! Verification: a token's signature against a key set, its time claims,
//! and the tokens a worker has verified already.

use serde_json::Value;

use super::claims::{map_holds_nul, Claims};
use super::error::JwtError;
use super::keyset::KeySet;
use super::parse::{b64url_decode, decode_object, printable, split_token};
use super::Alg;

impl KeySet {
    /// Verifies a token at `now` (seconds since the epoch) with `leeway`
    /// seconds for `exp` and `nbf`: its claims, or why it is refused.
    pub fn verify(&self, token: &[u8], now: i64, leeway: i64) -> Result<Claims, JwtError> {
        let claims = self.verify_signature(token)?;
        claims.check_time(now, leeway)?;
        Ok(claims)
    }

    /// The token's signature verified and its claims read (`exp` and `nbf`
    /// numbers when present), not yet checked against the time.
    pub fn verify_signature(&self, token: &[u8]) -> Result<Claims, JwtError> {
        let parts = split_token(token)?;
        let header = decode_object(parts.header, JwtError::Header)?;
        let alg = match header.get("alg") {
            Some(Value::String(s)) => s.as_str(),
            _ => return Err(JwtError::Header),
        };
        let alg = Alg::parse(alg).ok_or_else(|| JwtError::Algorithm(printable(alg)))?;
        if header.contains_key("crit") {
            return Err(JwtError::Header);
        }
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => return Err(JwtError::Header),
        };
        let sig = b64url_decode(parts.signature).ok_or(JwtError::Encoding)?;
        let signed = &token[..parts.header.len() + 1 + parts.payload.len()];
        let mut candidates = self
            .keys
            .iter()
            .filter(|k| !self.by_kid || kid.is_none() || k.kid.as_deref() == kid)
            .filter(|k| k.algs.contains(&alg))
            .peekable();
        if candidates.peek().is_none() {
            return Err(
                if self.by_kid && kid.is_some() && !self.keys.iter().any(|k| k.kid.as_deref() == kid) {
                    JwtError::UnknownKid(printable(kid.unwrap_or_default()))
                } else {
                    JwtError::Algorithm(alg.name().to_owned())
                },
            );
        }
        if !candidates.any(|k| k.material.verify(alg, signed, &sig)) {
            return Err(JwtError::Signature);
        }
        let payload = b64url_decode(parts.payload).ok_or(JwtError::Encoding)?;
        let claims = match serde_json::from_slice::<Value>(&payload) {
            Ok(Value::Object(m)) => m,
            _ => return Err(JwtError::ClaimsJson),
        };
        // serde_json read it, so it is UTF-8 without a raw NUL.
        let json = String::from_utf8(payload).map_err(|_| JwtError::ClaimsJson)?;
        // An escaped NUL (\u0000) is valid JSON that PostgreSQL's text
        // cannot hold: every query reading that claim would fail.
        if map_holds_nul(&claims) {
            return Err(JwtError::ClaimsNul);
        }
        let time = |name: &str| -> Result<Option<f64>, JwtError> {
            match claims.get(name) {
                None => Ok(None),
                Some(Value::Number(n)) => n.as_f64().filter(|f| f.is_finite()).map(Some).ok_or(JwtError::Claims),
                Some(_) => Err(JwtError::Claims),
            }
        };
        let (exp, nbf) = (time("exp")?, time("nbf")?);
        Ok(Claims {
            map: claims,
            json,
            exp,
            nbf,
        })
    }
}

/// Tokens whose signature was verified, by their exact bytes (a worker's
/// own, per key set): a token seen again skips the signature check (an RSA
/// verification costs tens of microseconds), never the check of `exp` and
/// `nbf`. Bounded: when full it starts again empty.
#[derive(Debug)]
pub struct TokenCache {
    /// Keyed by tokens whose signature was checked: only the key's holder
    /// can make one, so no keyed (flooding-proof) hash is needed, and the
    /// word-at-a-time one costs a fraction of SipHash over a token.
    map: std::collections::HashMap<Vec<u8>, std::rc::Rc<Claims>, TokenHash>,
    capacity: usize,
}

type TokenHash = std::hash::BuildHasherDefault<crate::metrics::WordHash>;

/// Tokens longer than this are verified every time, not kept.
pub const MAX_CACHED_TOKEN: usize = 4096;

impl TokenCache {
    pub fn new(capacity: usize) -> TokenCache {
        TokenCache {
            map: std::collections::HashMap::default(),
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// `keys.verify`, with the signature checks of tokens seen before saved.
    pub fn verify(
        &mut self,
        keys: &KeySet,
        token: &[u8],
        now: i64,
        leeway: i64,
    ) -> Result<std::rc::Rc<Claims>, JwtError> {
        if let Some(c) = self.map.get(token) {
            c.check_time(now, leeway)?;
            return Ok(c.clone());
        }
        let claims = std::rc::Rc::new(keys.verify_signature(token)?);
        claims.check_time(now, leeway)?;
        if token.len() <= MAX_CACHED_TOKEN && self.capacity > 0 {
            if self.map.len() >= self.capacity {
                self.map.clear();
            }
            self.map.insert(token.to_vec(), claims.clone());
        }
        Ok(claims)
    }
}
