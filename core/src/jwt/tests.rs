use super::*;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, RsaKeyPair};
use ring::{hmac, signature};

const RSA_PRIV: &str = include_str!("testdata/rsa.pem");
const RSA_PUB: &str = include_str!("testdata/rsa.pub");
const RSA2_PUB: &str = include_str!("testdata/rsa2.pub");
const RSA_PKCS1: &str = include_str!("testdata/rsa.pkcs1");
const EC_PRIV: &str = include_str!("testdata/ec.pem");
const EC_PUB: &str = include_str!("testdata/ec.pub");
const EC384_PUB: &str = include_str!("testdata/ec384.pub");
const ED_PRIV: &str = include_str!("testdata/ed.pem");
const ED_PUB: &str = include_str!("testdata/ed.pub");
const RS256_OPENSSL: &str = include_str!("testdata/rs256-openssl.jwt");

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
const NOW: i64 = 1_800_000_000;

fn der_of(pem: &str) -> Vec<u8> {
    pem_block(pem.as_bytes()).expect("test PEM").1
}

fn unsigned(header: &str, claims: &str) -> String {
    format!(
        "{}.{}",
        b64url_encode(header.as_bytes()),
        b64url_encode(claims.as_bytes())
    )
}

fn hs(alg: Alg, secret: &[u8], header: &str, claims: &str) -> String {
    let algo = match alg {
        Alg::HS256 => hmac::HMAC_SHA256,
        Alg::HS384 => hmac::HMAC_SHA384,
        _ => hmac::HMAC_SHA512,
    };
    let msg = unsigned(header, claims);
    let tag = hmac::sign(&hmac::Key::new(algo, secret), msg.as_bytes());
    format!("{msg}.{}", b64url_encode(tag.as_ref()))
}

fn hs256(claims: &str) -> String {
    hs(Alg::HS256, SECRET, r#"{"alg":"HS256","typ":"JWT"}"#, claims)
}

fn rs(alg: Alg, header: &str, claims: &str) -> String {
    let kp = RsaKeyPair::from_pkcs8(&der_of(RSA_PRIV)).expect("test key");
    let pad = match alg {
        Alg::RS256 => &signature::RSA_PKCS1_SHA256,
        Alg::RS384 => &signature::RSA_PKCS1_SHA384,
        _ => &signature::RSA_PKCS1_SHA512,
    };
    let msg = unsigned(header, claims);
    let mut sig = vec![0; kp.public().modulus_len()];
    kp.sign(pad, &SystemRandom::new(), msg.as_bytes(), &mut sig)
        .expect("sign");
    format!("{msg}.{}", b64url_encode(&sig))
}

fn es256(header: &str, claims: &str) -> String {
    let rng = SystemRandom::new();
    let kp = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &der_of(EC_PRIV), &rng)
        .expect("test key");
    let msg = unsigned(header, claims);
    let sig = kp.sign(&rng, msg.as_bytes()).expect("sign");
    format!("{msg}.{}", b64url_encode(sig.as_ref()))
}

fn eddsa(header: &str, claims: &str) -> String {
    let kp = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der_of(ED_PRIV)).expect("test key");
    let msg = unsigned(header, claims);
    let sig = kp.sign(msg.as_bytes());
    format!("{msg}.{}", b64url_encode(sig.as_ref()))
}

fn secret_set() -> KeySet {
    KeySet::load(SECRET, None).expect("secret")
}

#[test]
fn base64url_round_trip_and_strictness() {
    for len in 0..40 {
        let data: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
        let enc = b64url_encode(&data);
        assert!(!enc.contains('='));
        assert_eq!(b64url_decode(enc.as_bytes()), Some(data));
    }
    assert_eq!(b64url_decode(b"QQ"), Some(b"A".to_vec()));
    // Non-zero leftover bits: a second spelling of the same bytes.
    assert_eq!(b64url_decode(b"QR"), None);
    assert_eq!(b64url_decode(b"QQ=="), None);
    assert_eq!(b64url_decode(b"Q"), None);
    assert_eq!(b64url_decode(b"a+b/"), None);
}

#[test]
fn hmac_tokens_verify_with_their_claims() {
    let set = secret_set();
    let t = hs256(r#"{"sub":"alice","role":"web_user","exp":1800000100}"#);
    let c = set.verify(t.as_bytes(), NOW, 30).expect("valid");
    assert_eq!(c.get("sub").as_deref(), Some("alice"));
    assert_eq!(c.get("exp").as_deref(), Some("1800000100"));
    assert!(c.json().contains("\"sub\":\"alice\""));
    // The claims go to SQL as signed: large numbers, spacing and duplicate
    // keys unchanged (the last of duplicates is the one read here, as in
    // PostgreSQL's json operators).
    let text = r#"{ "sub":"x", "id": 123456789012345678901234567890, "role":"a", "role":"b" }"#;
    let c = set.verify(hs256(text).as_bytes(), NOW, 30).expect("valid");
    assert_eq!(c.json(), text);
    assert_eq!(c.get("role").as_deref(), Some("b"));
    assert_eq!(c.get("id").as_deref(), Some("123456789012345678901234567890"));
    // nginx's variable names are lower case: a claim in another case is
    // found, unless one of exactly that name is there.
    let mixed = hs256(r#"{"userId":"u1","Team":"t1","team":"t2"}"#);
    let c = set.verify(mixed.as_bytes(), NOW, 30).expect("valid");
    assert_eq!(c.get("userid").as_deref(), Some("u1"));
    assert_eq!(c.get("team").as_deref(), Some("t2"));
    assert_eq!(c.get("nobody"), None);
    for alg in [Alg::HS384, Alg::HS512] {
        let long = [7u8; 64];
        let set = KeySet::load(&long, None).expect("64-byte secret");
        let t = hs(alg, &long, &format!(r#"{{"alg":"{}"}}"#, alg.name()), "{}");
        assert!(set.verify(t.as_bytes(), NOW, 0).is_ok(), "{alg:?}");
    }
}

#[test]
fn secret_file_line_end_is_not_part_of_the_secret() {
    let mut file = SECRET.to_vec();
    file.push(b'\n');
    let set = KeySet::load(&file, None).expect("secret");
    assert!(set.verify(hs256("{}").as_bytes(), NOW, 0).is_ok());
}

#[test]
fn short_secrets_are_refused() {
    assert!(KeySet::load(b"short", None).is_err());
    assert!(KeySet::load(b"\n", None).is_err());
    // 32 bytes: HS256 only.
    assert!(KeySet::load(SECRET, Some(Alg::HS512)).is_err());
    assert!(KeySet::load(SECRET, Some(Alg::HS256)).is_ok());
}

#[test]
fn tampered_tokens_fail() {
    let set = secret_set();
    let t = hs256(r#"{"sub":"alice"}"#);
    let parts: Vec<&str> = t.split('.').collect();
    let forged = format!("{}.{}.{}", parts[0], b64url_encode(br#"{"sub":"bob"}"#), parts[2]);
    assert_eq!(set.verify(forged.as_bytes(), NOW, 0).unwrap_err(), JwtError::Signature);
    let other = hs(
        Alg::HS256,
        b"another secret of thirty-two byt",
        r#"{"alg":"HS256"}"#,
        "{}",
    );
    assert_eq!(set.verify(other.as_bytes(), NOW, 0).unwrap_err(), JwtError::Signature);
    let no_sig = format!("{}.{}.", parts[0], parts[1]);
    assert_eq!(set.verify(no_sig.as_bytes(), NOW, 0).unwrap_err(), JwtError::Signature);
}

#[test]
fn none_and_unknown_algorithms_fail() {
    let set = secret_set();
    for alg in ["none", "None", "NONE", "HS257", "", "hs256"] {
        let t = format!("{}.", unsigned(&format!(r#"{{"alg":"{alg}"}}"#), r#"{"sub":"x"}"#));
        assert!(
            matches!(set.verify(t.as_bytes(), NOW, 0), Err(JwtError::Algorithm(_))),
            "{alg}"
        );
    }
    let t = format!("{}.", unsigned(r#"{"typ":"JWT"}"#, "{}"));
    assert_eq!(set.verify(t.as_bytes(), NOW, 0).unwrap_err(), JwtError::Header);
    let t = format!("{}.", unsigned(r#"{"alg":5}"#, "{}"));
    assert_eq!(set.verify(t.as_bytes(), NOW, 0).unwrap_err(), JwtError::Header);
}

#[test]
fn an_rsa_key_used_as_an_hmac_secret_fails() {
    // The algorithm-confusion attack: HS256 signed with the public key's text.
    let set = KeySet::load(RSA_PUB.as_bytes(), None).expect("rsa");
    let t = hs(
        Alg::HS256,
        RSA_PUB.as_bytes(),
        r#"{"alg":"HS256"}"#,
        r#"{"role":"admin"}"#,
    );
    assert_eq!(
        set.verify(t.as_bytes(), NOW, 0).unwrap_err(),
        JwtError::Algorithm("HS256".into())
    );
    // And an HMAC secret never verifies RS256 (nor does alg= change a key's kind).
    assert!(KeySet::load(RSA_PUB.as_bytes(), Some(Alg::HS256)).is_err());
    assert!(KeySet::load(SECRET, Some(Alg::RS256)).is_err());
}

#[test]
fn exp_nbf_and_leeway() {
    let set = secret_set();
    let at = |claims: &str, leeway| set.verify(hs256(claims).as_bytes(), NOW, leeway);
    assert_eq!(at(r#"{"exp":1800000000}"#, 0).unwrap_err(), JwtError::Expired);
    assert_eq!(at(r#"{"exp":1799999990}"#, 0).unwrap_err(), JwtError::Expired);
    assert!(at(r#"{"exp":1799999990}"#, 30).is_ok());
    assert_eq!(at(r#"{"exp":1799999970}"#, 30).unwrap_err(), JwtError::Expired);
    assert!(at(r#"{"exp":1800000001}"#, 0).is_ok());
    assert!(at(r#"{"exp":1800000000.5}"#, 0).is_ok());
    assert_eq!(at(r#"{"nbf":1800000001}"#, 0).unwrap_err(), JwtError::NotYetValid);
    assert!(at(r#"{"nbf":1800000020}"#, 30).is_ok());
    assert_eq!(at(r#"{"nbf":1800000031}"#, 30).unwrap_err(), JwtError::NotYetValid);
    assert!(at(r#"{"nbf":1800000000}"#, 0).is_ok());
    assert_eq!(at(r#"{"exp":"2100-01-01"}"#, 0).unwrap_err(), JwtError::Claims);
    assert_eq!(at(r#"{"nbf":null}"#, 0).unwrap_err(), JwtError::Claims);
    assert_eq!(at(r#"{"exp":1e400}"#, 0).unwrap_err(), JwtError::Claims);
}

#[test]
fn malformed_tokens_fail() {
    let set = secret_set();
    let good = hs256("{}");
    for bad in [
        "",
        ".",
        "..",
        "a.b",
        "a.b.c.d",
        "!!!.e30.x",
        "e30.!!!.x",
        "e30.e30.***",
        "W10.e30.AAAA",
    ] {
        assert!(set.verify(bad.as_bytes(), NOW, 0).is_err(), "{bad}");
    }
    let claims_not_object = hs(Alg::HS256, SECRET, r#"{"alg":"HS256"}"#, "[1]");
    assert_eq!(
        set.verify(claims_not_object.as_bytes(), NOW, 0).unwrap_err(),
        JwtError::ClaimsJson
    );
    let deep = format!("{{\"a\":{}1{}}}", "[".repeat(200), "]".repeat(200));
    let deep = hs(Alg::HS256, SECRET, r#"{"alg":"HS256"}"#, &deep);
    assert_eq!(set.verify(deep.as_bytes(), NOW, 0).unwrap_err(), JwtError::ClaimsJson);
    for nul in [r#"{"sub":"a\u0000b"}"#, r#"{"x":[{"y":"\u0000"}]}"#, r#"{"k\u0000":1}"#] {
        let t = hs(Alg::HS256, SECRET, r#"{"alg":"HS256"}"#, nul);
        assert_eq!(
            set.verify(t.as_bytes(), NOW, 0).unwrap_err(),
            JwtError::ClaimsNul,
            "{nul}"
        );
    }
    // An escaped backslash before "u0000" is no NUL.
    let t = hs(Alg::HS256, SECRET, r#"{"alg":"HS256"}"#, r#"{"sub":"a\\u0000"}"#);
    assert!(set.verify(t.as_bytes(), NOW, 0).is_ok());
    let huge = format!("{good}{}", "A".repeat(MAX_TOKEN));
    assert_eq!(set.verify(huge.as_bytes(), NOW, 0).unwrap_err(), JwtError::TooLong);
    let crit = hs(Alg::HS256, SECRET, r#"{"alg":"HS256","crit":["exp"]}"#, "{}");
    assert_eq!(set.verify(crit.as_bytes(), NOW, 0).unwrap_err(), JwtError::Header);
}

#[test]
fn rsa_keys_from_pem() {
    let set = KeySet::load(RSA_PUB.as_bytes(), None).expect("spki");
    for alg in [Alg::RS256, Alg::RS384, Alg::RS512] {
        let t = rs(alg, &format!(r#"{{"alg":"{}"}}"#, alg.name()), r#"{"sub":"a"}"#);
        assert!(set.verify(t.as_bytes(), NOW, 0).is_ok(), "{alg:?}");
    }
    let pkcs1 = KeySet::load(RSA_PKCS1.as_bytes(), Some(Alg::RS256)).expect("pkcs1");
    let t = rs(Alg::RS256, r#"{"alg":"RS256"}"#, "{}");
    assert!(pkcs1.verify(t.as_bytes(), NOW, 0).is_ok());
    let t384 = rs(Alg::RS384, r#"{"alg":"RS384"}"#, "{}");
    assert!(matches!(
        pkcs1.verify(t384.as_bytes(), NOW, 0),
        Err(JwtError::Algorithm(_))
    ));
    // A token signed by another key.
    let other = KeySet::load(RSA2_PUB.as_bytes(), None).expect("rsa2");
    assert_eq!(other.verify(t.as_bytes(), NOW, 0).unwrap_err(), JwtError::Signature);
}

#[test]
fn a_token_signed_by_the_openssl_cli_verifies() {
    let set = KeySet::load(RSA_PUB.as_bytes(), None).expect("rsa");
    let c = set
        .verify(RS256_OPENSSL.trim().as_bytes(), NOW, 0)
        .expect("openssl's token");
    assert_eq!(c.get("role").as_deref(), Some("web_user"));
}

#[test]
fn ec_and_eddsa_keys() {
    let set = KeySet::load(EC_PUB.as_bytes(), None).expect("p256");
    let t = es256(r#"{"alg":"ES256"}"#, r#"{"sub":"e"}"#);
    assert!(set.verify(t.as_bytes(), NOW, 0).is_ok());
    let wrong = es256(r#"{"alg":"ES384"}"#, "{}");
    assert!(matches!(
        set.verify(wrong.as_bytes(), NOW, 0),
        Err(JwtError::Algorithm(_))
    ));
    assert!(KeySet::load(EC384_PUB.as_bytes(), None)
        .expect("p384")
        .describe()
        .contains("ES384"));
    let ed = KeySet::load(ED_PUB.as_bytes(), None).expect("ed25519");
    let t = eddsa(r#"{"alg":"EdDSA"}"#, r#"{"sub":"d"}"#);
    assert!(ed.verify(t.as_bytes(), NOW, 0).is_ok());
    assert!(KeySet::load(ED_PUB.as_bytes(), Some(Alg::ES256)).is_err());
}

#[test]
fn private_keys_and_garbage_pem_are_refused() {
    let e = KeySet::load(RSA_PRIV.as_bytes(), None).unwrap_err();
    assert!(e.0.contains("private key"), "{e}");
    assert!(KeySet::load(
        b"-----BEGIN PUBLIC KEY-----\nnot base64!\n-----END PUBLIC KEY-----\n",
        None
    )
    .is_err());
    assert!(KeySet::load(b"-----BEGIN PUBLIC KEY-----\nMAA=\n-----END PUBLIC KEY-----\n", None).is_err());
    assert!(KeySet::load(b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n", None).is_err());
    assert!(KeySet::load(b"-----BEGIN PUBLIC KEY-----\nMAA=\n", None).is_err());
}

fn rsa_jwk(kid: &str) -> String {
    let der = der_of(RSA_PUB);
    let Material::Rsa { n, e } = spki(&der).expect("rsa") else {
        panic!("not rsa")
    };
    format!(
        r#"{{"kty":"RSA","kid":"{kid}","use":"sig","n":"{}","e":"{}"}}"#,
        b64url_encode(&n),
        b64url_encode(&e)
    )
}

#[test]
fn jwks_chooses_by_kid() {
    let ec = der_of(EC_PUB);
    let Material::P256(point) = spki(&ec).expect("ec") else {
        panic!("not p256")
    };
    let doc = format!(
        r#"{{"keys":[{},{{"kty":"EC","crv":"P-256","kid":"ec1","x":"{}","y":"{}"}},{{"kty":"oct","kid":"h1","k":"{}","alg":"HS256"}},{{"kty":"RSA","use":"enc","n":"AQAB","e":"AQAB"}}]}}"#,
        rsa_jwk("r1"),
        b64url_encode(&point[1..33]),
        b64url_encode(&point[33..]),
        b64url_encode(SECRET)
    );
    let set = KeySet::load(doc.as_bytes(), None).expect("jwks");
    let t = rs(Alg::RS256, r#"{"alg":"RS256","kid":"r1"}"#, "{}");
    assert!(set.verify(t.as_bytes(), NOW, 0).is_ok());
    let t = es256(r#"{"alg":"ES256","kid":"ec1"}"#, "{}");
    assert!(set.verify(t.as_bytes(), NOW, 0).is_ok());
    let t = hs(Alg::HS256, SECRET, r#"{"alg":"HS256","kid":"h1"}"#, "{}");
    assert!(set.verify(t.as_bytes(), NOW, 0).is_ok());
    // A kid naming a key of another kind: that key decides, the token's alg does not.
    let t = hs(Alg::HS256, SECRET, r#"{"alg":"HS256","kid":"r1"}"#, "{}");
    assert!(set.verify(t.as_bytes(), NOW, 0).is_err());
    let t = rs(Alg::RS256, r#"{"alg":"RS256","kid":"nope"}"#, "{}");
    assert_eq!(
        set.verify(t.as_bytes(), NOW, 0).unwrap_err(),
        JwtError::UnknownKid("nope".into())
    );
    // Without kid, any key that allows the algorithm.
    let t = rs(Alg::RS256, r#"{"alg":"RS256"}"#, "{}");
    assert!(set.verify(t.as_bytes(), NOW, 0).is_ok());
    // alg= keeps only the keys that fit.
    let only_rs = KeySet::load(doc.as_bytes(), Some(Alg::RS256)).expect("rs only");
    let t = es256(r#"{"alg":"ES256","kid":"ec1"}"#, "{}");
    assert!(only_rs.verify(t.as_bytes(), NOW, 0).is_err());
    // A single JWK is a set of one.
    let one = KeySet::load(rsa_jwk("x").as_bytes(), None).expect("jwk");
    let t = rs(Alg::RS256, r#"{"alg":"RS256"}"#, "{}");
    assert!(one.verify(t.as_bytes(), NOW, 0).is_ok());
}

#[test]
fn bad_jwks_documents_are_refused() {
    for doc in [
        "{",
        r#"{"keys":5}"#,
        r#"{"keys":[]}"#,
        r#"{"keys":[{"kty":"oct","k":"c2hvcnQ"}]}"#,
        r#"{"keys":[{"kty":"XYZ"}]}"#,
        r#"{"keys":[{"kty":"EC","crv":"P-521","x":"AA","y":"AA"}]}"#,
        r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#,
        r#"{"keys":[{"kty":"RSA","n":"AA","e":"AQAB"}]}"#,
        r#"{"keys":[{"kty":"RSA","n":"","e":""}]}"#,
        r#"{"keys":[{"kty":"oct","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY","alg":"RS256"}]}"#,
    ] {
        assert!(KeySet::load(doc.as_bytes(), None).is_err(), "{doc}");
    }
}

#[test]
fn claim_paths() {
    let set = secret_set();
    let t = hs256(r#"{"role":"r","app":{"role":"nested","n":3,"deep":{"x":[1,2]}},"nul":null,"flag":true}"#);
    let c = set.verify(t.as_bytes(), NOW, 0).expect("valid");
    let path = |p: &str| c.get_path(&parse_claim_path(p).expect("path"));
    assert_eq!(path("role").as_deref(), Some("r"));
    assert_eq!(path("app.role").as_deref(), Some("nested"));
    assert_eq!(path("app.n").as_deref(), Some("3"));
    assert_eq!(path("app.deep.x").as_deref(), Some("[1,2]"));
    assert_eq!(path("app.missing"), None);
    assert_eq!(path("role.x"), None);
    assert_eq!(path("nul"), None);
    assert_eq!(c.get("flag").as_deref(), Some("true"));
    assert_eq!(parse_claim_path("a..b"), None);
    assert_eq!(parse_claim_path(""), None);
}

#[test]
fn bearer_header() {
    assert_eq!(bearer_token(b"Bearer abc.def.ghi"), Some(&b"abc.def.ghi"[..]));
    assert_eq!(bearer_token(b"bearer   x "), Some(&b"x"[..]));
    assert_eq!(bearer_token(b"Bearer "), None);
    assert_eq!(bearer_token(b"Basic abc"), None);
    assert_eq!(bearer_token(b"Bearerabc"), None);
    assert_eq!(bearer_token(b""), None);
}

#[test]
fn the_token_cache_keeps_signatures_never_times() {
    let set = secret_set();
    let mut cache = TokenCache::new(2);
    let t = hs256(r#"{"sub":"a","exp":1800000010}"#);
    assert!(cache.verify(&set, t.as_bytes(), NOW, 0).is_ok());
    assert_eq!(cache.len(), 1);
    assert!(cache.verify(&set, t.as_bytes(), NOW + 5, 0).is_ok());
    // Expired since: refused, though cached.
    assert_eq!(
        cache.verify(&set, t.as_bytes(), NOW + 10, 0).unwrap_err(),
        JwtError::Expired
    );
    // With the leeway of another location it is still valid.
    assert!(cache.verify(&set, t.as_bytes(), NOW + 10, 30).is_ok());
    // A forged token is never cached nor accepted; a changed one is not the cached one.
    let forged = format!("{}x", &t[..t.len() - 1]);
    assert!(cache.verify(&set, forged.as_bytes(), NOW, 0).is_err());
    assert_eq!(cache.len(), 1);
    // Bounded.
    for i in 0..5 {
        let t = hs256(&format!(r#"{{"sub":"{i}"}}"#));
        assert!(cache.verify(&set, t.as_bytes(), NOW, 0).is_ok());
        assert!(cache.len() <= 2);
    }
    // nbf in the future: not valid yet, and valid later from the cache too.
    let t = hs256(r#"{"nbf":1800000100}"#);
    assert_eq!(
        cache.verify(&set, t.as_bytes(), NOW, 0).unwrap_err(),
        JwtError::NotYetValid
    );
    assert!(cache.verify(&set, t.as_bytes(), NOW + 100, 0).is_ok());
}

#[test]
fn public_keys_in_forms_not_read_are_never_secrets() {
    let der = der_of(RSA_PUB);
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend_from_slice(RSA_PUB.as_bytes());
    let mut after_text = b"my key:\n".to_vec();
    after_text.extend_from_slice(RSA_PUB.as_bytes());
    let ssh = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host\n";
    let array = b"[{\"kty\":\"oct\",\"k\":\"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY\"}]";
    for (what, file) in [
        ("DER", der.clone()),
        ("a BOM before PEM", bom),
        ("text before PEM", after_text),
        ("OpenSSH", ssh.to_vec()),
        ("a JSON array", array.to_vec()),
    ] {
        let err = KeySet::load(&file, None).expect_err(what);
        assert!(err.to_string().contains("looks like"), "{what}: {err}");
    }
    // A random secret that starts like DER but is not one stays a secret.
    let mut secret = vec![0x30, 0x05];
    secret.extend_from_slice(&SECRET[..30]);
    assert!(KeySet::load(&secret, None).is_ok());
}

#[test]
fn keys_that_cannot_work_are_refused_at_load() {
    // Two PEM blocks: one would be used, silently.
    let two = format!("{RSA_PUB}{EC_PUB}");
    let err = KeySet::load(two.as_bytes(), None).expect_err("two blocks");
    assert!(err.to_string().contains("more than one PEM block"), "{err}");
    // An RSA exponent of 1 verifies nothing.
    let Material::Rsa { n, .. } = spki(&der_of(RSA_PUB)).expect("test key") else {
        panic!("not RSA")
    };
    let n = b64url_encode(&n);
    let jwk = format!(r#"{{"kty":"RSA","n":"{n}","e":"AQ"}}"#);
    let err = KeySet::load(jwk.as_bytes(), None).expect_err("e=1");
    assert!(err.to_string().contains("exponent 1"), "{err}");
    let err = KeySet::load(br#"{"kty":"XYZ"}"#, None).expect_err("kty");
    assert!(
        err.to_string().contains("\"XYZ\"") && !err.to_string().contains("Some"),
        "{err}"
    );
}
