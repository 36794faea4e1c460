//! JSON Web Tokens (RFC 7519) signed with JWS compact serialization (RFC
//! 7515): key loading (an HMAC secret, a PEM public key, a JWK or JWKS
//! document), token verification and claim look-ups, for `sqldb_jwt_key`.
//!
//! The key decides which algorithms a token may use: an HMAC secret only
//! HS256/384/512, an RSA key only RS256/384/512, a P-256 key only ES256, a
//! P-384 key only ES384, an Ed25519 key only EdDSA (narrowed further by
//! `alg=` of the directive or a JWK's `alg`). The token's `alg` only picks
//! among what its key allows; `none` is never accepted.

use ring::{hmac, signature};
use serde_json::{Map, Value};

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

/// The public part of one key.
#[derive(Clone)]
enum Material {
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
    fn hmac(secret: &[u8]) -> Material {
        Material::Hmac {
            len: secret.len(),
            keys: Box::new([
                hmac::Key::new(hmac::HMAC_SHA256, secret),
                hmac::Key::new(hmac::HMAC_SHA384, secret),
                hmac::Key::new(hmac::HMAC_SHA512, secret),
            ]),
        }
    }

    fn kind(&self) -> &'static str {
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

    fn verify(&self, alg: Alg, message: &[u8], sig: &[u8]) -> bool {
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
struct Key {
    kid: Option<String>,
    material: Material,
    /// The algorithms it verifies (never empty).
    algs: Vec<Alg>,
}

/// Why a key file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError(pub String);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn key_err<T>(msg: impl Into<String>) -> Result<T, KeyError> {
    Err(KeyError(msg.into()))
}

/// The keys of one `sqldb_jwt_key` file.
#[derive(Debug, Clone)]
pub struct KeySet {
    keys: Vec<Key>,
    /// A JWKS (or JWK) document: a token's `kid` chooses among its keys.
    by_kid: bool,
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

fn alg_list(algs: &[Alg]) -> String {
    algs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
}

/// A key whose kind verifies at least one algorithm.
fn new_key(kid: Option<String>, material: Material) -> Result<Key, KeyError> {
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

/// A string anywhere in the value (a key or a value) holds a NUL.
fn holds_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(holds_nul),
        Value::Object(m) => map_holds_nul(m),
        _ => false,
    }
}

fn map_holds_nul(m: &Map<String, Value>) -> bool {
    m.iter().any(|(k, v)| k.contains('\0') || holds_nul(v))
}

/// Text of the token for a log line: printable ASCII, at most 64 bytes.
fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
        .collect()
}

/// The claims of a verified token.
#[derive(Debug, Clone)]
pub struct Claims {
    map: Map<String, Value>,
    /// The claims as the token carries them: the JSON text as signed, so
    /// that SQL reads exactly what the issuer wrote (numbers of any size,
    /// every key; PostgreSQL's `json` operators, like this module, take the
    /// last of duplicate keys).
    json: String,
    exp: Option<f64>,
    nbf: Option<f64>,
}

impl Claims {
    /// The claims as JSON text (for `request.jwt.claims`).
    pub fn json(&self) -> &str {
        &self.json
    }

    /// Valid at `now` with `leeway` seconds: `exp` not passed, `nbf` reached.
    pub fn check_time(&self, now: i64, leeway: i64) -> Result<(), JwtError> {
        let (now, leeway) = (now as f64, leeway as f64);
        if self.exp.is_some_and(|exp| now >= exp + leeway) {
            return Err(JwtError::Expired);
        }
        if self.nbf.is_some_and(|nbf| now + leeway < nbf) {
            return Err(JwtError::NotYetValid);
        }
        Ok(())
    }

    /// A claim by dotted path (`app.role`): a string as it is, another
    /// value as JSON text; None when missing or null.
    pub fn get_path(&self, path: &[String]) -> Option<String> {
        let (first, rest) = path.split_first()?;
        let mut v = self.map.get(first)?;
        for step in rest {
            v = v.as_object()?.get(step)?;
        }
        value_text(v)
    }

    /// A top-level claim as text (the `$sqldb_jwt_claim_NAME` variables).
    /// nginx writes variable names in lower case, so a name that is not a
    /// claim matches one in any letter case (the first in code-point
    /// order), as `$arg_NAME` matches an argument.
    pub fn get(&self, name: &str) -> Option<String> {
        let v = self.map.get(name).or_else(|| {
            self.map
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        })?;
        value_text(v)
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

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// `sqldb_jwt_role_claim`: a dotted path; every step a non-empty name.
pub fn parse_claim_path(text: &str) -> Option<Vec<String>> {
    let steps: Vec<String> = text.split('.').map(str::to_owned).collect();
    (!steps.iter().any(String::is_empty)).then_some(steps)
}

/// The bearer token of an `Authorization` header value (RFC 6750 2.1):
/// None when the scheme is not Bearer or the token is empty.
pub fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let header = trim_ascii(header);
    if header.len() < 7 || !header[..6].eq_ignore_ascii_case(b"bearer") || header[6] != b' ' {
        return None;
    }
    let token = trim_ascii(&header[7..]);
    (!token.is_empty()).then_some(token)
}

struct Parts<'a> {
    header: &'a [u8],
    payload: &'a [u8],
    signature: &'a [u8],
}

fn split_token(token: &[u8]) -> Result<Parts<'_>, JwtError> {
    if token.len() > MAX_TOKEN {
        return Err(JwtError::TooLong);
    }
    let mut it = token.split(|&b| b == b'.');
    let (Some(header), Some(payload), Some(signature), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(JwtError::Malformed);
    };
    if header.is_empty() || payload.is_empty() {
        return Err(JwtError::Malformed);
    }
    Ok(Parts {
        header,
        payload,
        signature,
    })
}

fn decode_object(part: &[u8], err: JwtError) -> Result<Map<String, Value>, JwtError> {
    let bytes = b64url_decode(part).ok_or(JwtError::Encoding)?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(err),
    }
}

fn trim_ascii(mut b: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = b {
        if first.is_ascii_whitespace() {
            b = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = b {
        if last.is_ascii_whitespace() {
            b = rest;
        } else {
            break;
        }
    }
    b
}

fn b64_value(c: u8, url: bool) -> Option<u8> {
    Some(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' if url => 62,
        b'_' if url => 63,
        b'+' if !url => 62,
        b'/' if !url => 63,
        _ => return None,
    })
}

/// base64 without padding or whitespace; `url`: the URL-safe alphabet.
/// Bits left over in the last character must be zero (one encoding only).
fn b64_decode_strict(input: &[u8], url: bool) -> Option<Vec<u8>> {
    if input.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(input.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0u32;
    for &c in input {
        acc = (acc << 6) | u32::from(b64_value(c, url)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    (acc == 0).then_some(out)
}

/// base64url as JWS uses it: no padding.
pub fn b64url_decode(input: &[u8]) -> Option<Vec<u8>> {
    b64_decode_strict(input, true)
}

/// base64url without padding.
pub fn b64url_encode(input: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// PEM's base64: whitespace ignored, padding allowed at the end.
fn pem_base64(body: &[u8]) -> Option<Vec<u8>> {
    let mut clean: Vec<u8> = body.iter().copied().filter(|c| !c.is_ascii_whitespace()).collect();
    while clean.last() == Some(&b'=') {
        clean.pop();
    }
    b64_decode_strict(&clean, false)
}

// --- PEM and DER ---------------------------------------------------------

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// The first PEM block: its label and its bytes.
fn pem_block(text: &[u8]) -> Result<(String, Vec<u8>), KeyError> {
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
fn looks_like_a_key(file: &[u8]) -> Option<&'static str> {
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

fn load_pem(text: &[u8]) -> Result<Key, KeyError> {
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
fn spki(der: &[u8]) -> Result<Material, KeyError> {
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

fn rsa_material(n: Vec<u8>, e: Vec<u8>) -> Result<Material, KeyError> {
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

// --- JWK -----------------------------------------------------------------

fn load_jwk_document(text: &[u8]) -> Result<Vec<Key>, KeyError> {
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

// Not under Miri: ring's primitives are assembly and C, which Miri cannot run.
#[cfg(all(test, not(miri)))]
mod tests;
