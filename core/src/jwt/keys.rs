//! Keys: the public part of one key, whose kind decides the algorithms it
//! verifies.

use ring::{hmac, signature};

use super::error::{key_err, KeyError};
use super::Alg;

/// The public part of one key.
#[derive(Clone)]
pub(super) enum Material {
    /// An HMAC secret (one key per hash, made once).
    Hmac { len: usize, keys: Box<[hmac::Key; 3]> },
    /// An RSA public key: modulus and exponent, big-endian without sign byte.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// An uncompressed P-256 point (0x04 || x || y).
    P256(Vec<u8>),
    /// An uncompressed P-384 point.
    P384(Vec<u8>),
    /// An Ed25519 public key (32 bytes).
    Ed25519(Vec<u8>),
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.write_str(self.kind())
    }
}

impl Material {
    pub(super) fn hmac(secret: &[u8]) -> Material {
        Material::Hmac {
            len: secret.len(),
            keys: Box::new([
                hmac::Key::new(hmac::HMAC_SHA256, secret),
                hmac::Key::new(hmac::HMAC_SHA384, secret),
                hmac::Key::new(hmac::HMAC_SHA512, secret),
            ]),
        }
    }

    pub(super) fn kind(&self) -> &'static str {
        match self {
            Material::Hmac { .. } => "an HMAC secret",
            Material::Rsa { .. } => "an RSA public key",
            Material::P256(_) => "a P-256 public key",
            Material::P384(_) => "a P-384 public key",
            Material::Ed25519(_) => "an Ed25519 public key",
        }
    }

    /// The algorithms this kind of key can verify.
    fn fits(&self, alg: Alg) -> bool {
        match self {
            // RFC 7518 3.2: a key of at least the hash's size.
            Material::Hmac { len, .. } => match alg {
                Alg::HS256 => *len >= 32,
                Alg::HS384 => *len >= 48,
                Alg::HS512 => *len >= 64,
                _ => false,
            },
            Material::Rsa { .. } => matches!(alg, Alg::RS256 | Alg::RS384 | Alg::RS512),
            Material::P256(_) => alg == Alg::ES256,
            Material::P384(_) => alg == Alg::ES384,
            Material::Ed25519(_) => alg == Alg::EdDSA,
        }
    }

    pub(super) fn verify(&self, alg: Alg, message: &[u8], sig: &[u8]) -> bool {
        if !self.fits(alg) {
            return false;
        }
        match self {
            Material::Hmac { keys, .. } => {
                let key = match alg {
                    Alg::HS256 => &keys[0],
                    Alg::HS384 => &keys[1],
                    _ => &keys[2],
                };
                // Constant time.
                hmac::verify(key, message, sig).is_ok()
            }
            Material::Rsa { n, e } => {
                let params = match alg {
                    Alg::RS256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Alg::RS384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    _ => &signature::RSA_PKCS1_2048_8192_SHA512,
                };
                signature::RsaPublicKeyComponents { n, e }
                    .verify(params, message, sig)
                    .is_ok()
            }
            Material::P256(point) => signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, sig)
                .is_ok(),
            Material::P384(point) => signature::UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                .verify(message, sig)
                .is_ok(),
            Material::Ed25519(k) => signature::UnparsedPublicKey::new(&signature::ED25519, k)
                .verify(message, sig)
                .is_ok(),
        }
    }
}

/// One verification key.
#[derive(Debug, Clone)]
pub(super) struct Key {
    pub(super) kid: Option<String>,
    pub(super) material: Material,
    /// The algorithms it verifies (never empty).
    pub(super) algs: Vec<Alg>,
}

/// A key whose kind verifies at least one algorithm.
pub(super) fn new_key(kid: Option<String>, material: Material) -> Result<Key, KeyError> {
    let algs: Vec<Alg> = Alg::ALL.into_iter().filter(|&a| material.fits(a)).collect();
    if algs.is_empty() {
        return key_err(format!(
            "{} of {} bytes is too short (HS256 needs at least 32 bytes)",
            material.kind(),
            match &material {
                Material::Hmac { len, .. } => *len,
                _ => 0,
            }
        ));
    }
    Ok(Key { kid, material, algs })
}
