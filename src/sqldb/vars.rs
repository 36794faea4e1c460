//! Values out of a query into nginx: the `$sqldb_*` variables,
//! `sqldb_set` (a cell into a variable), `sqldb_rewrite` (the status from
//! the result) and `sqldb_escape` (a quoted SQL literal made from a variable).

use std::ffi::{c_char, c_void};
use std::ptr;

use gateway_core::rds::ResultSet;
use gateway_core::rewrite;
use gateway_core::sql::quote_literal;

use super::conf::{LocConf, MainConf};
use super::pq::{PgResult, ResultKind};
use crate::ffi::*;
use crate::ngx_http_gateway_module as MODULE;

/// The variables the gateway fills in, in `MainConf::vars` order.
pub const NAMES: [&str; 5] = [
    "sqldb_columns",
    "sqldb_rows",
    "sqldb_affected",
    "sqldb_query",
    "sqldb_error",
];
pub const COLUMNS: usize = 0;
pub const ROWS: usize = 1;
pub const AFFECTED: usize = 2;
pub const QUERY: usize = 3;
pub const ERROR_TEXT: usize = 4;

/// Until the gateway stores a value, a variable is not found.
unsafe extern "C" fn not_set(r: *mut ngx_http_request_t, v: *mut ngx_variable_value_t, _data: usize) -> ngx_int_t {
    // SAFETY: nginx passes a live request and the value slot to fill.
    guard(unsafe { client_log(r) }, "variable", ERROR, || {
        unsafe { (*v).set_not_found(1) };
        OK
    })
}

/// Declares the `$sqldb_*` variables (preconfiguration).
pub(crate) unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
    // SAFETY: cf is the http block being read.
    guard(unsafe { (*cf).log }, "preconfiguration", ERROR, || {
        for name in NAMES {
            let mut n = static_str(name);
            // SAFETY: cf is the http block being read.
            let v = unsafe { ngx_http_add_variable(cf, &mut n, NGX_HTTP_VAR_NOHASH as ngx_uint_t) };
            if v.is_null() {
                return ERROR;
            }
            // SAFETY: v was just added.
            unsafe { (*v).get_handler = Some(not_set) };
        }
        OK
    })
}

/// Looks up the variables' indexes and installs the escape handler
/// (postconfiguration).
///
/// # Safety
/// `cf` must be the http block's configuration.
pub unsafe fn postconfiguration(cf: *mut ngx_conf_t, mcf: &mut MainConf) -> ngx_int_t {
    // SAFETY: see above.
    unsafe {
        for (i, name) in NAMES.iter().enumerate() {
            let mut n = static_str(name);
            mcf.vars[i] = ngx_http_get_variable_index(cf, &mut n);
            if mcf.vars[i] == ERROR {
                return ERROR;
            }
        }
        let cmcf: *mut ngx_http_core_main_conf_t =
            http_conf_get(cf, ptr::addr_of!(ngx_http_core_module), ConfSlot::Main);
        let phase = &mut (*cmcf).phases[ngx_http_phases_NGX_HTTP_PREACCESS_PHASE as usize];
        let h = ngx_array_push(&mut phase.handlers) as *mut ngx_http_handler_pt;
        if h.is_null() {
            return ERROR;
        }
        *h = Some(escape_handler);
        OK
    }
}

/// Stores a value for the rest of the request (internal redirects included,
/// so an `error_page` location sees it).
///
/// # Safety
/// `r` must be live; `index` an index of this configuration's variables.
pub unsafe fn store(r: *mut ngx_http_request_t, index: ngx_int_t, value: &[u8]) -> bool {
    if index < 0 {
        return true;
    }
    // SAFETY: see above; the value is copied into the request pool.
    unsafe {
        let Some(s) = pool_str((*r).pool, value) else {
            return false;
        };
        let v = &mut *(*r).variables.add(index as usize);
        v.set_len(s.len as u32);
        v.data = s.data;
        v.set_valid(1);
        v.set_no_cacheable(0);
        v.set_not_found(0);
        v.set_escape(0);
        true
    }
}

/// The gateway's own variables, by their `NAMES` position.
///
/// # Safety
/// `r` must be live.
pub unsafe fn store_own(r: *mut ngx_http_request_t, which: usize, value: &[u8]) {
    // SAFETY: r is live; the main configuration is ours.
    unsafe {
        let mcf = &*(*(*r).main_conf.add((*ptr::addr_of!(MODULE)).ctx_index) as *const MainConf);
        store(r, mcf.vars[which], value);
    }
}

/// `$sqldb_columns`, `$sqldb_rows`, `$sqldb_affected` of a result.
///
/// # Safety
/// `r` must be live.
pub unsafe fn store_counts(r: *mut ngx_http_request_t, res: &PgResult) {
    let (cols, rows) = if res.kind() == ResultKind::Tuples {
        (res.columns(), res.rows())
    } else {
        (0, 0)
    };
    // SAFETY: r is live.
    unsafe {
        store_own(r, COLUMNS, cols.to_string().as_bytes());
        store_own(r, ROWS, rows.to_string().as_bytes());
        // Only statements that change rows have a count (as the C module does):
        // `add_header X-Affected $sqldb_affected` adds nothing for a SELECT.
        if let Some(n) = res.affected() {
            store_own(r, AFFECTED, n.to_string().as_bytes());
        }
    }
}

// ------------------------------------------------------------ sqldb_set ----

pub enum Column {
    Index(usize),
    Name(Vec<u8>),
}

pub struct SetRule {
    index: ngx_int_t,
    name: String,
    row: usize,
    column: Column,
    required: bool,
}

impl SetRule {
    pub fn clone_rule(&self) -> SetRule {
        let column = match &self.column {
            Column::Index(i) => Column::Index(*i),
            Column::Name(n) => Column::Name(n.clone()),
        };
        SetRule {
            index: self.index,
            name: self.name.clone(),
            row: self.row,
            column,
            required: self.required,
        }
    }
}

/// Adds a variable that `sqldb_set` / `sqldb_escape` writes (as `set` does).
///
/// # Safety
/// `cf` must be the live configuration being parsed.
unsafe fn writable_variable(cf: *mut ngx_conf_t, arg: &ngx_str_t) -> Result<ngx_int_t, *mut c_char> {
    // SAFETY: see above; the name is in configuration memory.
    unsafe {
        let name = bytes(arg);
        let Some(bare) = name.strip_prefix(b"$") else {
            let text = String::from_utf8_lossy(name);
            return Err(conf_error(cf, format_args!("invalid variable name \"{text}\"")));
        };
        let mut n = ngx_str_t {
            len: bare.len(),
            data: arg.data.add(1),
        };
        let v = ngx_http_add_variable(cf, &mut n, NGX_HTTP_VAR_CHANGEABLE as ngx_uint_t);
        if v.is_null() {
            return Err(CONF_ERROR);
        }
        if (*v).get_handler.is_none() {
            (*v).get_handler = Some(not_set);
        }
        let index = ngx_http_get_variable_index(cf, &mut n);
        if index == ERROR {
            return Err(CONF_ERROR);
        }
        Ok(index)
    }
}

/// `sqldb_set $var ROW COLUMN|NAME [optional|required]`
pub(crate) unsafe extern "C" fn cmd_sqldb_set(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's LocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_set", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut LocConf);
        let args = conf_args(cf);
        let index = match writable_variable(cf, &args[1]) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let number = |a: &ngx_str_t| std::str::from_utf8(bytes(a)).ok().and_then(|s| s.parse::<usize>().ok());
        let Some(row) = number(&args[2]) else {
            let text = String::from_utf8_lossy(bytes(&args[2]));
            return conf_error(cf, format_args!("invalid row \"{text}\" in \"sqldb_set\" directive"));
        };
        let column = match number(&args[3]) {
            Some(c) => Column::Index(c),
            None => Column::Name(bytes(&args[3]).to_vec()),
        };
        let required = match args.get(4).map(|a| bytes(a).to_ascii_lowercase()).as_deref() {
            None | Some(b"optional") => false,
            Some(b"required") => true,
            Some(other) => {
                let text = String::from_utf8_lossy(other);
                return conf_error(
                    cf,
                    format_args!(
                        "invalid value \"{text}\" in \"sqldb_set\" directive, it must be \"optional\" or \"required\""
                    ),
                );
            }
        };
        let name = String::from_utf8_lossy(bytes(&args[1])).into_owned();
        lcf.sets.push(SetRule {
            index,
            name,
            row,
            column,
            required,
        });
        CONF_OK
    })
}

/// Stores the cells `sqldb_set` asks for; Err with the status when a
/// required one is missing, NULL or empty.
///
/// # Safety
/// `r` must be live.
pub unsafe fn apply_sets(r: *mut ngx_http_request_t, lcf: &LocConf, res: &PgResult) -> Result<(), ngx_int_t> {
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
        if let Some(v) = cell.filter(|v| !v.is_empty() || !rule.required) {
            // SAFETY: r is live.
            if !unsafe { store(r, rule.index, v) } {
                return Err(HTTP_INTERNAL_SERVER_ERROR);
            }
        } else if rule.required {
            // SAFETY: r is live.
            let log = unsafe { client_log(r) };
            let what = if cell.is_none() { "no value" } else { "an empty value" };
            let (name, row) = (&rule.name, rule.row);
            log!(
                NGX_LOG_ERR,
                log,
                "sqldb: \"sqldb_set {name}\" is required, the result has {what} at row {row}"
            );
            return Err(HTTP_INTERNAL_SERVER_ERROR);
        }
    }
    Ok(())
}

// -------------------------------------------------------- sqldb_rewrite ----

/// `sqldb_rewrite [METHOD ...] no_changes | changes | no_rows | rows [=]CODE`
pub(crate) unsafe extern "C" fn cmd_sqldb_rewrite(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's LocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_rewrite", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut LocConf);
        let args = conf_args(cf);
        match rewrite::parse_rule(args[1..].iter().map(|a| bytes(a))) {
            Ok(rule) => lcf.rewrites.push(rule),
            Err(e) => return conf_error(cf, format_args!("{e} in \"sqldb_rewrite\" directive")),
        }
        CONF_OK
    })
}

/// The `sqldb_rewrite` rule for this request and result: (status, keep the body).
///
/// # Safety
/// `r` must be live.
pub unsafe fn rewrite(r: *mut ngx_http_request_t, lcf: &LocConf, res: &PgResult) -> Option<(ngx_uint_t, bool)> {
    // SAFETY: r is live.
    let method = unsafe { (*r).method } as u32;
    let rows = if res.kind() == ResultKind::Tuples {
        res.rows()
    } else {
        0
    };
    let facts = rewrite::Facts {
        rows: rows as u64,
        affected: res.affected(),
    };
    rewrite::choose(&lcf.rewrites, method, facts).map(|w| (ngx_uint_t::from(w.status), w.keep_body))
}

// --------------------------------------------------------- sqldb_escape ----

pub struct EscapeRule {
    dst: ngx_int_t,
    /// The value to escape; none: the variable's own value.
    src: *mut ngx_http_complex_value_t,
    /// An empty value is `''` rather than NULL.
    empty_string: bool,
}

impl EscapeRule {
    pub fn clone_rule(&self) -> EscapeRule {
        EscapeRule { ..*self }
    }
}

/// `sqldb_escape $dst [[=]$src]`
pub(crate) unsafe extern "C" fn cmd_sqldb_escape(
    cf: *mut ngx_conf_t,
    _cmd: *mut ngx_command_t,
    conf: *mut c_void,
) -> *mut c_char {
    // SAFETY: conf is this module's LocConf; cf is live.
    guard(unsafe { (*cf).log }, "cmd_sqldb_escape", CONF_ERROR, || unsafe {
        let lcf = &mut *(conf as *mut LocConf);
        let args = conf_args(cf);
        let mut empty_string = false;
        let mut name = args[1];
        // `sqldb_escape =$var`: in place, an empty value as ''.
        if args.len() == 2 && bytes(&name).starts_with(b"=") {
            empty_string = true;
            name.data = name.data.add(1);
            name.len -= 1;
        }
        let dst = match writable_variable(cf, &name) {
            Ok(i) => i,
            Err(e) => return e,
        };
        let mut src = ptr::null_mut();
        if let Some(a) = args.get(2) {
            let mut value = *a;
            if bytes(&value).first() == Some(&b'=') {
                empty_string = true;
                value.data = value.data.add(1);
                value.len -= 1;
            }
            match compile_complex(cf, &mut value) {
                Some(cv) => src = cv,
                None => return CONF_ERROR,
            }
        }
        lcf.escapes.push(EscapeRule { dst, src, empty_string });
        CONF_OK
    })
}

/// Makes the escaped literals of the location before its content handler runs
/// (after `set`, so that the values `set` makes can be escaped).
unsafe extern "C" fn escape_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx calls phase handlers with a live request.
    guard(
        unsafe { client_log(r) },
        "escape_handler",
        HTTP_INTERNAL_SERVER_ERROR,
        || unsafe {
            let lcf = &*request_loc_conf::<LocConf>(r, ptr::addr_of!(MODULE));
            for rule in &lcf.escapes {
                let value: Vec<u8> = if rule.src.is_null() {
                    let v = ngx_http_get_indexed_variable(r, rule.dst as ngx_uint_t);
                    if v.is_null() || (*v).not_found() != 0 {
                        Vec::new()
                    } else {
                        (*v).as_bytes().to_vec()
                    }
                } else {
                    let mut s = ngx_str_t {
                        len: 0,
                        data: ptr::null_mut(),
                    };
                    if ngx_http_complex_value(r, rule.src, &mut s) != OK {
                        return HTTP_INTERNAL_SERVER_ERROR;
                    }
                    bytes(&s).to_vec()
                };
                let literal = if value.is_empty() && !rule.empty_string {
                    b"NULL".to_vec()
                } else {
                    match quote_literal(&value) {
                        Some(l) => l,
                        None => {
                            log!(
                                NGX_LOG_INFO,
                                client_log(r),
                                "sqldb: a value to escape contains a NUL byte"
                            );
                            return HTTP_BAD_REQUEST;
                        }
                    }
                };
                if !store(r, rule.dst, &literal) {
                    return HTTP_INTERNAL_SERVER_ERROR;
                }
            }
            DECLINED
        },
    )
}
