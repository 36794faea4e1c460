//! JWK (RFC 7517): one key, or a JWK Set.

use serde_json::Value;

use super::error::{key_err, KeyError};
use super::keys::{new_key, Key, Material};
use super::parse::{b64url_decode, printable};
use super::pem::rsa_material;
use super::Alg;

pub(super) fn load_jwk_document(text: &[u8]) -> Result<Vec<Key>, KeyError> {
    let doc: Value = serde_json::from_slice(text).or_else(|e| key_err(format!("the JSON does not parse: {e}")))?;
    let list: Vec<&Value> = match doc.get("keys") {
        Some(Value::Array(keys)) => keys.iter().collect(),
        Some(_) => return key_err("\"keys\" is not an array"),
        None => vec![&doc],
    };
    let mut keys = Vec::new();
    for (i, jwk) in list.into_iter().enumerate() {
        if let Some(k) = jwk_key(jwk).map_err(|e| KeyError(format!("key {} of the set: {e}", i + 1)))? {
            keys.push(k);
        }
    }
    Ok(keys)
}

/// One JWK (RFC 7517): None for a key of encryption (`"use": "enc"`).
fn jwk_key(jwk: &Value) -> Result<Option<Key>, KeyError> {
    let Some(obj) = jwk.as_object() else {
        return key_err("not a JSON object");
    };
    let text = |name: &str| -> Result<Option<&str>, KeyError> {
        match obj.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => key_err(format!("\"{name}\" is not a string")),
        }
    };
    let bytes = |name: &str| -> Result<Vec<u8>, KeyError> {
        let v = text(name)?.ok_or_else(|| KeyError(format!("no \"{name}\"")))?;
        b64url_decode(v.as_bytes()).ok_or_else(|| KeyError(format!("\"{name}\" is not base64url")))
    };
    if text("use")? == Some("enc") {
        return Ok(None);
    }
    let material = match text("kty")? {
        Some("oct") => Material::hmac(&bytes("k")?),
        Some("RSA") => rsa_material(der_uint_unsigned(bytes("n")?), der_uint_unsigned(bytes("e")?))?,
        Some("EC") => {
            let (x, y) = (bytes("x")?, bytes("y")?);
            let (size, p256) = match text("crv")? {
                Some("P-256") => (32, true),
                Some("P-384") => (48, false),
                Some(other) => {
                    return key_err(format!(
                        "an EC key of curve \"{}\" (P-256 and P-384 are known)",
                        printable(other)
                    ))
                }
                None => return key_err("an EC key without \"crv\""),
            };
            if x.len() != size || y.len() != size {
                return key_err("the EC key's coordinates have the wrong size");
            }
            let mut point = vec![4u8];
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            if p256 {
                Material::P256(point)
            } else {
                Material::P384(point)
            }
        }
        Some("OKP") => {
            if text("crv")? != Some("Ed25519") {
                return key_err("an OKP key of a curve other than Ed25519");
            }
            let x = bytes("x")?;
            if x.len() != 32 {
                return key_err("an Ed25519 key that is not 32 bytes");
            }
            Material::Ed25519(x)
        }
        Some(other) => {
            return key_err(format!(
                "a key type \"{}\" (oct, RSA, EC and OKP are known)",
                printable(other)
            ))
        }
        None => return key_err("no \"kty\""),
    };
    let mut key = new_key(text("kid")?.map(str::to_owned), material)?;
    if let Some(a) = text("alg")? {
        let a = Alg::parse(a).ok_or_else(|| KeyError(format!("an unknown \"alg\" \"{}\"", printable(a))))?;
        if !key.algs.contains(&a) {
            return key_err(format!("\"alg\" \"{}\" does not fit {}", a.name(), key.material.kind()));
        }
        key.algs = vec![a];
    }
    Ok(Some(key))
}

fn der_uint_unsigned(v: Vec<u8>) -> Vec<u8> {
    let start = v.iter().position(|&b| b != 0).unwrap_or(v.len());
    v[start..].to_vec()
}
