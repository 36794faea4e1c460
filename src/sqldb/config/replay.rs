//! `sqldb_listen_replay "template"`: the query that gives the events of a
//! `sqldb_listen` channel after an id, `(id, data)` rows in order, with
//! `$sqldb_channel` and `$sqldb_last_event_id` as typed parameters. It is
//! built here once, whole: its only values are those two, so it runs for a
//! client that comes back with `Last-Event-ID` and, after the listening
//! connection was made again, once for all a channel's subscribers, with
//! no request of its own.

use std::ffi::{CStr, CString};
use std::rc::Rc;

use gateway_core::sql::{has_several_statements, has_word};
use gateway_core::sse::IdKind;
use gateway_core::template::{self, Piece};

use super::LocConf;
use crate::ffi::conf::{ComplexValue, ConfError, Position};
use crate::ffi::*;
use crate::sqldb::driver::Statement;

/// A value the replay binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayParam {
    /// `$sqldb_channel`: the channel.
    Channel,
    /// `$sqldb_last_event_id`: the id the rows come after.
    LastEventId,
}

pub struct Replay {
    /// The SQL, with `$1::type`... for its parameters.
    pub sql: Rc<CStr>,
    /// What each parameter is, in order.
    pub params: Vec<ReplayParam>,
    /// The ids `$sqldb_last_event_id`'s type takes: a notification's first
    /// word that is not one is no event id.
    pub id_kind: IdKind,
    /// Prepared under this name on every connection (`sqldb_prepare`).
    pub statement: Rc<Statement>,
    pub changes_session: bool,
    /// Where the client says the last id it got: the `Last-Event-ID`
    /// header, else the query argument `last_event_id`.
    pub header: ComplexValue,
    pub arg: ComplexValue,
    pub at: Position,
}

const DIRECTIVE: &str = "\"sqldb_listen_replay\" directive";

/// Compiles a replay template: typed parameters of the two variables only.
fn compile(cf: Conf, text: &[u8]) -> Result<Replay, ConfError> {
    if text.is_empty() {
        return Err(format!("empty query in {DIRECTIVE}").into());
    }
    super::directives::check_params(DIRECTIVE, text)?;
    let mut sql = Vec::new();
    let mut params = Vec::new();
    let mut id_kind = IdKind::Any;
    for piece in template::split(text) {
        match piece {
            Piece::Text(t) => {
                if cf.has_variables(&t) {
                    return Err(format!(
                        "{DIRECTIVE} takes no variable but $sqldb_channel and $sqldb_last_event_id, as typed parameters (\"{}\")",
                        String::from_utf8_lossy(&t)
                    )
                    .into());
                }
                sql.extend_from_slice(&t);
            }
            Piece::Param { var, ty } => {
                let p = match var.as_str() {
                    "sqldb_channel" => ReplayParam::Channel,
                    "sqldb_last_event_id" => ReplayParam::LastEventId,
                    _ => {
                        return Err(format!(
                            "{DIRECTIVE} takes no variable but $sqldb_channel and $sqldb_last_event_id (\"${var}\"): the replay after a reconnect runs for all of a channel's subscribers at once"
                        )
                        .into())
                    }
                };
                // (Its first type, where the id is written twice.)
                if p == ReplayParam::LastEventId && !params.contains(&p) {
                    id_kind = IdKind::of_type(&ty);
                }
                params.push(p);
                sql.extend_from_slice(format!("${}::{ty}", params.len()).as_bytes());
            }
        }
    }
    if !params.contains(&ReplayParam::LastEventId) {
        return Err(format!(
            "{DIRECTIVE} needs $sqldb_last_event_id as a typed parameter (for example \"id > $sqldb_last_event_id::bigint\")"
        )
        .into());
    }
    if has_several_statements(&sql) {
        return Err(format!("{DIRECTIVE} needs a query of one statement").into());
    }
    if !has_word(&sql, &["limit", "fetch"]) {
        return Err(format!(
            "{DIRECTIVE} needs a LIMIT: a replay runs in rounds of at most that many rows (for example \"order by id limit 1000\")"
        )
        .into());
    }
    let statement = super::directives::statement_for(&sql);
    let changes_session = gateway_core::sql::changes_session(&sql);
    Ok(Replay {
        id_kind,
        sql: CString::new(sql)
            .map_err(|_| format!("{DIRECTIVE}: the query contains a NUL byte"))?
            .into(),
        params,
        statement,
        changes_session,
        header: cf.compile(b"$http_last_event_id").ok_or(ConfError::Logged)?,
        arg: cf.compile(b"$arg_last_event_id").ok_or(ConfError::Logged)?,
        at: cf.position(),
    })
}

directive_handler! {
    /// `sqldb_listen_replay "template"`
    pub(crate) fn cmd_sqldb_listen_replay = "cmd_sqldb_listen_replay",
    |cf: Conf, lcf: &mut LocConf| {
        if lcf.listen_replay.is_some() {
            return Err(crate::ffi::conf::duplicate("sqldb_listen_replay"));
        }
        lcf.listen_replay = Some(Rc::new(compile(cf, cf.args()[1])?));
        Ok(())
    }
}

impl LocConf {
    /// `sqldb_listen_replay` is where `sqldb_listen` is.
    pub(super) fn check_replay(&self) -> Result<(), ConfError> {
        match (&self.listen_replay, &self.listen) {
            (Some(replay), None) => Err(ConfError::At(
                "\"sqldb_listen_replay\" needs \"sqldb_listen\" in the same location".to_owned(),
                replay.at.clone(),
            )),
            _ => Ok(()),
        }
    }
}
