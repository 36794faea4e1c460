//! Parsing: the compact form of a token (three base64url parts), the
//! bearer token of an `Authorization` header, base64.

use serde_json::{Map, Value};

use super::error::JwtError;
use super::MAX_TOKEN;

/// Text of the token for a log line: printable ASCII, at most 64 bytes.
pub(super) fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
        .collect()
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

pub(super) struct Parts<'a> {
    pub(super) header: &'a [u8],
    pub(super) payload: &'a [u8],
    pub(super) signature: &'a [u8],
}

pub(super) fn split_token(token: &[u8]) -> Result<Parts<'_>, JwtError> {
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

pub(super) fn decode_object(part: &[u8], err: JwtError) -> Result<Map<String, Value>, JwtError> {
    let bytes = b64url_decode(part).ok_or(JwtError::Encoding)?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(err),
    }
}

pub(super) fn trim_ascii(mut b: &[u8]) -> &[u8] {
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
pub(super) fn b64_decode_strict(input: &[u8], url: bool) -> Option<Vec<u8>> {
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
