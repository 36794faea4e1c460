//! The location-level directives: `sqldb_pass`, `sqldb_query`,
//! `sqldb_output`, `sqldb_next_upstream`, `sqldb_set`, `sqldb_rewrite`,
//! `sqldb_escape`, `sqldb_target`.

use std::ffi::CString;
use std::rc::Rc;

use gateway_core::method::{parse_methods, QueryError};
use gateway_core::rewrite;
use gateway_core::sql::has_several_statements;
use gateway_core::sql::Region;
use gateway_core::target::Target;
use gateway_core::template::{self, Piece};

use super::{Column, Entries, EscapeRule, LocConf, Output, PendingPass, SetRule, Sqldb, Template, TemplatePiece};
use crate::ffi::conf::ConfError;
use crate::ffi::*;
use crate::sqldb::driver::Statement;

directive_handler! {
    /// `sqldb_pass NAME | $variable`
    pub(crate) fn cmd_sqldb_pass<E: Entries> = "cmd_sqldb_pass",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.pass_set {
            return Err(crate::ffi::conf::duplicate("sqldb_pass"));
        }
        lcf.pass_set = true;
        let claim = cf
            .claim_content_handler("sqldb_pass", E::CONTENT, E::OTHERS)
            .map_err(|_| ConfError::Logged)?;
        let value = cf.args()[1];
        if value.is_empty() {
            return Err("empty upstream name in \"sqldb_pass\" directive".to_owned().into());
        }
        if cf.has_variables(value) {
            lcf.pass_var = Some(cf.compile(value).ok_or(ConfError::Logged)?);
        } else {
            lcf.pass_name = value.to_vec();
        }
        cf.with_main_conf::<Sqldb, _>(|mcf| {
            mcf.pending.push(PendingPass {
                lcf,
                claim: Some(claim),
            })
        });
        Ok(())
    }
}

thread_local! {
    /// Numbers each distinct statement text, for the connections to tell
    /// which statements they hold (templates of the same text share one).
    static TEXTS: std::cell::RefCell<std::collections::HashMap<Vec<u8>, u32>> = Default::default();
}

/// The typed parameters of a template are written where they can be
/// parameters, each with its type.
pub(super) fn check_params(directive: &str, text: &[u8]) -> Result<(), ConfError> {
    if let Some(var) = template::cast_without_type(text) {
        return Err(format!(
            "{directive}: \"{var}\" has no type after \"::\" (a typed parameter is written $name::type)"
        )
        .into());
    }
    if let Some((param, region)) = template::misplaced_param(text) {
        let inside = match region {
            Region::Literal => "a string literal",
            Region::Identifier => "a quoted name",
            Region::Comment => "a comment",
        };
        return Err(format!(
            "{directive}: the typed parameter \"{param}\" is inside {inside}, where it cannot be a parameter; write it outside the quotes (for example 'prefix' || {param})"
        )
        .into());
    }
    Ok(())
}

/// The statement of an SQL text (templates of the same text share its number).
pub(super) fn statement_for(sql: &[u8]) -> Rc<Statement> {
    let id = TEXTS.with(|t| {
        let mut t = t.borrow_mut();
        let next = t.len() as u32;
        *t.entry(sql.to_vec()).or_insert(next)
    });
    let name = CString::new(gateway_core::sql::statement_name(sql)).expect("no NUL in hex digits");
    Rc::new(Statement::new(id, name))
}

/// Compiles a template: text pieces and typed parameters.
fn compile_template(cf: Conf, text: &[u8]) -> Result<Template, ConfError> {
    check_params("\"sqldb_query\" directive", text)?;
    let mut pieces = Vec::new();
    let mut constant = true;
    let mut sql = Vec::new();
    let mut params = 0;
    for piece in template::split(text) {
        let (source, placeholder) = match piece {
            Piece::Text(t) => (t, None),
            Piece::Param { var, ty } => {
                params += 1;
                (
                    format!("${var}").into_bytes(),
                    Some(format!("${params}::{ty}").into_bytes()),
                )
            }
        };
        let cv = cf.compile(&source).ok_or(ConfError::Logged)?;
        match placeholder {
            Some(ph) => {
                sql.extend_from_slice(&ph);
                pieces.push(TemplatePiece::Param(cv, ph));
            }
            None => {
                constant &= cv.is_constant();
                sql.extend_from_slice(&source);
                pieces.push(TemplatePiece::Text(cv));
            }
        }
    }
    let several = constant && has_several_statements(&sql);
    if several && params > 0 {
        return Err(
            "\"sqldb_query\" directive: typed parameters need a query of one statement"
                .to_owned()
                .into(),
        );
    }
    Ok(Template {
        pieces,
        statement: statement_for(&sql),
        constant,
        sql: constant.then(|| CString::new(sql).ok().map(Rc::from)).flatten(),
        several,
        at: cf.position(),
        changes_session: gateway_core::sql::changes_session(text),
        params,
    })
}

directive_handler! {
    /// `sqldb_query [METHOD ...] "template"`
    pub(crate) fn cmd_sqldb_query = "cmd_sqldb_query",
    |cf: Conf, lcf: &mut LocConf| {
        let args = cf.args();
        let text = args[args.len() - 1];
        if text.is_empty() {
            return Err("empty query in \"sqldb_query\" directive".to_owned().into());
        }
        if args.len() == 2 && parse_methods([text]).is_ok() {
            return Err(format!(
                "\"sqldb_query\" directive has the method \"{}\" but no query",
                String::from_utf8_lossy(text)
            )
            .into());
        }
        let methods = parse_methods(args[1..args.len() - 1].iter().copied()).map_err(|e| {
            // Two quoted strings, or a template not in quotes: the first
            // word was taken for a method.
            let hint = match &e {
                QueryError::UnknownMethod(m) if m.bytes().any(|b| !b.is_ascii_alphabetic()) => {
                    " (methods come first, then the template as one argument, in quotes)"
                }
                _ => "",
            };
            format!("\"sqldb_query\" directive: {e}{hint}")
        })?;
        let tmpl = compile_template(cf, text)?;
        lcf.queries
            .add(methods, Rc::new(tmpl))
            .map_err(|e| format!("\"sqldb_query\" directive {e}"))?;
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_listen CHANNEL` (the channel may hold variables).
    pub(crate) fn cmd_sqldb_listen = "cmd_sqldb_listen",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.listen.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_listen"));
        }
        let value = cf.args()[1];
        if !cf.has_variables(value) && !gateway_core::sse::valid_channel(value) {
            return Err(format!(
                "invalid channel \"{}\" in \"sqldb_listen\" directive (letters, digits, _ and $, at most 63 bytes)",
                String::from_utf8_lossy(value)
            )
            .into());
        }
        lcf.listen = Some((cf.compile(value).ok_or(ConfError::Logged)?, cf.position()));
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_target [METHOD ...] any | primary | standby | prefer-standby | read-write | read-only`
    pub(crate) fn cmd_sqldb_target = "cmd_sqldb_target",
    |cf: Conf, lcf: &mut LocConf| {
        let args = cf.args();
        let value = args[args.len() - 1];
        let target = Target::parse(value).ok_or_else(|| {
            let hint = if args.len() == 2 && parse_methods([value]).is_ok() {
                " (a method needs a value after it)"
            } else {
                ""
            };
            format!(
                "invalid value \"{}\" in \"sqldb_target\" directive, it must be any, primary, standby, prefer-standby, read-write or read-only{hint}",
                String::from_utf8_lossy(value)
            )
        })?;
        let methods = parse_methods(args[1..args.len() - 1].iter().copied())
            .map_err(|e| format!("\"sqldb_target\" directive: {e}"))?;
        lcf.targets.add(methods, target).map_err(|e| match e {
            QueryError::DuplicateDefault => {
                "\"sqldb_target\" directive is duplicate: a target for every method is already set".to_owned()
            }
            QueryError::DuplicateMethod(m) => {
                format!("\"sqldb_target\" directive is duplicate: a target for method \"{m}\" is already set")
            }
            other => format!("\"sqldb_target\" directive: {other}"),
        })?;
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_stream_connections number`
    pub(crate) fn cmd_sqldb_stream_connections = "cmd_sqldb_stream_connections",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.stream_connections.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_stream_connections"));
        }
        let value = cf.args()[1];
        let n = super::upstream::atoi(value).filter(|&n| n >= 1).ok_or_else(|| {
            format!(
                "invalid value \"{}\" in \"sqldb_stream_connections\" directive, it must be a number of 1 or more",
                String::from_utf8_lossy(value)
            )
        })?;
        lcf.stream_connections = Some(n);
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_output rds | text | value | binary_value | json | csv | none`
    pub(crate) fn cmd_sqldb_output = "cmd_sqldb_output",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.output.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_output"));
        }
        let value = cf.args()[1];
        let found = Output::ALL
            .iter()
            .find(|(name, _)| name.as_bytes().eq_ignore_ascii_case(value))
            .map(|&(_, o)| o);
        lcf.output = Some(found.ok_or_else(|| {
            format!(
                "invalid value \"{}\" in \"sqldb_output\" directive, it must be rds, text, value, binary_value, json, csv or none",
                String::from_utf8_lossy(value)
            )
        })?);
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_next_upstream error | timeout ... | off`
    pub(crate) fn cmd_sqldb_next_upstream = "cmd_sqldb_next_upstream",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.next_upstream.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_next_upstream"));
        }
        let keywords = [
            ("error", NGX_HTTP_UPSTREAM_FT_ERROR),
            ("timeout", NGX_HTTP_UPSTREAM_FT_TIMEOUT),
        ];
        lcf.next_upstream = Some(cf.next_upstream_bits(&keywords).map_err(|_| ConfError::Logged)?);
        Ok(())
    }
}

/// Declares a variable that `sqldb_set` / `sqldb_escape` writes (as `set`
/// does); true with it for one of nginx's own that has a value of the
/// request ($args).
fn writable_variable(cf: Conf, directive: &str, name: &[u8]) -> Result<(ngx_int_t, bool), ConfError> {
    // A name nginx can set: a letter or '_' first ($1 is a regex capture).
    let valid = |b: &[u8]| {
        b.first().is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
    };
    let Some(bare) = name.strip_prefix(b"$").filter(|b| valid(b)) else {
        return Err(format!(
            "invalid variable name \"{}\" in \"{directive}\" directive (a variable is written $name)",
            String::from_utf8_lossy(name)
        )
        .into());
    };
    // A name under a prefix ($arg_x, $http_x, $cookie_x) is the request's
    // own: written here, its value would go with the request to every
    // location it is redirected to, and be the client's own wherever the
    // rule does not apply.
    if let Some(prefix) = cf.prefix_variable(bare) {
        return Err(format!(
            "\"{directive}\" cannot write \"{}\", a variable of the request (\"${}\"): use one of your own",
            String::from_utf8_lossy(name),
            String::from_utf8_lossy(&prefix)
        )
        .into());
    }
    let (settable, index) = cf
        .add_variable(bare, NGX_HTTP_VAR_CHANGEABLE, |v| {
            if v.get_handler.is_none() {
                v.get_handler = Some(super::upstream::not_set);
            }
            v.set_handler.is_some()
        })
        .ok_or(ConfError::Logged)?;
    Ok((index, settable))
}

directive_handler! {
    /// `sqldb_set $var ROW COLUMN|NAME [optional|required]`
    pub(crate) fn cmd_sqldb_set = "cmd_sqldb_set",
    |cf: Conf, lcf: &mut LocConf| {
        let args = cf.args();
        let (index, _) = writable_variable(cf, "sqldb_set", args[1])?;
        let number = |a: &[u8]| std::str::from_utf8(a).ok().and_then(|s| s.parse::<usize>().ok());
        let row = number(args[2]).ok_or_else(|| {
            format!(
                "invalid row \"{}\" in \"sqldb_set\" directive",
                String::from_utf8_lossy(args[2])
            )
        })?;
        let column = match number(args[3]) {
            Some(c) => Column::Index(c),
            None => Column::Name(args[3].to_vec()),
        };
        let required = match args.get(4).map(|a| a.to_ascii_lowercase()).as_deref() {
            None | Some(b"optional") => false,
            Some(b"required") => true,
            Some(other) => {
                return Err(format!(
                    "invalid value \"{}\" in \"sqldb_set\" directive, it must be \"optional\" or \"required\"",
                    String::from_utf8_lossy(other)
                )
                .into())
            }
        };
        lcf.sets.push(SetRule {
            index,
            name: String::from_utf8_lossy(args[1]).into_owned(),
            row,
            column,
            required,
        });
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_rewrite [METHOD ...] no_changes | changes | no_rows | rows [=]CODE`
    pub(crate) fn cmd_sqldb_rewrite = "cmd_sqldb_rewrite",
    |cf: Conf, lcf: &mut LocConf| {
        let rule = rewrite::parse_rule(cf.args()[1..].iter().copied())
            .map_err(|e| format!("{e} in \"sqldb_rewrite\" directive"))?;
        // A second rule for the same condition and methods would never apply.
        let shadowed = lcf.rewrites.iter().any(|r| {
            r.condition == rule.condition && (r.methods & rule.methods != 0 || (r.methods == 0 && rule.methods == 0))
        });
        if shadowed {
            let args = cf.args();
            return Err(format!(
                "\"sqldb_rewrite\" directive is duplicate: an earlier rule has the condition \"{}\" for the same methods",
                String::from_utf8_lossy(args[args.len() - 2])
            )
            .into());
        }
        lcf.rewrites.push(rule);
        Ok(())
    }
}

directive_handler! {
    /// `sqldb_escape $dst [[=]$src]`, `sqldb_escape =$var`
    pub(crate) fn cmd_sqldb_escape = "cmd_sqldb_escape",
    |cf: Conf, lcf: &mut LocConf| {
        let args = cf.args();
        let mut empty_string = false;
        let mut name = args[1];
        // `sqldb_escape =$var`: in place, an empty value as ''.
        if args.len() == 2 {
            if let Some(bare) = name.strip_prefix(b"=") {
                empty_string = true;
                name = bare;
            }
        }
        let (dst, of_request) = writable_variable(cf, "sqldb_escape", name)?;
        let mut src = None;
        if let Some(mut value) = args.get(2).copied() {
            if let Some(bare) = value.strip_prefix(b"=") {
                empty_string = true;
                value = bare;
            }
            src = Some(cf.compile(value).ok_or(ConfError::Logged)?);
        } else if of_request {
            // In place, one of nginx's own ($args): its value is read as
            // nginx gives it.
            src = Some(cf.compile(name).ok_or(ConfError::Logged)?);
        }
        // A second rule for the variable would escape the literal again.
        if lcf.escapes.iter().any(|e| e.dst == dst) {
            return Err(format!(
                "\"sqldb_escape\" directive is duplicate: \"{}\" is escaped above",
                String::from_utf8_lossy(name)
            )
            .into());
        }
        lcf.escapes.push(EscapeRule { dst, src, empty_string });
        Ok(())
    }
}
