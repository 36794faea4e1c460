//! The key set of one `sqldb_jwt_key` file: a JWK Set or a JWK, a PEM
//! public key, or an HMAC secret.

use super::error::{key_err, KeyError};
use super::jwk::load_jwk_document;
use super::keys::{new_key, Key, Material};
use super::parse::trim_ascii;
use super::pem::{load_pem, looks_like_a_key};
use super::Alg;

/// The keys of one `sqldb_jwt_key` file.
#[derive(Debug, Clone)]
pub struct KeySet {
    pub(super) keys: Vec<Key>,
    /// A JWKS (or JWK) document: a token's `kid` chooses among its keys.
    pub(super) by_kid: bool,
}

impl KeySet {
    /// Reads a key file: a JWK Set or a single JWK (JSON), a PEM public key
    /// (`PUBLIC KEY`, `RSA PUBLIC KEY`), or else an HMAC secret (the file's
    /// bytes, one trailing line end removed). `alg`: the only algorithm
    /// allowed, which must fit the key.
    pub fn load(file: &[u8], alg: Option<Alg>) -> Result<KeySet, KeyError> {
        let trimmed = trim_ascii(file);
        let (keys, by_kid) = if trimmed.starts_with(b"{") {
            (load_jwk_document(trimmed)?, true)
        } else if trimmed.starts_with(b"-----BEGIN") {
            if trimmed.windows(10).filter(|w| *w == b"-----BEGIN").count() > 1 {
                // One would be used, the others silently not.
                return key_err("the file holds more than one PEM block: give one key per file, or a JWK Set");
            }
            (vec![load_pem(trimmed)?], false)
        } else {
            let secret = file
                .strip_suffix(b"\r\n")
                .or_else(|| file.strip_suffix(b"\n"))
                .unwrap_or(file);
            if secret.is_empty() {
                return key_err("the file is empty");
            }
            if let Some(what) = looks_like_a_key(file) {
                // Taken as a secret, a public key would let anyone who has
                // it sign tokens.
                return key_err(format!(
                    "the file looks like {what}, in a form not read here: give a PEM public key, a JWK or a JWK Set (an HMAC secret must not look like a key)"
                ));
            }
            (vec![new_key(None, Material::hmac(secret))?], false)
        };
        let mut out = Vec::new();
        for mut k in keys {
            if let Some(a) = alg {
                if !k.algs.contains(&a) {
                    if by_kid {
                        // Keys of other kinds in a JWKS are left out.
                        continue;
                    }
                    return key_err(format!(
                        "alg={} does not fit the key, {} (it fits {})",
                        a.name(),
                        k.material.kind(),
                        alg_list(&k.algs)
                    ));
                }
                k.algs = vec![a];
            }
            out.push(k);
        }
        if out.is_empty() {
            return match alg {
                Some(a) => key_err(format!("no key of the set fits alg={}", a.name())),
                None => key_err("the set has no signature key"),
            };
        }
        Ok(KeySet { keys: out, by_kid })
    }

    /// The algorithms of the set's keys (for messages).
    pub fn describe(&self) -> String {
        let mut algs: Vec<Alg> = Vec::new();
        for k in &self.keys {
            for a in &k.algs {
                if !algs.contains(a) {
                    algs.push(*a);
                }
            }
        }
        format!("{} key(s), {}", self.keys.len(), alg_list(&algs))
    }
}

fn alg_list(algs: &[Alg]) -> String {
    algs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
}
