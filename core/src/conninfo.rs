//! libpq connection strings built from `sqldb_server` arguments.
//!
//! `sqldb_server 127.0.0.1:5432 dbname=app user=web password='a b'` gives the
//! address (resolved by nginx, so that libpq never resolves a name and never
//! blocks) and libpq keywords, which pass through with their values quoted.

use std::fmt;
use std::net::SocketAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConninfoError {
    NotKeyword(String),
    BadKeyword(String),
    AddressKeyword(String),
    Repeated(String),
    BadValue {
        key: String,
        value: String,
        allowed: &'static [&'static str],
    },
}

impl fmt::Display for ConninfoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConninfoError::NotKeyword(a) => write!(f, "invalid parameter \"{a}\": expected keyword=value"),
            ConninfoError::BadKeyword(k) => write!(f, "invalid libpq keyword \"{k}\""),
            ConninfoError::AddressKeyword(k) => {
                write!(f, "\"{k}\" is not allowed: the address is the first parameter")
            }
            ConninfoError::Repeated(k) => write!(f, "keyword \"{k}\" is given twice"),
            ConninfoError::BadValue { key, value, allowed } => {
                write!(
                    f,
                    "invalid value \"{value}\" of \"{key}\", it must be {}",
                    allowed.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for ConninfoError {}

/// libpq keywords that the address argument sets.
const ADDRESS_KEYWORDS: &[&str] = &["host", "hostaddr"];

/// Keywords whose values libpq only checks when it connects: checked when
/// the configuration is read instead.
const ENUMERATED: &[(&str, &[&str])] = &[
    (
        "sslmode",
        &["disable", "allow", "prefer", "require", "verify-ca", "verify-full"],
    ),
    ("gssencmode", &["disable", "prefer", "require"]),
    ("channel_binding", &["disable", "prefer", "require"]),
    (
        "target_session_attrs",
        &["any", "read-write", "read-only", "primary", "standby", "prefer-standby"],
    ),
];

/// Keywords whose values are integers (libpq reads them when it connects).
const INTEGERS: &[&str] = &[
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
];

/// Client encodings whose multibyte characters can hold the bytes of `'`
/// or `\\`: quoting a value byte by byte (sqldb_escape) is not safe in them.
/// Names as PostgreSQL compares them (lower case, letters and digits only).
const UNSAFE_ENCODINGS: &[&str] = &[
    "sjis",
    "shiftjis",
    "mskanji",
    "windows932",
    "win932",
    "shiftjis2004",
    "big5",
    "windows950",
    "win950",
    "gbk",
    "windows936",
    "win936",
    "cp936",
    "gb18030",
    "uhc",
    "windows949",
    "win949",
    "johab",
];

/// An encoding name whose characters can hide a quote (see UNSAFE_ENCODINGS).
pub fn unsafe_encoding(name: &str) -> bool {
    let norm: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    UNSAFE_ENCODINGS.contains(&norm.as_str())
}

/// The keyword=value pairs of one server, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keywords {
    pairs: Vec<(String, String)>,
}

impl Keywords {
    /// Adds one `keyword=value` argument.
    pub fn push_arg(&mut self, arg: &str) -> Result<(), ConninfoError> {
        let (key, value) = arg
            .split_once('=')
            .ok_or_else(|| ConninfoError::NotKeyword(arg.to_owned()))?;
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(ConninfoError::BadKeyword(key.to_owned()));
        }
        if ADDRESS_KEYWORDS.contains(&key) {
            return Err(ConninfoError::AddressKeyword(key.to_owned()));
        }
        if self.get(key).is_some() {
            return Err(ConninfoError::Repeated(key.to_owned()));
        }
        if let Some(&(_, allowed)) = ENUMERATED.iter().find(|(k, _)| *k == key) {
            if !allowed.contains(&value) {
                return Err(ConninfoError::BadValue {
                    key: key.to_owned(),
                    value: value.to_owned(),
                    allowed,
                });
            }
        }
        let digits = !value.is_empty() && value.len() <= 9 && value.bytes().all(|b| b.is_ascii_digit());
        if INTEGERS.contains(&key) && !digits {
            return Err(ConninfoError::BadValue {
                key: key.to_owned(),
                value: value.to_owned(),
                allowed: &["a whole number"],
            });
        }
        // client_encoding=..., or -c client_encoding=... in options.
        let encoding = match key {
            "client_encoding" => Some(value.to_owned()).filter(|v| unsafe_encoding(v)),
            "options" => value
                .split_whitespace()
                // libpq's options take backslash escapes; setting names
                // are in any letter case.
                .map(|w| w.replace('\\', "").to_ascii_lowercase())
                .filter_map(|w| {
                    let (k, v) = w.split_once('=')?;
                    let k = k.trim_start_matches("-c").trim_start_matches("--").replace('-', "_");
                    (k == "client_encoding" && unsafe_encoding(v)).then(|| v.to_owned())
                })
                .next(),
            _ => None,
        };
        if let Some(encoding) = encoding {
            return Err(ConninfoError::BadValue {
                key: "client_encoding".to_owned(),
                value: encoding,
                allowed: &["an encoding whose characters never hold the bytes of a quote or a backslash (UTF8, LATIN1, EUC_JP, ...)"],
            });
        }
        if key == "port" && port_number(value).is_none() {
            return Err(ConninfoError::BadValue {
                key: key.to_owned(),
                value: value.to_owned(),
                allowed: &["a port number from 1 to 65535"],
            });
        }
        self.pairs.push((key.to_owned(), value.to_owned()));
        Ok(())
    }

    /// The `port=` keyword, if given (checked by `push_arg`).
    pub fn port(&self) -> Option<u16> {
        self.get("port").and_then(port_number)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

fn port_number(v: &str) -> Option<u16> {
    // Digits only (str::parse would take a sign).
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|&p| p != 0)
}

/// Where one connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address<'a> {
    /// A resolved TCP address; `name` is the host name as written, when it
    /// was a name, kept for TLS verification and .pgpass look-ups.
    Tcp { addr: SocketAddr, name: Option<&'a str> },
    /// A directory holding the server's socket (`unix:/var/run/postgresql`).
    Unix { dir: &'a str },
}

/// Appends `value` quoted the way libpq's conninfo parser reads it.
pub fn push_quoted(out: &mut String, value: &str) {
    out.push('\'');
    for ch in value.chars() {
        if ch == '\'' || ch == '\\' {
            out.push('\\');
        }
        out.push(ch);
    }
    out.push('\'');
}

fn push_pair(out: &mut String, key: &str, value: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(key);
    out.push('=');
    push_quoted(out, value);
}

/// The full connection string for one target.
pub fn build(target: &Address<'_>, keywords: &Keywords) -> String {
    let mut out = String::new();
    match target {
        Address::Tcp { addr, name } => {
            push_pair(&mut out, "hostaddr", &addr.ip().to_string());
            if let Some(name) = name {
                push_pair(&mut out, "host", name);
            }
            push_pair(&mut out, "port", &addr.port().to_string());
        }
        Address::Unix { dir } => push_pair(&mut out, "host", dir),
    }
    let tcp = matches!(target, Address::Tcp { .. });
    let mut has_app_name = false;
    for (k, v) in keywords.iter() {
        if tcp && k == "port" {
            continue; // the address carries the port
        }
        has_app_name |= k == "application_name" || k == "fallback_application_name";
        push_pair(&mut out, k, v);
    }
    if !has_app_name {
        push_pair(&mut out, "fallback_application_name", "ngx_gateway");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kw(args: &[&str]) -> Result<Keywords, ConninfoError> {
        let mut k = Keywords::default();
        for a in args {
            k.push_arg(a)?;
        }
        Ok(k)
    }

    #[test]
    fn tcp_with_keywords() {
        let k = kw(&["dbname=app", "user=web", "password=s3cret", "sslmode=disable"]).unwrap();
        let t = Address::Tcp {
            addr: "127.0.0.1:5433".parse().unwrap(),
            name: None,
        };
        assert_eq!(
            build(&t, &k),
            "hostaddr='127.0.0.1' port='5433' dbname='app' user='web' password='s3cret' \
             sslmode='disable' fallback_application_name='ngx_gateway'"
        );
    }

    #[test]
    fn quotes_and_backslashes_are_escaped() {
        let k = kw(&["password=it's a \\secret", "application_name=x"]).unwrap();
        let t = Address::Tcp {
            addr: "[::1]:5432".parse().unwrap(),
            name: Some("db.local"),
        };
        assert_eq!(
            build(&t, &k),
            "hostaddr='::1' host='db.local' port='5432' password='it\\'s a \\\\secret' application_name='x'"
        );
    }

    #[test]
    fn unix_socket_keeps_port_keyword() {
        let k = kw(&["port=5444", "dbname=d"]).unwrap();
        let t = Address::Unix { dir: "/run/pg dir" };
        assert_eq!(
            build(&t, &k),
            "host='/run/pg dir' port='5444' dbname='d' fallback_application_name='ngx_gateway'"
        );
    }

    #[test]
    fn bad_arguments() {
        assert_eq!(kw(&["dbname"]), Err(ConninfoError::NotKeyword("dbname".into())));
        assert_eq!(kw(&["Db=x"]), Err(ConninfoError::BadKeyword("Db".into())));
        assert_eq!(kw(&["=x"]), Err(ConninfoError::BadKeyword("".into())));
        assert_eq!(kw(&["host=x"]), Err(ConninfoError::AddressKeyword("host".into())));
        assert_eq!(kw(&["user=a", "user=b"]), Err(ConninfoError::Repeated("user".into())));
        // A value may hold '=' and spaces.
        assert_eq!(kw(&["options=-c a=b"]).unwrap().get("options"), Some("-c a=b"));
        assert_eq!(
            kw(&["sslmode=requir"]).unwrap_err().to_string(),
            "invalid value \"requir\" of \"sslmode\", it must be disable, allow, prefer, require, verify-ca, verify-full"
        );
        assert!(kw(&["sslmode=verify-full", "target_session_attrs=read-write"]).is_ok());
        assert!(kw(&["connect_timeout=5", "keepalives_idle=30"]).is_ok());
        assert!(kw(&["client_encoding=UTF8", "options=-c client_encoding=euc_jp"]).is_ok());
        for bad in [
            "client_encoding=SJIS",
            "client_encoding=Shift_JIS",
            "client_encoding=big5",
            "options=-c client_encoding=GBK",
            "options=--client-encoding=uhc",
            "options=-c CLIENT_ENCODING=sjis",
            "options=-c client\\_encoding=sjis",
            "client_encoding=win932",
            "client_encoding=WIN950",
            "options=-c client_encoding=win949",
        ] {
            assert!(kw(&[bad]).is_err(), "{bad}");
        }
        for bad in [
            "connect_timeout=abc",
            "connect_timeout=",
            "keepalives=-1",
            "tcp_user_timeout=1.5",
        ] {
            assert!(kw(&[bad]).is_err(), "{bad}");
        }
        assert!(kw(&["port=0"]).is_err());
        assert!(kw(&["port=65536"]).is_err());
        assert!(kw(&["port=x"]).is_err());
        assert_eq!(kw(&["port=6432"]).unwrap().port(), Some(6432));
    }
}
