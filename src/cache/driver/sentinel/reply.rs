//! What the Sentinels and the servers of a set answer, read (driver::sentinel).

use std::net::SocketAddr;

use gateway_core::resp::Value;

/// A replica as the Sentinels list it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    pub addr: SocketAddr,
    /// Its link to the master is up and no Sentinel finds it down.
    pub ok: bool,
    /// A Sentinel finds it down or cannot reach it.
    pub down: bool,
}

pub fn is_bulk(v: Option<&Value>, want: &[u8]) -> bool {
    matches!(v, Some(Value::Bulk(b)) if b == want)
}

fn text_of(v: Option<&Value>) -> Option<&str> {
    match v {
        Some(Value::Bulk(b)) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// An IP address and a port, as bulk strings.
pub fn parse_addr(ip: Option<&Value>, port: Option<&Value>) -> Option<SocketAddr> {
    let ip: std::net::IpAddr = text_of(ip)?.parse().ok()?;
    let port: u16 = text_of(port)?.parse().ok()?;
    Some(SocketAddr::new(ip, port))
}

/// `SENTINEL replicas`: an array of flat field lists.
pub fn parse_replicas(list: &[Value]) -> Vec<Replica> {
    let mut out = Vec::new();
    for r in list {
        let Value::Array(fields) = r else { continue };
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|kv| text_of(kv.first()) == Some(name))
                .and_then(|kv| text_of(kv.get(1)))
        };
        let Some(addr) = parse_addr(
            fields
                .chunks(2)
                .find(|kv| text_of(kv.first()) == Some("ip"))
                .and_then(|kv| kv.get(1)),
            fields
                .chunks(2)
                .find(|kv| text_of(kv.first()) == Some("port"))
                .and_then(|kv| kv.get(1)),
        ) else {
            continue;
        };
        let flags = field("flags").unwrap_or("");
        let down = flags
            .split(',')
            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
        let link_ok = field("master-link-status") == Some("ok");
        out.push(Replica {
            addr,
            ok: !down && link_ok,
            down,
        });
    }
    out
}
