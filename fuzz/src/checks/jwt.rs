//! `jwt::KeySet::verify`, the bearer-token parser, on arbitrary tokens.
//!
//! What must hold, for a key set of one 32-byte HMAC secret (HS256 only):
//! any bytes as a token are refused or accepted without a panic, and an
//! accepted one is three base64url parts whose header says HS256 and whose
//! signature is the HMAC of the first two; a token signed here with the
//! secret from a generated header and claims is accepted exactly when the
//! model says (alg HS256, claims a JSON object, `exp` and `nbf` numbers
//! within the leeway); a valid token with one byte changed is refused;
//! base64url decodes only what it would encode back to the same text; key
//! files of any bytes (bare, in PEM armour, as JWK fields) load or are
//! refused without a panic.

use crate::source::Source;
use gateway_core::jwt::{b64url_decode, b64url_encode, bearer_token, KeySet};
use ring::hmac;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const NOW: i64 = 1_800_000_000;

fn sign(header: &str, claims: &[u8]) -> String {
    let msg = format!("{}.{}", b64url_encode(header.as_bytes()), b64url_encode(claims));
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, SECRET), msg.as_bytes());
    format!("{msg}.{}", b64url_encode(tag.as_ref()))
}

pub fn jwt_token(data: &[u8]) {
    let keys = KeySet::load(SECRET, None).expect("a 32-byte secret");
    let mut src = Source::new(data);
    let leeway = src.below(100) as i64;
    match src.below(4) {
        // Any bytes as a token (and as an Authorization header).
        0 => {
            let token = src.rest();
            let _ = bearer_token(token);
            if let Ok(claims) = keys.verify(token, NOW, leeway) {
                let text = std::str::from_utf8(token).expect("an accepted token is ASCII");
                let parts: Vec<&str> = text.split('.').collect();
                assert_eq!(parts.len(), 3);
                let header = b64url_decode(parts[0].as_bytes()).expect("header base64url");
                let header: serde_json::Value = serde_json::from_slice(&header).expect("header JSON");
                assert_eq!(header["alg"], "HS256");
                let msg = format!("{}.{}", parts[0], parts[1]);
                let sig = b64url_decode(parts[2].as_bytes()).expect("signature base64url");
                let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET);
                assert!(hmac::verify(&key, msg.as_bytes(), &sig).is_ok());
                let _ = claims.json();
            }
        }
        // A signed token from generated parts, against the model.
        1 => {
            let alg = src.pick(&["HS256", "HS384", "HS512", "RS256", "ES256", "none", "hs256", ""]);
            let header = match src.below(3) {
                0 => format!(r#"{{"alg":"{alg}"}}"#),
                1 => format!(r#"{{"typ":"JWT","alg":"{alg}","kid":"k"}}"#),
                _ => String::from_utf8_lossy(src.bytes(24)).into_owned(),
            };
            let exp = src.bool().then(|| NOW - 200 + src.below(400) as i64);
            let nbf = src.bool().then(|| NOW - 200 + src.below(400) as i64);
            let claims = if src.bool() {
                let mut fields = vec![format!(r#""sub":"{}""#, src.below(1000))];
                fields.extend(exp.map(|e| format!(r#""exp":{e}"#)));
                fields.extend(nbf.map(|n| format!(r#""nbf":{n}"#)));
                format!("{{{}}}", fields.join(",")).into_bytes()
            } else {
                src.bytes(48).to_vec()
            };
            let token = sign(&header, &claims);
            let got = keys.verify(token.as_bytes(), NOW, leeway);
            let header_ok = serde_json::from_str::<serde_json::Value>(&header)
                .ok()
                .filter(|h| h.is_object() && h.get("crit").is_none())
                .and_then(|h| h.get("alg").cloned())
                .is_some_and(|a| a == "HS256");
            let claims_v = serde_json::from_slice::<serde_json::Value>(&claims).ok();
            let generated = claims_v.as_ref().is_some_and(|c| c.get("sub").is_some());
            if !header_ok || !claims_v.as_ref().is_some_and(|c| c.is_object()) {
                assert!(got.is_err(), "accepted {header} / {claims:?}");
            } else if generated {
                let live = exp.is_none_or(|e| NOW < e + leeway) && nbf.is_none_or(|n| NOW + leeway >= n);
                assert_eq!(got.is_ok(), live, "{header} {}", String::from_utf8_lossy(&claims));
                // One byte changed anywhere: refused.
                let mut bytes = token.into_bytes();
                let at = src.below(bytes.len());
                let new = src.byte();
                if bytes[at] != new {
                    bytes[at] = new;
                    assert!(
                        keys.verify(&bytes, NOW, leeway).is_err(),
                        "a changed token was accepted"
                    );
                }
            }
        }
        // Key files of any bytes, and PEM and JWK shapes around them: a
        // key set or an error, never a panic; a set loaded verifies
        // nothing that is not a token.
        2 => {
            let body = src.rest();
            let files = [
                body.to_vec(),
                [b"-----BEGIN PUBLIC KEY-----\n".as_slice(), body, b"\n-----END PUBLIC KEY-----\n"].concat(),
                [b"-----BEGIN RSA PUBLIC KEY-----\n".as_slice(), body, b"\n-----END RSA PUBLIC KEY-----\n"].concat(),
                format!(
                    r#"{{"keys":[{{"kty":"RSA","n":"{0}","e":"{0}"}},{{"kty":"EC","crv":"P-256","x":"{0}","y":"{0}"}},{{"kty":"OKP","crv":"Ed25519","x":"{0}"}}]}}"#,
                    b64url_encode(body)
                )
                .into_bytes(),
            ];
            for f in files {
                if let Ok(set) = KeySet::load(&f, None) {
                    let _ = set.describe();
                    assert!(set.verify(b"not a token", NOW, 0).is_err());
                }
            }
        }
        // base64url: decoding is the inverse of encoding, one text per bytes.
        _ => {
            let text = src.rest();
            if let Some(bytes) = b64url_decode(text) {
                assert_eq!(b64url_encode(&bytes).as_bytes(), text);
            }
            assert_eq!(b64url_decode(b64url_encode(text).as_bytes()).as_deref(), Some(text));
        }
    }
}
