//! Upstream blocks while the configuration is read: addresses as nginx
//! parses them, the `server` lines a module adds and reads back, and the
//! blocks' balancer.

use std::mem;

use super::*;

/// An address as nginx parsed it (`ngx_parse_url`), names resolved.
pub struct Url {
    /// The host as written ("127.0.0.1", "db.local", "[::1]").
    pub host: String,
    /// No port was written (the default applies).
    pub no_port: bool,
    pub addrs: Vec<Addr>,
    raw: ngx_url_t,
}

/// One address of a Url.
pub struct Addr {
    /// The sockaddr's bytes.
    pub sockaddr: Vec<u8>,
    /// Where nginx keeps it: the balancers hand this very pointer to a
    /// peer, which tells apart two servers of the same address.
    pub at: usize,
    /// Its text ("127.0.0.1:5432"), in configuration memory.
    pub name: ngx_str_t,
}

/// A server line of the upstream block being read (as `server` has them).
pub struct ServerParams {
    pub weight: ngx_uint_t,
    pub max_fails: ngx_uint_t,
    pub fail_timeout: time_t,
    pub backup: bool,
    pub down: bool,
}

impl Conf<'_> {
    /// Parses (and resolves) an address: `host[:port]` or `unix:/path`.
    pub fn parse_url(&self, value: &[u8], default_port: u16) -> Result<Url, String> {
        let pool = self.pool();
        // SAFETY: an all-zero ngx_url_t is its initial state; the value is
        // copied into configuration memory, and the addresses nginx finds
        // are there too.
        unsafe {
            let mut url: ngx_url_t = mem::zeroed();
            url.url = pool.str(value).ok_or("out of memory")?;
            url.default_port = default_port;
            if ngx_parse_url(pool.as_ptr(), &mut url) != OK {
                let err = url.err.as_ref().map_or("invalid address".into(), |e| {
                    std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
                });
                return Err(err);
            }
            let addrs = (0..url.naddrs)
                .map(|i| {
                    let a = &*url.addrs.add(i);
                    Addr {
                        sockaddr: std::slice::from_raw_parts(a.sockaddr as *const u8, a.socklen as usize).to_vec(),
                        at: a.sockaddr as usize,
                        name: a.name,
                    }
                })
                .collect();
            Ok(Url {
                host: String::from_utf8_lossy(url.host.as_bytes()).into_owned(),
                no_port: url.no_port() != 0,
                addrs,
                raw: url,
            })
        }
    }

    /// `f` with the upstream block being read (for directives inside
    /// `upstream`; a loan, above).
    pub fn with_upstream_block<R>(&self, f: impl FnOnce(&mut ngx_http_upstream_srv_conf_t) -> R) -> R {
        self.with_srv_conf::<ngx::http::NgxHttpUpstreamModule, _>(f)
    }

    /// Adds a server to the upstream block being read, for its balancer.
    pub fn add_upstream_server(&self, url: &Url, p: &ServerParams) -> Result<(), ConfError> {
        let servers = self.with_upstream_block(|uscf| uscf.servers);
        if servers.is_null() {
            return Err(format!(
                "\"{}\" directive is allowed only inside an \"upstream\" block",
                self.directive()
            )
            .into());
        }
        // SAFETY: the block's servers array is of ngx_http_upstream_server_t,
        // in configuration memory; the new element is zeroed before use.
        unsafe {
            let us = (ngx_array_push(servers) as *mut ngx_http_upstream_server_t)
                .as_mut()
                .ok_or(ConfError::Logged)?;
            *us = mem::zeroed();
            us.name = url.raw.url;
            us.addrs = url.raw.addrs;
            us.naddrs = url.raw.naddrs;
            us.weight = p.weight;
            us.max_fails = p.max_fails;
            us.fail_timeout = p.fail_timeout;
            us.set_backup(p.backup as u32);
            us.down = p.down as ngx_uint_t;
        }
        Ok(())
    }
}

/// The IP addresses and ports of an upstream block's `server` lines (every
/// address a name resolved to, backup servers too; unix sockets are left out).
pub fn upstream_server_addrs(us: &ngx_http_upstream_srv_conf_t) -> Vec<std::net::SocketAddr> {
    upstream_servers(us, true)
        .into_iter()
        .filter_map(|(sa, _)| socket_addr(&sa))
        .collect()
}

/// The first `server` line of an upstream block with a parameter that
/// picks or weighs its servers (`down`, `backup`, `weight=`), as its name
/// and that parameter: a block whose servers are all asked alike (the
/// Sentinels of `cache_sentinel`) takes none.
pub fn weighed_server(us: &ngx_http_upstream_srv_conf_t) -> Option<(String, &'static str)> {
    // SAFETY: as in upstream_servers.
    let servers =
        unsafe { us.servers.as_ref() }.map_or(&[][..], |a| unsafe { a.as_slice::<ngx_http_upstream_server_t>() });
    servers.iter().find_map(|s| {
        let which = if s.down != 0 {
            "down"
        } else if s.backup() != 0 {
            "backup"
        } else if s.weight != 1 {
            "weight="
        } else {
            return None;
        };
        Some((String::from_utf8_lossy(s.name.as_bytes()).into_owned(), which))
    })
}

/// The addresses of an upstream block's `server` lines, in order (backup
/// ones too, last, as they are written last), as sockaddr bytes and the
/// name nginx gives each; those marked `down` too when `with_down`.
pub fn upstream_servers(us: &ngx_http_upstream_srv_conf_t, with_down: bool) -> Vec<(Vec<u8>, String)> {
    // SAFETY: the block's servers array, of ngx_http_upstream_server_t, in
    // configuration memory (null for a block made by proxy_pass and the like).
    let servers =
        unsafe { us.servers.as_ref() }.map_or(&[][..], |a| unsafe { a.as_slice::<ngx_http_upstream_server_t>() });
    let mut out = Vec::new();
    for s in servers
        .iter()
        .filter(|s| !s.addrs.is_null() && (with_down || s.down == 0))
    {
        // SAFETY: naddrs addresses, in configuration memory.
        let addrs = unsafe { std::slice::from_raw_parts(s.addrs, s.naddrs) };
        for a in addrs.iter().filter(|a| !a.sockaddr.is_null()) {
            // SAFETY: socklen bytes of the address, in configuration memory.
            let sa = unsafe { std::slice::from_raw_parts(a.sockaddr as *const u8, a.socklen as usize) };
            out.push((sa.to_vec(), String::from_utf8_lossy(a.name.as_bytes()).into_owned()));
        }
    }
    out
}

/// A sockaddr's bytes for an IP address and port (the inverse of
/// `socket_addr`): sockaddr_in or sockaddr_in6, zeros where unset.
pub fn sockaddr_bytes(addr: std::net::SocketAddr) -> Vec<u8> {
    use std::net::SocketAddr;
    let mut out = Vec::with_capacity(28);
    match addr {
        SocketAddr::V4(a) => {
            out.extend_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&a.ip().octets());
            out.resize(std::mem::size_of::<libc::sockaddr_in>(), 0);
        }
        SocketAddr::V6(a) => {
            out.extend_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&a.ip().octets());
            out.resize(std::mem::size_of::<libc::sockaddr_in6>(), 0);
        }
    }
    out
}

/// The IP address and port of a sockaddr's bytes (IPv4, IPv6).
pub fn socket_addr(sa: &[u8]) -> Option<std::net::SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let family = i32::from(u16::from_ne_bytes([*sa.first()?, *sa.get(1)?]));
    let port = u16::from_be_bytes([*sa.get(2)?, *sa.get(3)?]);
    match family {
        libc::AF_INET => {
            let ip: [u8; 4] = sa.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
        }
        libc::AF_INET6 => {
            let ip: [u8; 16] = sa.get(8..24)?.try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port))
        }
        _ => None,
    }
}

/// The upstream blocks of an upstream module's main configuration.
pub fn upstream_blocks(
    umcf: &ngx_http_upstream_main_conf_t,
) -> impl Iterator<Item = &ngx_http_upstream_srv_conf_t> + '_ {
    // SAFETY: the upstream module's array of upstream configurations, in
    // configuration memory (which outlives its requests and the reading).
    let blocks = unsafe { umcf.upstreams.as_slice::<*mut ngx_http_upstream_srv_conf_t>() };
    // SAFETY: as above.
    blocks.iter().filter_map(|&u| unsafe { u.as_ref() })
}

/// The upstream block a location's upstream settings name (`*_pass` to a
/// block), None for an address given by a variable.
pub fn block_of(u: &ngx_http_upstream_conf_t) -> Option<&'static ngx_http_upstream_srv_conf_t> {
    // SAFETY: null, or a block of the configuration nginx made (upstream
    // settings are configuration memory, written while it is read), which
    // lives as long as the configuration and its requests.
    unsafe { u.upstream.as_ref() }
}

/// Where an upstream block was written (`file:line`), for messages.
pub fn block_position(u: &ngx_http_upstream_srv_conf_t) -> String {
    if u.file_name.is_null() {
        return format!("?:{}", u.line);
    }
    // SAFETY: nginx keeps the block's file name, NUL-terminated, in
    // configuration memory.
    let file = unsafe { std::ffi::CStr::from_ptr(u.file_name as *const std::ffi::c_char) };
    format!("{}:{}", file.to_string_lossy(), u.line)
}

/// The number of `server` lines of an upstream block.
pub fn server_count(u: &ngx_http_upstream_srv_conf_t) -> usize {
    // SAFETY: a block's servers array, in configuration memory (null for a
    // block made by proxy_pass and the like).
    unsafe { u.servers.as_ref() }.map_or(0, |s| s.nelts)
}

impl Conf<'_> {
    /// nginx's round robin for an upstream block (its init_upstream).
    pub fn init_round_robin(&self, us: &mut ngx_http_upstream_srv_conf_t) -> Result<(), ConfError> {
        // SAFETY: the configuration being initialized and one of its blocks.
        if unsafe { ngx_http_upstream_init_round_robin(self.raw_ptr(), us) } != OK {
            return Err(ConfError::Logged);
        }
        Ok(())
    }
}
