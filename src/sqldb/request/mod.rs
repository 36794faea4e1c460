//! The request side of the database gateway: a request's way from the
//! content handler (entry) through nginx's upstream and balancer (peer) to
//! the driver, and back from its results to the response (respond, output,
//! stream). Requests are known to the driver by tokens (common::token).

mod auth;
mod entry;
mod error;
mod listen;
mod output;
mod peer;
mod replay;
mod respond;
mod series;
mod stream;
mod vars;

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

use gateway_core::formats::StreamFormat;

use super::config::{Sqldb, SrvConf};
use super::driver::{worker, ConnId, ConnPool, Delivery, PgResult, Query, ReqToken, RowVerdict, Sink};
use crate::common::token as registry;
use crate::ffi::request::RequestCtx;
use crate::ffi::*;

pub(crate) use entry::content_handler;
pub(crate) use peer::peer_init;
pub use series::count_request;
pub use stream::Streaming;
pub(crate) use vars::claim_variable;

/// Per-request state (in the request's pool; its slot in `r->ctx`).
pub struct Ctx {
    /// How the driver knows the request.
    token: ReqToken,
    query: Rc<Query>,
    /// The template has typed parameters (a rejected value is a 400).
    has_params: bool,
    /// The upstream's configuration, once the balancer ran.
    srv: Option<&'static SrvConf>,
    /// The database connection the request's query is on (or waits on).
    conn: Option<ConnId>,
    /// The connection was opened for this request (not pooled nor shared).
    fresh: bool,
    /// Times its query, not sent, moved to another connection of the pool.
    unsent_moves: u8,
    /// The pool had no connection to spare (`overflow=reject`) for the
    /// server the balancer picked: 503 once nginx's connect returns.
    rejected: Option<String>,
    /// No server meets the request's `sqldb_target`: why (for the log).
    unmet: Option<String>,
    last: Option<PgResult>,
    error: Option<PgResult>,
    /// The response is decided (nginx's upstream is finished).
    done: bool,
    /// Set by peer_init: the peer data of this request.
    peer: Option<NonNull<peer::PeerData>>,
    /// `sqldb_stream on` applies: rows go out as they arrive.
    stream_format: Option<StreamFormat>,
    streaming: Option<Streaming>,
    /// Sending the rows failed mid-way (the request ends without its end).
    stream_failed: bool,
    /// The client write handler nginx's upstream had set, while paused.
    saved_write_handler: ngx_http_event_handler_pt,
    /// The verified token's claims (`$sqldb_jwt_claim_NAME`).
    claims: Option<Rc<gateway_core::jwt::Claims>>,
    /// Its error came from the preamble (the role or settings).
    preamble_failed: bool,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // The request's pool is being destroyed: the token goes stale.
        registry::unregister(self.token);
    }
}

// SAFETY: the module's context slot is written by Req::set_ctx::<Sqldb>
// only (entry::run), with a Ctx.
unsafe impl RequestCtx for Sqldb {
    type Ctx = Ctx;
    fn module() -> &'static ngx_module_t {
        <Sqldb as ngx::http::HttpModule>::module()
    }
}

/// What the driver calls: rows of streamed requests, and deliveries.
pub(crate) struct RequestSink;

pub(crate) static SINK: RequestSink = RequestSink;

impl Sink for RequestSink {
    fn row(&self, token: ReqToken, res: &PgResult) -> RowVerdict {
        registry::with_request(token, |r| stream::row(r, res)).unwrap_or(RowVerdict::Continue)
    }

    fn deliver(&self, out: &mut Vec<Delivery>) {
        // (A replay's query is no request's.)
        for d in out.drain(..).filter_map(replay::deliver) {
            respond::deliver(d);
        }
    }
}

thread_local! {
    /// Deliveries that wait for the current handler to return.
    static LATER: RefCell<Vec<Delivery>> = const { RefCell::new(Vec::new()) };
}

/// Delivers after the current handler (from a pool cleanup, say, no
/// request may be finalized).
fn deliver_later(out: Vec<Delivery>) {
    if out.is_empty() {
        return;
    }
    LATER.with(|l| l.borrow_mut().extend(out));
    event::defer(Some(deliver_deferred));
}

event_handler! {
    fn deliver_deferred(_ev) = "sqldb deferred delivery", {
        let mut out = LATER.with(|l| std::mem::take(&mut *l.borrow_mut()));
        SINK.deliver(&mut out);
    }
}

/// The request's context. Each step of a request takes it anew (the
/// steps call each other; none keeps it across such a call).
fn ctx_of(r: &mut Req) -> Option<&mut Ctx> {
    r.ctx_mut::<Sqldb>()
}

/// Runs `f` with the connection pool of a request's upstream.
fn with_pool<T>(ctx: &Ctx, f: impl FnOnce(&mut ConnPool) -> T) -> Option<T> {
    Some(pool_of(ctx.srv?, f))
}

/// Runs `f` with this worker's connection pool of the upstream `srv`,
/// lent for the call only (driver::worker), made on first use. The pool
/// calls no request back within it (what it has for them it returns, for
/// SINK).
fn pool_of<T>(srv: &'static SrvConf, f: impl FnOnce(&mut ConnPool) -> T) -> T {
    worker::with_pool(key_of(srv), || new_pool(srv), f)
}

/// How the worker's state knows the upstream: its configuration's address.
fn key_of(srv: &'static SrvConf) -> usize {
    std::ptr::from_ref(srv) as usize
}

/// A worker's pool of the upstream `srv`, as its configuration says.
fn new_pool(srv: &SrvConf) -> ConnPool {
    let mut pool = ConnPool::new(srv.settings.clone());
    pool.name = Rc::from(srv.name.as_str());
    pool.servers = srv.addrs.len();
    pool.set_sink(&SINK);
    pool
}
