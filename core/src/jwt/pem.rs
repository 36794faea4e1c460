//! PEM and DER: a public key in a PEM block (SubjectPublicKeyInfo or
//! PKCS#1), and what else a file that must not become a secret may be.

use super::error::{key_err, KeyError};
use super::keys::{new_key, Key, Material};
use super::parse::{b64_decode_strict, trim_ascii};

/// PEM's base64: whitespace ignored, padding allowed at the end.
fn pem_base64(body: &[u8]) -> Option<Vec<u8>> {
    let mut clean: Vec<u8> = body.iter().copied().filter(|c| !c.is_ascii_whitespace()).collect();
    while clean.last() == Some(&b'=') {
        clean.pop();
    }
    b64_decode_strict(&clean, false)
}

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// The first PEM block: its label and its bytes.
pub(super) fn pem_block(text: &[u8]) -> Result<(String, Vec<u8>), KeyError> {
    let text = std::str::from_utf8(text).or_else(|_| key_err("a PEM file that is not text"))?;
    let begin = text
        .find("-----BEGIN ")
        .ok_or_else(|| KeyError("no PEM block".into()))?;
    let after = &text[begin + 11..];
    let label_end = after
        .find("-----")
        .ok_or_else(|| KeyError("a broken PEM line".into()))?;
    let label = after[..label_end].to_owned();
    let body = &after[label_end + 5..];
    let end_marker = format!("-----END {label}-----");
    let end = body
        .find(&end_marker)
        .ok_or_else(|| KeyError(format!("no \"{end_marker}\" line")))?;
    let der = pem_base64(&body.as_bytes()[..end]).ok_or_else(|| KeyError("the PEM block is not base64".into()))?;
    Ok((label, der))
}

/// What a file that is neither a PEM key nor a JSON document at its start
/// may still be: a public key in another form (a PEM block after other
/// text or a byte order mark, JSON after a byte order mark or in an array,
/// an OpenSSH public key, DER), which must not become an HMAC secret.
pub(super) fn looks_like_a_key(file: &[u8]) -> Option<&'static str> {
    let text = file.strip_prefix(b"\xef\xbb\xbf").unwrap_or(file);
    let text = trim_ascii(text);
    if file.windows(10).any(|w| w == b"-----BEGIN") {
        return Some("a PEM block");
    }
    if text.starts_with(b"{") || text.starts_with(b"[") {
        return Some("a JSON document");
    }
    for prefix in [&b"ssh-"[..], b"ecdsa-sha2-", b"sk-ssh-", b"sk-ecdsa-"] {
        if text.starts_with(prefix) {
            return Some("an OpenSSH public key");
        }
    }
    if is_der_sequence(file) {
        return Some("a DER key");
    }
    None
}

/// A DER SEQUENCE whose length covers the whole file exactly.
fn is_der_sequence(file: &[u8]) -> bool {
    let [0x30, first, rest @ ..] = file else {
        return false;
    };
    let (len, body) = if *first < 0x80 {
        (usize::from(*first), rest)
    } else {
        let n = usize::from(*first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return false;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    len == body.len()
}

pub(super) fn load_pem(text: &[u8]) -> Result<Key, KeyError> {
    let (label, der) = pem_block(text)?;
    let material = match label.as_str() {
        "PUBLIC KEY" => spki(&der)?,
        "RSA PUBLIC KEY" => rsa_pkcs1(&der)?,
        "PRIVATE KEY" | "RSA PRIVATE KEY" | "EC PRIVATE KEY" | "ENCRYPTED PRIVATE KEY" => {
            return key_err(format!(
                "the PEM block is a private key (\"{label}\"); give the public key (openssl pkey -pubout)"
            ))
        }
        other => return key_err(format!("a PEM block \"{other}\" is not a public key")),
    };
    new_key(None, material)
}

/// A DER reader over one level of TLV items.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn item(&mut self, tag: u8) -> Result<&'a [u8], KeyError> {
        let bad = || KeyError("the key's DER is malformed".into());
        let [t, l, rest @ ..] = self.0 else { return Err(bad()) };
        if *t != tag {
            return Err(bad());
        }
        let (len, rest) = if *l < 0x80 {
            (usize::from(*l), rest)
        } else {
            let n = usize::from(*l & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return Err(bad());
            }
            let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | usize::from(b));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return Err(bad());
        }
        self.0 = &rest[len..];
        Ok(&rest[..len])
    }

    fn done(&self) -> bool {
        self.0.is_empty()
    }
}

/// An unsigned big-endian integer without its leading zero bytes.
fn der_uint(v: &[u8]) -> Result<Vec<u8>, KeyError> {
    if v.is_empty() || v[0] & 0x80 != 0 {
        return key_err("the key holds a negative or empty integer");
    }
    let start = v.iter().position(|&b| b != 0).unwrap_or(v.len());
    Ok(v[start..].to_vec())
}

/// SubjectPublicKeyInfo (RFC 5280): RSA, EC P-256/P-384, Ed25519.
pub(super) fn spki(der: &[u8]) -> Result<Material, KeyError> {
    let mut outer = Der(der);
    let mut seq = Der(outer.item(0x30)?);
    let mut alg = Der(seq.item(0x30)?);
    let oid = alg.item(0x06)?;
    let bits = seq.item(0x03)?;
    let [0, key @ ..] = bits else {
        return key_err("the key's bit string is malformed");
    };
    if oid == OID_RSA {
        rsa_pkcs1(key)
    } else if oid == OID_EC {
        let curve = alg.item(0x06)?;
        let (len, p256) = if curve == OID_P256 {
            (65, true)
        } else if curve == OID_P384 {
            (97, false)
        } else {
            return key_err("an EC key of a curve other than P-256 and P-384");
        };
        if key.len() != len || key[0] != 4 {
            return key_err("an EC key that is not an uncompressed point");
        }
        Ok(if p256 {
            Material::P256(key.to_vec())
        } else {
            Material::P384(key.to_vec())
        })
    } else if oid == OID_ED25519 {
        if key.len() != 32 {
            return key_err("an Ed25519 key that is not 32 bytes");
        }
        Ok(Material::Ed25519(key.to_vec()))
    } else {
        key_err("a public key of an unknown algorithm (RSA, EC P-256/P-384 and Ed25519 are known)")
    }
}

/// RSAPublicKey (RFC 8017): modulus and exponent.
fn rsa_pkcs1(der: &[u8]) -> Result<Material, KeyError> {
    let mut outer = Der(der);
    let mut seq = Der(outer.item(0x30)?);
    let n = der_uint(seq.item(0x02)?)?;
    let e = der_uint(seq.item(0x02)?)?;
    if !seq.done() {
        return key_err("the RSA key's DER is malformed");
    }
    rsa_material(n, e)
}

pub(super) fn rsa_material(n: Vec<u8>, e: Vec<u8>) -> Result<Material, KeyError> {
    if n.is_empty() {
        return key_err("an RSA key with a modulus of zero");
    }
    let bits = n.len() * 8 - n.first().map_or(8, |b| b.leading_zeros() as usize);
    if !(2048..=8192).contains(&bits) {
        return key_err(format!("an RSA key of {bits} bits (2048 to 8192 are accepted)"));
    }
    if e.is_empty() || e.len() > 4 {
        return key_err("an RSA key with an unusual exponent");
    }
    // An exponent below 3, or even, signs nothing: no token would verify.
    let exp = e.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b));
    if exp < 3 || exp % 2 == 0 {
        return key_err(format!(
            "an RSA key with the exponent {exp}, which cannot verify signatures"
        ));
    }
    Ok(Material::Rsa { n, e })
}
