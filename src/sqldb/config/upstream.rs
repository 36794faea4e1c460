//! The directives of `upstream` blocks (`sqldb_server`, `sqldb_keepalive`,
//! `sqldb_pipeline`), the `$sqldb_*` variables, and what is settled once
//! the whole http block is read.

use std::ffi::CString;

use gateway_core::conninfo::{self, Address, Keywords};

use super::{Entries, MainConf, Sqldb, SrvConf, Var};
use crate::common::upstream::Owner;
use crate::ffi::conf::{block_position, on_off, server_count, socket_addr, ConfError, ServerParams};
use crate::ffi::*;
use crate::log;
use crate::sqldb::driver::check_conninfo;

const DEFAULT_PORT: u16 = 5432;

/// A decimal number (what ngx_atoi takes: digits only).
pub fn atoi(v: &[u8]) -> Option<usize> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

directive_handler! {
    /// `sqldb_server ADDRESS [weight=N] [max_fails=N] [fail_timeout=T] [backup] [down] keyword=value ...`
    pub(crate) fn cmd_sqldb_server = "cmd_sqldb_server",
    server
}

fn server(cf: Conf, srv: &mut SrvConf) -> Result<(), ConfError> {
    let args = cf.args();
    let address = args[1];
    let mut params = ServerParams {
        weight: 1,
        max_fails: 1,
        fail_timeout: 10,
        backup: false,
        down: false,
    };
    let mut keywords = Keywords::default();
    let flags = cf.with_upstream_block(|block| {
        srv.name = String::from_utf8_lossy(block.host.as_bytes()).into_owned();
        block.flags
    });
    for &a in &args[2..] {
        let text = String::from_utf8_lossy(a);
        let (needed, ok) = if let Some(v) = a.strip_prefix(b"weight=") {
            params.weight = atoi(v).unwrap_or(0);
            (NGX_HTTP_UPSTREAM_WEIGHT, params.weight > 0)
        } else if let Some(v) = a.strip_prefix(b"max_fails=") {
            let n = atoi(v);
            params.max_fails = n.unwrap_or(0);
            (NGX_HTTP_UPSTREAM_MAX_FAILS, n.is_some())
        } else if let Some(v) = a.strip_prefix(b"fail_timeout=") {
            let t = cf.parse_time(v, true);
            params.fail_timeout = t.unwrap_or(0) as time_t;
            (NGX_HTTP_UPSTREAM_FAIL_TIMEOUT, t.is_some())
        } else if a == b"backup" {
            params.backup = true;
            (NGX_HTTP_UPSTREAM_BACKUP, true)
        } else if a == b"down" {
            params.down = true;
            (NGX_HTTP_UPSTREAM_DOWN, true)
        } else {
            keywords
                .push_arg(&text)
                .map_err(|e| format!("\"sqldb_server\" directive: {e}"))?;
            continue;
        };
        if flags & needed as ngx_uint_t == 0 {
            return Err(format!("balancing method does not support parameter \"{text}\"").into());
        }
        if !ok {
            return Err(format!("invalid parameter \"{text}\"").into());
        }
    }

    let shown = String::from_utf8_lossy(address);
    let url = cf
        .parse_url(address, keywords.port().unwrap_or(DEFAULT_PORT))
        .map_err(|e| format!("{e} in \"{shown}\" of the \"sqldb_server\" directive"))?;
    let unix = address.starts_with(b"unix:");
    if !unix && !url.no_port && keywords.port().is_some() {
        return Err(format!(
            "\"port=\" conflicts with the port of the address \"{shown}\" in the \"sqldb_server\" directive"
        )
        .into());
    }
    for a in &url.addrs {
        let text = if unix {
            let dir = String::from_utf8_lossy(&address[5..]).into_owned();
            conninfo::build(&Address::Unix { dir: &dir }, &keywords)
        } else {
            let addr = socket_addr(&a.sockaddr).ok_or("unsupported address family in \"sqldb_server\"".to_owned())?;
            let bare = url.host.trim_start_matches('[').trim_end_matches(']');
            let name = bare.parse::<std::net::IpAddr>().is_err().then_some(url.host.as_str());
            conninfo::build(&Address::Tcp { addr, name }, &keywords)
        };
        let conninfo = CString::new(text).map_err(|_| "\"sqldb_server\" parameters contain a NUL byte".to_owned())?;
        // libpq's own reading of the keywords, now rather than at the first request.
        check_conninfo(&conninfo).map_err(|e| format!("\"sqldb_server\" directive: {e}"))?;
        srv.addrs.push(super::ServerAddr {
            sockaddr: a.sockaddr.clone(),
            at: a.at,
            name: a.name,
            conninfo,
        });
    }
    cf.add_upstream_server(&url, &params)?;
    srv.servers += 1;
    Ok(())
}

directive_handler! {
    /// `sqldb_keepalive off | max=N [mode=single|multi] [overflow=ignore|reject] [idle_timeout=T] [requests=N]`
    pub(crate) fn cmd_sqldb_keepalive = "cmd_sqldb_keepalive",
    |cf: Conf, srv: &mut SrvConf| {
        if srv.keepalive_set {
            return Err(crate::ffi::conf::duplicate("sqldb_keepalive"));
        }
        srv.keepalive_set = true;
        let args = cf.args();
        let s = &mut srv.settings;
        if args.len() == 2 && args[1].eq_ignore_ascii_case(b"off") {
            s.max = 0;
            return Ok(());
        }
        let mut seen: Vec<&[u8]> = Vec::new();
        for &a in &args[1..] {
            if let Some(eq) = a.iter().position(|&b| b == b'=') {
                let key = &a[..=eq];
                if seen.contains(&key) {
                    return Err(format!(
                        "parameter \"{}\" is duplicate in \"sqldb_keepalive\" directive",
                        String::from_utf8_lossy(key)
                    )
                    .into());
                }
                seen.push(key);
            }
            // Values in any letter case, as the C module takes them; max=0 is off.
            let ok = if let Some(v) = a.strip_prefix(b"max=") {
                atoi(v).map(|n| s.max = n).is_some()
            } else if let Some(v) = a.strip_prefix(b"mode=") {
                s.single = v.eq_ignore_ascii_case(b"single");
                s.single || v.eq_ignore_ascii_case(b"multi")
            } else if let Some(v) = a.strip_prefix(b"overflow=") {
                s.reject = v.eq_ignore_ascii_case(b"reject");
                s.reject || v.eq_ignore_ascii_case(b"ignore")
            } else if let Some(v) = a.strip_prefix(b"idle_timeout=") {
                let t = cf.parse_time(v, false).filter(|&t| t > 0);
                t.map(|t| s.idle_timeout = t as ngx_msec_t).is_some()
            } else if let Some(v) = a.strip_prefix(b"requests=") {
                atoi(v).map(|n| s.max_requests = n as u64).is_some()
            } else {
                false
            };
            if !ok {
                return Err(format!(
                    "invalid parameter \"{}\" in \"sqldb_keepalive\" directive, it must be off, or max=N with mode=single|multi, overflow=ignore|reject, idle_timeout=time, requests=N",
                    String::from_utf8_lossy(a)
                )
                .into());
            }
        }
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_pipeline on | off [depth=N] [slow=T]` (upstream): queue requests
    /// onto busy connections, while their queues are shorter than `depth` and
    /// the query in front has run less than `slow`.
    pub(crate) fn cmd_sqldb_pipeline = "cmd_sqldb_pipeline",
    |cf: Conf, srv: &mut SrvConf| {
        if srv.pipeline_set {
            return Err(crate::ffi::conf::duplicate("sqldb_pipeline"));
        }
        srv.pipeline_set = true;
        let args = cf.args();
        let s = &mut srv.settings;
        s.pipelining = on_off("sqldb_pipeline", args[1])?;
        let mut seen: Vec<&[u8]> = Vec::new();
        for &a in &args[2..] {
            let key = a.split(|&b| b == b'=').next().unwrap_or(a);
            let ok = if !s.pipelining {
                return Err(format!(
                    "parameter \"{}\" in \"sqldb_pipeline\" directive needs \"on\"",
                    String::from_utf8_lossy(a)
                )
                .into());
            } else if seen.contains(&key) {
                return Err(format!(
                    "parameter \"{}\" is duplicate in \"sqldb_pipeline\" directive",
                    String::from_utf8_lossy(key)
                )
                .into());
            } else if let Some(v) = a.strip_prefix(b"depth=") {
                atoi(v).filter(|&n| n > 0).map(|n| s.depth = n).is_some()
            } else if let Some(v) = a.strip_prefix(b"slow=") {
                let t = cf.parse_time(v, false).filter(|&t| t > 0);
                t.map(|t| s.slow = t as ngx_msec_t).is_some()
            } else {
                false
            };
            if !ok {
                return Err(format!(
                    "invalid parameter \"{}\" in \"sqldb_pipeline\" directive",
                    String::from_utf8_lossy(a)
                )
                .into());
            }
            seen.push(key);
        }
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_keep_role on | off` (upstream): whether the sessions of its
    /// connections keep a token's role between requests (session.rs).
    pub(crate) fn cmd_sqldb_keep_role = "cmd_sqldb_keep_role",
    |cf: Conf, srv: &mut SrvConf| {
        if srv.keep_role_set {
            return Err(crate::ffi::conf::duplicate("sqldb_keep_role"));
        }
        srv.keep_role_set = true;
        srv.settings.keep_role = on_off("sqldb_keep_role", cf.args()[1])?;
        Ok(())
    }
}

/// Our SrvConf of an upstream block, if the block has `sqldb_server` lines
/// (read only: what changes at run time is the worker's, driver::worker).
pub fn sqldb_srv_conf(uscf: &ngx_http_upstream_srv_conf_t) -> Option<&'static SrvConf> {
    use ngx::http::HttpModuleServerConf;
    Sqldb::server_conf(uscf).filter(|s| s.servers > 0)
}

/// The database gateway as the owner of a block of `sqldb_server` lines
/// (for the cache gateway's checks, through lib.rs).
pub fn owner_of(uscf: &ngx_http_upstream_srv_conf_t) -> Option<Owner> {
    sqldb_srv_conf(uscf).map(|_| Owner {
        server: "sqldb_server",
        pass: "sqldb_pass",
    })
}

/// The upstream block a name refers to, if it has `sqldb_server` lines.
pub fn find_upstream(
    upstreams: &[*mut ngx_http_upstream_srv_conf_t],
    name: &[u8],
) -> Option<*mut ngx_http_upstream_srv_conf_t> {
    upstreams.iter().copied().find(|&u| {
        // SAFETY: the upstream module's configurations live as long as the configuration.
        unsafe { u.as_ref() }
            .is_some_and(|u| u.host.as_bytes().eq_ignore_ascii_case(name) && sqldb_srv_conf(u).is_some())
    })
}

/// The prefix of the variables of a token's claims.
pub const CLAIM_PREFIX: &str = "sqldb_jwt_claim_";

variable_handler! {
    /// Until the gateway stores a value, a variable is not found.
    pub(crate) fn not_set(_r, v, _data) = "variable", {
        v.set_not_found(1);
        OK
    }
}

conf_step_handler! {
    /// Declares the `$sqldb_*` variables and the `$sqldb_jwt_claim_NAME`
    /// prefix (preconfiguration: before any directive is read, so that
    /// directives see the prefix as nginx's own).
    pub(crate) fn preconfiguration<E: Entries> = "preconfiguration",
    |cf: Conf| {
        for (_, name) in Var::ALL {
            cf.add_variable(name.as_bytes(), NGX_HTTP_VAR_NOHASH, |v| v.get_handler = Some(not_set))
                .ok_or(ConfError::Logged)?;
        }
        let flags = NGX_HTTP_VAR_PREFIX | NGX_HTTP_VAR_NOCACHEABLE;
        cf.add_variable(CLAIM_PREFIX.as_bytes(), flags, |v| v.get_handler = E::CLAIM)
            .ok_or(ConfError::Logged)?;
        Ok(())
    }
}

conf_step_handler! {
    /// After the whole http block is read: each sqldb upstream checked and its
    /// balancer wrapped, `sqldb_pass NAME` resolved and the variables' indexes
    /// known.
    pub(crate) fn postconfiguration<E: Entries> = "postconfiguration",
    postconfigure::<E>
}

fn postconfigure<E: Entries>(cf: Conf) -> Result<(), ConfError> {
    let upstreams = cf.upstreams();
    let mut wants_threads = true;
    for &uscf in &upstreams {
        // SAFETY: the upstream module's configurations live as long as the configuration.
        let Some(u) = (unsafe { uscf.as_mut() }) else { continue };
        // (While the configuration is read: its last changes.)
        let Some(srv) = <Sqldb as ngx::http::HttpModuleServerConf>::server_conf_mut(u).filter(|s| s.servers > 0) else {
            continue;
        };
        // Connections are made with their password's proof computed on a
        // thread (driver::events): nginx's default pool, when it has one.
        if std::mem::take(&mut wants_threads) && !crate::ffi::thread::want_pool(cf) {
            log!(
                NGX_LOG_NOTICE,
                cf.log(),
                "sqldb: no thread pool: new database connections are made in the worker's event loop"
            );
        }
        if server_count(u) != srv.servers {
            return Err(format!(
                "upstream \"{}\" mixes \"server\" and \"sqldb_server\" in {}",
                String::from_utf8_lossy(u.host.as_bytes()),
                block_position(u)
            )
            .into());
        }
        if srv.balancer_init.is_none() {
            srv.balancer_init = u.peer.init;
            u.peer.init = E::PEER_INIT;
        }
    }

    cf.with_main_conf::<Sqldb, _>(|mcf| resolve_passes(cf, mcf, &upstreams))
}

/// The variables' indexes, and each `sqldb_pass NAME` resolved to its block.
fn resolve_passes(
    cf: Conf,
    mcf: &mut MainConf,
    upstreams: &[*mut ngx_http_upstream_srv_conf_t],
) -> Result<(), ConfError> {
    for (i, (_, name)) in Var::ALL.iter().enumerate() {
        mcf.vars[i] = cf.variable_index(name.as_bytes()).ok_or(ConfError::Logged)?;
    }
    for p in mcf.pending.drain(..) {
        if p.claim.as_ref().is_some_and(|c| !c.holds(&cf)) {
            return Err(ConfError::Logged);
        }
        // SAFETY: a pending location's configuration lives as long as the
        // configuration; nothing else refers to it in this step.
        let lcf = unsafe { &mut *p.lcf };
        // (ngx_postgres answers 500 there too: the configuration stands.)
        if let (Some(claim), true, None) = (&p.claim, lcf.queries.is_empty(), &lcf.listen) {
            log!(
                NGX_LOG_WARN,
                cf.log(),
                "\"sqldb_pass\" has no \"sqldb_query\" or \"sqldb_listen\" in reach: its requests get 500 in {}:{}",
                claim.file(),
                claim.line()
            );
        }
        if lcf.pass_name.is_empty() {
            continue;
        }
        match find_upstream(upstreams, &lcf.pass_name) {
            Some(uscf) => lcf.upstream.upstream = uscf,
            // Reported once, where the directive is (an `if` block inherits it).
            None => {
                let Some(claim) = &p.claim else { continue };
                log!(
                    NGX_LOG_EMERG,
                    cf.log(),
                    "\"sqldb_pass\" names upstream \"{}\", which has no \"sqldb_server\" in {}:{}",
                    String::from_utf8_lossy(&lcf.pass_name),
                    claim.file(),
                    claim.line()
                );
                return Err(ConfError::Logged);
            }
        }
    }
    Ok(())
}
