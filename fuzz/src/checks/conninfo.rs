//! `conninfo::Keywords::push_arg` on arbitrary arguments, then `build`.
//!
//! What must hold: `push_arg` accepts exactly the `keyword=value` arguments
//! with a keyword of `[a-z_]+` that is not an address keyword nor given
//! before (checked against a model); and the string `build` gives, read by
//! the tokenizer below (written after libpq's conninfo_parse), gives back
//! the address pairs, every keyword with its value in order (but `port`
//! with a TCP address, which carries it) and the fallback application name
//! when none is given. A value with a NUL cannot pass through a C string:
//! then the string must hold the NUL (the module refuses it) .

use crate::source::Source;
use gateway_core::conninfo::{build, Address, ConninfoError, Keywords};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// libpq's isspace() in the C locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// Reads a connection string as libpq does: `keyword = value` pairs
/// separated by whitespace; a value is either `'...'`, where a backslash
/// takes the next byte as it is, or runs to the next whitespace, where a
/// backslash does the same. `None` where libpq reports an error.
fn tokenize(s: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut pairs = Vec::new();
    let mut i = 0;
    let skip_space = |i: &mut usize| {
        while *i < s.len() && is_space(s[*i]) {
            *i += 1;
        }
    };
    loop {
        skip_space(&mut i);
        if i == s.len() {
            return Some(pairs);
        }
        let start = i;
        while i < s.len() && s[i] != b'=' && !is_space(s[i]) {
            i += 1;
        }
        let key = s[start..i].to_vec();
        skip_space(&mut i);
        if s.get(i) != Some(&b'=') {
            return None; // missing "=" after the keyword
        }
        i += 1;
        skip_space(&mut i);
        let mut value = Vec::new();
        if s.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match *s.get(i)? {
                    b'\\' => {
                        i += 1;
                        if let Some(&c) = s.get(i) {
                            value.push(c);
                            i += 1;
                        }
                    }
                    b'\'' => {
                        i += 1;
                        break;
                    }
                    c => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < s.len() && !is_space(s[i]) {
                if s[i] == b'\\' {
                    i += 1;
                    if i == s.len() {
                        break;
                    }
                }
                value.push(s[i]);
                i += 1;
            }
        }
        pairs.push((key, value));
    }
}

/// What `push_arg` must answer, given the keywords taken so far.
fn expected(arg: &str, taken: &[(String, String)]) -> Result<(String, String), ConninfoError> {
    let Some(eq) = arg.find('=') else {
        return Err(ConninfoError::NotKeyword(arg.to_owned()));
    };
    let (key, value) = (&arg[..eq], &arg[eq + 1..]);
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
        return Err(ConninfoError::BadKeyword(key.to_owned()));
    }
    if key == "host" || key == "hostaddr" {
        return Err(ConninfoError::AddressKeyword(key.to_owned()));
    }
    if taken.iter().any(|(k, _)| k == key) {
        return Err(ConninfoError::Repeated(key.to_owned()));
    }
    // Values libpq only checks when it connects are checked here.
    let allowed: Option<&[&str]> = match key {
        "sslmode" => Some(&["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]),
        "gssencmode" | "channel_binding" => Some(&["disable", "prefer", "require"]),
        "target_session_attrs" => Some(&["any", "read-write", "read-only", "primary", "standby", "prefer-standby"]),
        _ => None,
    };
    let number = |v: &str| !v.is_empty() && v.len() <= 9 && v.bytes().all(|b| b.is_ascii_digit());
    // Which encoding names are unsafe is core's list (data, not logic to
    // model); where the name sits in the arguments is modelled here.
    let unsafe_encoding = gateway_core::conninfo::unsafe_encoding;
    let bad = match allowed {
        Some(list) => !list.contains(&value),
        None if key == "port" => {
            !value.bytes().all(|b| b.is_ascii_digit())
                || value.is_empty()
                || value.parse::<u32>().map_or(true, |p| p == 0 || p > 65535)
        }
        None if matches!(
            key,
            "connect_timeout"
                | "keepalives"
                | "keepalives_idle"
                | "keepalives_interval"
                | "keepalives_count"
                | "tcp_user_timeout"
        ) =>
        {
            !number(value)
        }
        None if key == "client_encoding" => unsafe_encoding(value),
        None if key == "options" => value.split_whitespace().any(|w| {
            let w = w.replace('\\', "").to_ascii_lowercase();
            w.split_once('=').is_some_and(|(k, v)| {
                k.trim_start_matches("-c").trim_start_matches("--").replace('-', "_") == "client_encoding"
                    && unsafe_encoding(v)
            })
        }),
        None => false,
    };
    if bad {
        let got = Keywords::default().push_arg(arg);
        // The message lists the accepted values; only whether it is refused is modelled.
        assert!(matches!(got, Err(ConninfoError::BadValue { .. })), "{arg:?}: {got:?}");
        return got.map(|_| unreachable!());
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// Text for an argument: bytes of the input, with the characters that
/// matter to libpq's reader and a few keywords made likely.
fn text(src: &mut Source) -> String {
    const PIECES: &[&str] = &[
        "=",
        "'",
        "\\",
        " ",
        "\t",
        "\n",
        "\r",
        "\x0b",
        "=''",
        "\\'",
        "port=",
        "port=5432",
        "sslmode=",
        "sslmode=require",
        "user=",
        "dbname=",
        "password=",
        "application_name=",
        "host=",
        "é",
        "\0",
    ];
    let mut s = String::new();
    for _ in 0..src.below(16) {
        let b = src.byte();
        if b >= 0x80 {
            s.push_str(PIECES[b as usize % PIECES.len()]);
        } else {
            s.push(b as char);
        }
    }
    s
}

pub fn conninfo(data: &[u8]) {
    let mut src = Source::new(data);
    let mut keywords = Keywords::default();
    let mut taken: Vec<(String, String)> = Vec::new();
    for _ in 0..src.below(6) {
        let arg = text(&mut src);
        let want = expected(&arg, &taken);
        let got = keywords.push_arg(&arg);
        match want {
            Ok(pair) => {
                assert_eq!(got, Ok(()), "{arg:?}");
                taken.push(pair);
            }
            Err(e) => assert_eq!(got, Err(e), "{arg:?}"),
        }
        assert_eq!(keywords.iter().count(), taken.len());
    }
    for (k, v) in &taken {
        assert_eq!(keywords.get(k), Some(v.as_str()));
    }

    let name;
    let dir;
    let target = match src.below(3) {
        0 => {
            dir = text(&mut src);
            Address::Unix { dir: &dir }
        }
        t => {
            let ip = if src.bool() {
                IpAddr::V4(Ipv4Addr::from(src.u32()))
            } else {
                IpAddr::V6(Ipv6Addr::from(src.u64() as u128 | (src.u64() as u128) << 64))
            };
            name = text(&mut src);
            Address::Tcp {
                addr: SocketAddr::new(ip, src.u16()),
                name: (t == 2).then_some(name.as_str()),
            }
        }
    };

    let mut want: Vec<(String, String)> = Vec::new();
    let tcp = match &target {
        Address::Tcp { addr, name } => {
            want.push(("hostaddr".into(), addr.ip().to_string()));
            if let Some(n) = name {
                want.push(("host".into(), n.to_string()));
            }
            want.push(("port".into(), addr.port().to_string()));
            true
        }
        Address::Unix { dir } => {
            want.push(("host".into(), dir.to_string()));
            false
        }
    };
    want.extend(taken.iter().filter(|(k, _)| !(tcp && k == "port")).cloned());
    if !taken
        .iter()
        .any(|(k, _)| k == "application_name" || k == "fallback_application_name")
    {
        want.push(("fallback_application_name".into(), "ngx_gateway".into()));
    }

    let s = build(&target, &keywords);
    if want.iter().any(|(_, v)| v.contains('\0')) {
        assert!(s.contains('\0'), "a NUL was lost");
        return;
    }
    let got = tokenize(s.as_bytes()).unwrap_or_else(|| panic!("libpq would refuse {s:?}"));
    let got: Vec<(String, String)> = got
        .into_iter()
        .map(|(k, v)| (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap()))
        .collect();
    assert_eq!(got, want, "{s:?}");
}
