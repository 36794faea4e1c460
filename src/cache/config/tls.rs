//! The cache gateway's TLS settings: `cache_ssl_verify` and the files of
//! `cache_ssl_trusted_certificate`, `cache_ssl_certificate` and
//! `cache_ssl_certificate_key` (each kept with where it was written, for
//! `nginx -t`'s messages: they are checked when the levels are merged), the
//! TLS context a location gets, and the rule that locations passing to one
//! upstream agree on their settings.

use std::ptr::NonNull;

use super::{merge_or, CacheLocConf, PendingPass};
use crate::ffi::conf::{on_off, ConfError, Position};
use crate::ffi::ssl::SslFiles;
use crate::ffi::*;
use crate::log;

/// A file that a directive names, and where the directive is.
#[derive(Debug, Clone)]
pub struct FileAt {
    pub name: Vec<u8>,
    pub at: Position,
}

impl FileAt {
    /// The message for `nginx -t`, at this directive's line.
    fn error(&self, m: String) -> ConfError {
        ConfError::At(m, self.at.clone())
    }
}

impl CacheLocConf {
    /// The `cache_ssl_*` settings, inherited; with `cache_ssl on` in a
    /// location that passes requests, its TLS context (the parent's, when
    /// nothing of it changed).
    pub(super) fn merge_ssl(&mut self, prev: &CacheLocConf, conf: Conf) -> Result<(), ConfError> {
        let (p, u) = (&prev.upstream, &mut self.upstream);
        merge_or(&mut self.ssl, prev.ssl, CONF_UNSET, 0);
        if u.ssl_verify == CONF_UNSET {
            self.ssl_verify_at = prev.ssl_verify_at.clone();
        }
        merge_or(&mut u.ssl_verify, p.ssl_verify, CONF_UNSET, 0);
        merge_or(&mut u.ssl_server_name, p.ssl_server_name, CONF_UNSET, 0);
        merge_or(&mut u.ssl_session_reuse, p.ssl_session_reuse, CONF_UNSET, 1);
        merge_or(&mut self.ssl_verify_depth, prev.ssl_verify_depth, CONF_UNSET, 1);
        let unset: *mut ngx_http_complex_value_t = CONF_UNSET_PTR.cast();
        merge_or(&mut u.ssl_name, p.ssl_name, unset, std::ptr::null_mut());
        for (this, parent) in [
            (&mut self.ssl_trusted_certificate, &prev.ssl_trusted_certificate),
            (&mut self.ssl_certificate, &prev.ssl_certificate),
            (&mut self.ssl_certificate_key, &prev.ssl_certificate_key),
        ] {
            if this.is_none() {
                this.clone_from(parent);
            }
        }
        let passes = !self.upstream.upstream.is_null() || self.pass_var.is_some();
        if self.ssl == 0 || !passes {
            return Ok(());
        }
        let files = self.ssl_files()?;
        if self.upstream.ssl_verify == 1 && files.trusted.is_none() {
            let m = "no \"cache_ssl_trusted_certificate\" for \"cache_ssl_verify\"".to_owned();
            return Err(match &self.ssl_verify_at {
                Some(at) => ConfError::At(m, at.clone()),
                None => m.into(),
            });
        }
        // SAFETY: a complex value compiled into configuration memory.
        let text = unsafe { self.upstream.ssl_name.as_ref() }.map(|cv| (cv.value.as_bytes(), cv.lengths.is_null()));
        let name = text.map(|(n, _)| String::from_utf8_lossy(n).into_owned());
        self.ssl_name_text = text.map(|(n, literal)| (n.to_vec(), literal));
        self.tls = format!(
            "{files:?} verify={} server_name={} name={name:?}",
            self.upstream.ssl_verify, self.upstream.ssl_server_name
        );
        self.upstream.ssl = match (NonNull::new(prev.upstream.ssl), prev.ssl_files()) {
            (Some(ctx), Ok(pf)) if pf == files => ctx.as_ptr(),
            _ => conf.ssl_context(&files)?.as_ptr(),
        };
        Ok(())
    }

    /// The files of the TLS context; a mistake in them is named at the
    /// line of the directive at fault.
    fn ssl_files(&self) -> Result<SslFiles, ConfError> {
        for (f, d) in [
            (&self.ssl_trusted_certificate, "cache_ssl_trusted_certificate"),
            (&self.ssl_certificate, "cache_ssl_certificate"),
            (&self.ssl_certificate_key, "cache_ssl_certificate_key"),
        ] {
            if let Some(f) = f.as_ref().filter(|f| f.name.is_empty()) {
                return Err(f.error(format!("empty file name in \"{d}\"")));
            }
        }
        let certificate = match (&self.ssl_certificate, &self.ssl_certificate_key) {
            (Some(c), Some(k)) => Some((c.name.clone(), k.name.clone())),
            (None, None) => None,
            (Some(c), None) => {
                return Err(c.error("no \"cache_ssl_certificate_key\" for \"cache_ssl_certificate\"".to_owned()))
            }
            (None, Some(k)) => {
                return Err(k.error("no \"cache_ssl_certificate\" for \"cache_ssl_certificate_key\"".to_owned()))
            }
        };
        Ok(SslFiles {
            certificate,
            trusted: self.ssl_trusted_certificate.as_ref().map(|f| f.name.clone()),
            verify_depth: self.ssl_verify_depth,
            session_reuse: self.upstream.ssl_session_reuse != 0,
        })
    }
}

directive_handler! {
    /// `cache_ssl_verify on | off`
    pub(crate) fn cmd_cache_ssl_verify = "cmd_cache_ssl_verify",
    |cf: Conf, lcf: &mut CacheLocConf| {
        if lcf.upstream.ssl_verify != CONF_UNSET {
            return Err(crate::ffi::conf::duplicate("cache_ssl_verify"));
        }
        lcf.upstream.ssl_verify = on_off("cache_ssl_verify", cf.args()[1])?.into();
        lcf.ssl_verify_at = Some(cf.position());
        Ok(())
    }
}

/// A directive that names a file: the name, and where it was written.
fn file_directive(cf: Conf, slot: &mut Option<FileAt>) -> Result<(), ConfError> {
    if slot.is_some() {
        return Err(crate::ffi::conf::duplicate(&cf.directive()));
    }
    *slot = Some(FileAt {
        name: cf.args()[1].to_vec(),
        at: cf.position(),
    });
    Ok(())
}

directive_handler! {
    /// `cache_ssl_trusted_certificate file`
    pub(crate) fn cmd_cache_ssl_trusted_certificate = "cmd_cache_ssl_trusted_certificate",
    |cf: Conf, lcf: &mut CacheLocConf| file_directive(cf, &mut lcf.ssl_trusted_certificate)
}

directive_handler! {
    /// `cache_ssl_certificate file`
    pub(crate) fn cmd_cache_ssl_certificate = "cmd_cache_ssl_certificate",
    |cf: Conf, lcf: &mut CacheLocConf| file_directive(cf, &mut lcf.ssl_certificate)
}

directive_handler! {
    /// `cache_ssl_certificate_key file`
    pub(crate) fn cmd_cache_ssl_certificate_key = "cmd_cache_ssl_certificate_key",
    |cf: Conf, lcf: &mut CacheLocConf| file_directive(cf, &mut lcf.ssl_certificate_key)
}

/// nginx keeps connections (`keepalive`) and TLS sessions per upstream
/// block, whatever the location that made them: locations passing to one
/// upstream (a literal `host:port` written twice is one too) must agree on
/// their TLS settings, or a connection or session that one location's
/// settings let in would serve another's requests unchecked.
pub(super) fn same_tls_per_upstream(cf: &Conf, pending: &[PendingPass]) -> Result<(), ConfError> {
    let mut seen: std::collections::HashMap<usize, &PendingPass> = Default::default();
    for p in pending {
        if p.upstream.is_null() {
            continue;
        }
        let Some(first) = seen.get(&(p.upstream as usize)) else {
            seen.insert(p.upstream as usize, p);
            continue;
        };
        // SAFETY: locations' configurations live as long as the
        // configuration; merging is over.
        let (a, b) = unsafe { (&*first.lcf, &*p.lcf) };
        if a.tls != b.tls {
            // SAFETY: as above.
            let name = String::from_utf8_lossy(unsafe { (*p.upstream).host.as_bytes() }).into_owned();
            log!(
                NGX_LOG_EMERG,
                cf.log(),
                "\"cache_pass\" to \"{name}\" in {}:{} and in {}:{} with different \"cache_ssl*\" settings: \
                 nginx keeps connections and TLS sessions per upstream, so give each setting an upstream block of its own",
                first.claim.file(),
                first.claim.line(),
                p.claim.file(),
                p.claim.line()
            );
            return Err(ConfError::Logged);
        }
    }
    Ok(())
}
