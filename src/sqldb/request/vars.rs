//! Values out of a query into nginx (the `$sqldb_*` variables, `sqldb_set`,
//! `sqldb_rewrite`'s status), and `sqldb_escape`'s literals into it.

use gateway_core::formats::Decimal;
use gateway_core::rds::ResultSet;
use gateway_core::rewrite;
use gateway_core::sql::quote_literal;

use super::error::{Error, Kind};
use crate::ffi::*;
use crate::log;
use crate::sqldb::config::{Column, LocConf, Sqldb, Var};
use crate::sqldb::driver::{PgResult, ResultKind};

/// Stores one of the gateway's variables for the rest of the request.
pub fn store(r: &mut Req, var: Var, value: &[u8]) {
    let index = r.main_conf::<Sqldb>().var(var);
    r.set_variable(index, value);
}

/// `$sqldb_columns`, `$sqldb_rows`, `$sqldb_affected` of a result.
pub fn store_counts(r: &mut Req, res: &PgResult) {
    let (cols, rows) = if res.kind() == ResultKind::Tuples {
        (res.columns(), res.rows())
    } else {
        (0, 0)
    };
    store(r, Var::Columns, Decimal::of(cols as u64).bytes());
    store(r, Var::Rows, Decimal::of(rows as u64).bytes());
    // Only statements that change rows have a count (as the C module does):
    // `add_header X-Affected $sqldb_affected` adds nothing for a SELECT.
    if let Some(n) = res.affected() {
        store(r, Var::Affected, Decimal::of(n).bytes());
    }
}

/// Stores the cells `sqldb_set` asks for; a required one missing, NULL or
/// empty is an error.
pub fn apply_sets(r: &mut Req, lcf: &LocConf, res: &PgResult) -> Result<(), Error> {
    let rows = res.kind() == ResultKind::Tuples;
    for rule in &lcf.sets {
        let col = match &rule.column {
            Column::Index(c) => Some(*c),
            Column::Name(n) if rows => (0..res.columns()).find(|&c| res.column_name(c) == &n[..]),
            Column::Name(_) => None,
        };
        let cell = col
            .filter(|&c| rows && rule.row < res.rows() && c < res.columns())
            .and_then(|c| res.value(rule.row, c));
        match cell {
            Some(v) if !v.is_empty() || !rule.required => {
                r.set_variable(rule.index, v);
            }
            _ if rule.required => {
                return Err(Error::from(Kind::RequiredSet {
                    name: rule.name.clone(),
                    row: rule.row,
                    what: if cell.is_none() { "no value" } else { "an empty value" },
                }))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The `sqldb_rewrite` rule for this request and result: (status, keep the body).
pub fn rewrite(r: &Req, lcf: &LocConf, res: &PgResult) -> Option<(ngx_uint_t, bool)> {
    let rows = if res.kind() == ResultKind::Tuples {
        res.rows()
    } else {
        0
    };
    let facts = rewrite::Facts {
        rows: rows as u64,
        affected: res.affected(),
    };
    rewrite::choose(&lcf.rewrites, r.method(), facts).map(|w| (ngx_uint_t::from(w.status), w.keep_body))
}

/// Makes the escaped literals of the location right before its query is
/// built (once the body is read): after every phase before the content
/// (`set`, `auth_request_set`, ...) and anything that ran while the body
/// came, so that nothing writes the variables after they are escaped.
/// DECLINED when done, or the status to answer with.
pub(super) fn escape(r: &mut Req) -> ngx_int_t {
    let lcf: &LocConf = r.loc_conf::<Sqldb>();
    if lcf.escapes.is_empty() {
        return DECLINED;
    }
    // Every literal is made from the values as they are now, then stored: a rule never reads what another one escaped (a
    // server's `=$w` and a location's `$e =$w` both quote the value once).
    let mut literals = Vec::with_capacity(lcf.escapes.len());
    for rule in &lcf.escapes {
        let value = match rule.src {
            None => r.variable(rule.dst).unwrap_or_default().to_vec(),
            Some(cv) => match r.complex_value(cv) {
                Some(v) => v.to_vec(),
                None => return HTTP_INTERNAL_SERVER_ERROR,
            },
        };
        let literal = if value.is_empty() && !rule.empty_string {
            b"NULL".to_vec()
        } else {
            match quote_literal(&value) {
                Some(l) => l,
                None => {
                    log!(NGX_LOG_INFO, r.log(), "sqldb: a value to escape contains a NUL byte");
                    return HTTP_BAD_REQUEST;
                }
            }
        };
        literals.push((rule.dst, literal));
    }
    for (dst, literal) in literals {
        if !r.set_variable(dst, &literal) {
            return HTTP_INTERNAL_SERVER_ERROR;
        }
    }
    DECLINED
}

variable_handler! {
    /// `$sqldb_jwt_claim_NAME`: the claim NAME of the request's verified
    /// token (a string as it is, another value as JSON); not found without
    /// one, and for a value with a control character (CR and LF in a header
    /// line would start another header).
    pub(crate) fn claim_variable(r, v, data) = "claim_variable", {
        // SAFETY: for a prefix variable nginx passes the variable's whole
        // name (an ngx_str_t of the configuration) as data.
        let name = unsafe { (data as *const ngx_str_t).as_ref() };
        let claim = name
            .and_then(|n| {
                n.as_bytes()
                    .strip_prefix(crate::sqldb::config::upstream::CLAIM_PREFIX.as_bytes())
            })
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| super::ctx_of(r)?.claims.as_ref()?.get(n));
        let safe = claim.filter(|c| !c.bytes().any(|b| b < 0x20 || b == 0x7f));
        let stored = safe.and_then(|c| r.pool().str(c.as_bytes()));
        match stored {
            Some(s) => fill_variable(v, s),
            None => v.set_not_found(1),
        }
        OK
    }
}
