//! The only place that calls libpq. Connections are always nonblocking:
//! nothing here waits for the network. Calls that can fail return libpq's
//! message as a `PqError`.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;

use gateway_core::pipeline;
use gateway_core::rds::ResultSet;
use gateway_core::target::Role;
use libpq_sys as pq;

/// What PQconnectPoll asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    Reading,
    Writing,
    Ready,
    Failed,
}

/// What libpq said when a call failed (its message, first line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PqError(pub String);

impl std::fmt::Display for PqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a connection string as libpq reads it (keywords and quoting),
/// without connecting: libpq's own message when it does not parse.
pub fn check_conninfo(conninfo: &CStr) -> Result<(), PqError> {
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: conninfo is NUL-terminated; err receives a message to free.
    let opts = unsafe { pq::PQconninfoParse(conninfo.as_ptr(), &mut err) };
    if opts.is_null() {
        let msg = if err.is_null() {
            "out of memory".to_owned()
        } else {
            let m = cstr_lossy(err);
            // SAFETY: err was allocated by libpq for us.
            unsafe { pq::PQfreemem(err.cast()) };
            m
        };
        return Err(PqError(msg));
    }
    // SAFETY: opts came from PQconninfoParse.
    unsafe { pq::PQconninfoFree(opts) };
    Ok(())
}

/// An owned libpq connection; dropping it closes the socket (PQfinish).
pub struct PgConn(NonNull<pq::PGconn>);

/// A connection being made, for one step of its connect on another thread
/// (PgConn::poll_handle). It compares equal to the handle of the same
/// connection.
#[derive(Debug, PartialEq, Eq)]
pub struct PollHandle(NonNull<pq::PGconn>);

// SAFETY: libpq's connections may be used from any thread, one thread at
// a time; the PgConn's owner does not use it while a step runs (see
// PgConn::poll_handle).
unsafe impl Send for PollHandle {}

impl PollHandle {
    /// One step of the connect (PQconnectPoll).
    pub fn poll_connect(&mut self) -> Poll {
        // SAFETY: a live connection started with PQconnectStart, used by
        // nothing else during the step (poll_handle).
        poll_status(unsafe { pq::PQconnectPoll(self.0.as_ptr()) })
    }
}

fn poll_status(s: pq::PostgresPollingStatusType) -> Poll {
    match s {
        pq::PostgresPollingStatusType::PGRES_POLLING_READING => Poll::Reading,
        pq::PostgresPollingStatusType::PGRES_POLLING_WRITING => Poll::Writing,
        pq::PostgresPollingStatusType::PGRES_POLLING_OK => Poll::Ready,
        _ => Poll::Failed,
    }
}

extern "C" fn ignore_notice(_arg: *mut c_void, _message: *const c_char) {}

fn cstr_lossy(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libpq returns NUL-terminated strings that live as long as the
    // object they came from; we copy before returning.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    s.trim_end().replace('\n', " ")
}

impl PgConn {
    /// Starts a nonblocking connection (PQconnectStart). The conninfo must
    /// hold a numeric `hostaddr` or a socket directory, so no name is resolved.
    pub fn start(conninfo: &CStr) -> Result<PgConn, PqError> {
        // SAFETY: conninfo is NUL-terminated.
        let raw = unsafe { pq::PQconnectStart(conninfo.as_ptr()) };
        let conn = PgConn(NonNull::new(raw).ok_or_else(|| PqError("out of memory".into()))?);
        if conn.is_bad() {
            return Err(conn.error());
        }
        // SAFETY: the connection is live; the processor ignores notices
        // instead of printing them to stderr.
        unsafe { pq::PQsetNoticeProcessor(conn.0.as_ptr(), Some(ignore_notice), std::ptr::null_mut()) };
        Ok(conn)
    }

    fn raw(&self) -> *mut pq::PGconn {
        self.0.as_ptr()
    }

    pub fn is_bad(&self) -> bool {
        // SAFETY: live connection.
        unsafe { pq::PQstatus(self.raw()) == pq::ConnStatusType::CONNECTION_BAD }
    }

    pub fn socket(&self) -> c_int {
        // SAFETY: live connection.
        unsafe { pq::PQsocket(self.raw()) }
    }

    /// The next step of the connect may cost milliseconds of CPU: it reads
    /// the server's authentication requests (a SCRAM challenge's proof is
    /// computed then) or goes on with a TLS handshake.
    pub fn connect_step_is_heavy(&self) -> bool {
        // SAFETY: live connection.
        let status = unsafe { pq::PQstatus(self.raw()) };
        matches!(
            status,
            pq::ConnStatusType::CONNECTION_AWAITING_RESPONSE | pq::ConnStatusType::CONNECTION_SSL_STARTUP
        )
    }

    /// After a step of the connect: libpq has just started connecting a
    /// socket (a new one: the first was started before any step).
    pub fn connect_started(&self) -> bool {
        // SAFETY: live connection.
        unsafe { pq::PQstatus(self.raw()) == pq::ConnStatusType::CONNECTION_STARTED }
    }

    /// One step of the connect (PQconnectPoll), in place.
    pub fn poll_connect(&mut self) -> Poll {
        // SAFETY: live connection started with PQconnectStart.
        poll_status(unsafe { pq::PQconnectPoll(self.raw()) })
    }

    /// The connection, for a step of its connect on another thread. The
    /// owner must not use the connection (nor drop it) until the step is
    /// done.
    pub fn poll_handle(&self) -> PollHandle {
        PollHandle(self.0)
    }

    /// libpq's failure of the last call on the connection.
    fn error(&self) -> PqError {
        PqError(self.error_message())
    }

    fn check(&self, ok: bool) -> Result<(), PqError> {
        if ok {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    pub fn set_nonblocking(&mut self) -> Result<(), PqError> {
        // SAFETY: live connection.
        let ok = unsafe { pq::PQsetnonblocking(self.raw(), 1) == 0 };
        self.check(ok)
    }

    /// PQsendQuery: the simple protocol, which allows several statements.
    pub fn send_query(&mut self, sql: &CStr) -> Result<(), PqError> {
        // SAFETY: live connection, NUL-terminated query.
        let ok = unsafe { pq::PQsendQuery(self.raw(), sql.as_ptr()) == 1 };
        self.check(ok)
    }

    /// PQsendQueryParams: one statement through the extended protocol and
    /// the unnamed statement, parameters and results as text (their types
    /// come from the casts in the SQL).
    pub fn send_unnamed(&mut self, sql: &CStr, params: &[CString], binary: bool) -> Result<(), PqError> {
        let ok = with_values(params, |values| {
            // SAFETY: live connection, NUL-terminated query and values that
            // outlive the call (libpq copies them into its buffer).
            unsafe {
                pq::PQsendQueryParams(
                    self.raw(),
                    sql.as_ptr(),
                    values.len() as c_int,
                    std::ptr::null(),
                    values.as_ptr(),
                    std::ptr::null(),
                    std::ptr::null(),
                    binary as c_int,
                ) == 1
            }
        });
        self.check(ok)
    }

    /// PQsendPrepare: parse a statement once under a name.
    pub fn send_prepare(&mut self, name: &CStr, sql: &CStr) -> Result<(), PqError> {
        // SAFETY: live connection, NUL-terminated name and query.
        let ok = unsafe { pq::PQsendPrepare(self.raw(), name.as_ptr(), sql.as_ptr(), 0, std::ptr::null()) == 1 };
        self.check(ok)
    }

    /// PQsendQueryPrepared: parameters and results as text.
    pub fn send_prepared(&mut self, name: &CStr, params: &[CString], binary: bool) -> Result<(), PqError> {
        let ok = with_values(params, |values| {
            // SAFETY: live connection, NUL-terminated name and values that
            // outlive the call (libpq copies them into its buffer).
            unsafe {
                pq::PQsendQueryPrepared(
                    self.raw(),
                    name.as_ptr(),
                    values.len() as c_int,
                    values.as_ptr(),
                    std::ptr::null(),
                    std::ptr::null(),
                    binary as c_int,
                ) == 1
            }
        });
        self.check(ok)
    }

    /// Rows of the query whose results come next arrive one result each.
    pub fn set_single_row_mode(&mut self) -> bool {
        // SAFETY: live connection.
        unsafe { pq::PQsetSingleRowMode(self.raw()) == 1 }
    }

    /// Pipeline mode: several queries in flight, results in order.
    pub fn enter_pipeline(&mut self) -> Result<(), PqError> {
        // SAFETY: live connection.
        let ok = unsafe { pq::PQenterPipelineMode(self.raw()) == 1 };
        self.check(ok)
    }

    /// Leaves pipeline mode; only possible when nothing is in flight.
    pub fn exit_pipeline(&mut self) -> Result<(), PqError> {
        // SAFETY: live connection.
        let ok = unsafe { pq::PQexitPipelineMode(self.raw()) == 1 };
        self.check(ok)
    }

    /// Ends one request's queries in the pipeline: an error aborts the
    /// pipeline only up to here. libpq 17 and later queue it with the rest
    /// (flush() writes them); before, libpq writes what it holds here.
    pub fn pipeline_sync(&mut self) -> Result<(), PqError> {
        // SAFETY: live connection in pipeline mode.
        #[cfg(libpq_send_sync)]
        let ok = unsafe { pq::PQsendPipelineSync(self.raw()) == 1 };
        // SAFETY: live connection in pipeline mode.
        #[cfg(not(libpq_send_sync))]
        let ok = unsafe { pq::PQpipelineSync(self.raw()) == 1 };
        self.check(ok)
    }

    /// True when the session is outside any transaction block and idle.
    pub fn is_idle_outside_transaction(&self) -> bool {
        // SAFETY: live connection.
        unsafe { pq::PQtransactionStatus(self.raw()) == pq::PGTransactionStatusType::PQTRANS_IDLE }
    }

    /// Pushes out what libpq has buffered: Ok(true) when some is left
    /// (the socket is full).
    pub fn flush(&mut self) -> Result<bool, PqError> {
        // SAFETY: live connection.
        match unsafe { pq::PQflush(self.raw()) } {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.error()),
        }
    }

    /// Reads what the socket holds into libpq (never waits).
    pub fn consume_input(&mut self) -> Result<(), PqError> {
        // SAFETY: live connection.
        let ok = unsafe { pq::PQconsumeInput(self.raw()) == 1 };
        self.check(ok)
    }

    pub fn is_busy(&self) -> bool {
        // SAFETY: live connection.
        unsafe { pq::PQisBusy(self.raw()) == 1 }
    }

    /// The next result; only call when `is_busy()` is false, so it never waits.
    pub fn get_result(&mut self) -> Option<PgResult> {
        debug_assert!(!self.is_busy());
        // SAFETY: live connection; not busy, so PQgetResult does not block.
        NonNull::new(unsafe { pq::PQgetResult(self.raw()) }).map(PgResult)
    }

    /// The notifications libpq has read (LISTEN): channel and payload.
    pub fn notifies(&mut self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            // SAFETY: live connection; PQnotifies returns null or a
            // notification that we own and free with PQfreemem below.
            let n = unsafe { pq::PQnotifies(self.raw()) };
            let Some(n) = NonNull::new(n) else { break };
            // SAFETY: libpq fills relname and extra with NUL-terminated
            // strings inside the same allocation; copied before it is freed.
            let (channel, payload) = unsafe {
                let n = n.as_ref();
                let channel = if n.relname.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(n.relname).to_string_lossy().into_owned()
                };
                let payload = if n.extra.is_null() {
                    Vec::new()
                } else {
                    CStr::from_ptr(n.extra).to_bytes().to_vec()
                };
                (channel, payload)
            };
            // SAFETY: the notification came from PQnotifies and is freed once.
            unsafe { pq::PQfreemem(n.as_ptr().cast()) };
            out.push((channel, payload));
        }
        out
    }

    /// libpq's message for the connection: its first line (the lines after
    /// it are libpq's advice, or errors of later calls on a dead connection).
    pub fn error_message(&self) -> String {
        // SAFETY: live connection; the message is copied at once.
        let p = unsafe { pq::PQerrorMessage(self.raw()) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: libpq's messages are NUL-terminated.
        let text = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("")
            .to_owned()
    }
}

/// What a cancel request for a connection's backend needs: the server's
/// address as libpq connected to it (a sockaddr), the backend's PID and
/// its secret key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelKey {
    pub addr: Vec<u8>,
    pub pid: i32,
    pub key: i32,
}

/// The start of libpq's internal `struct pg_cancel` (libpq-int.h), the same
/// from PostgreSQL 9 to 17: the server's address (`SockAddr`: a
/// sockaddr_storage and its length), the backend's PID and key.
#[repr(C)]
struct PgCancelHead {
    raddr: SockAddr,
    be_pid: c_int,
    be_key: c_int,
}

/// libpq's `SockAddr` (padded as a struct of its own, which matters).
#[repr(C)]
struct SockAddr {
    addr: libc::sockaddr_storage,
    salen: libc::socklen_t,
}

impl PgConn {
    /// The cancel key of a connected session, for a cancel request sent on
    /// nginx's events (libpq before 17 only sends one blocking, PQcancel).
    /// None when libpq is of another layout or the key does not check out.
    pub fn cancel_key(&self) -> Option<CancelKey> {
        // SAFETY: plain calls on a live connection.
        let (version, pid) = unsafe { (pq::PQlibVersion(), pq::PQbackendPID(self.raw())) };
        if !(90000..180000).contains(&version) || pid == 0 {
            return None;
        }
        // SAFETY: live connection; the result is freed below.
        let cancel = NonNull::new(unsafe { pq::PQgetCancel(self.raw()) })?;
        // SAFETY: for the libpq versions admitted above, PGcancel begins with
        // PgCancelHead's fields; the PID is checked against PQbackendPID
        // before anything read here is used.
        let head = unsafe { &*(cancel.as_ptr() as *const PgCancelHead) };
        let len = head.raddr.salen as usize;
        let family = i32::from(head.raddr.addr.ss_family);
        let sane = head.be_pid == pid
            && len > 0
            && len <= std::mem::size_of::<libc::sockaddr_storage>()
            && matches!(family, libc::AF_INET | libc::AF_INET6 | libc::AF_UNIX);
        let key = sane.then(|| {
            // SAFETY: len bytes of the sockaddr_storage, checked above.
            let addr = unsafe { std::slice::from_raw_parts(&head.raddr.addr as *const _ as *const u8, len) };
            CancelKey {
                addr: addr.to_vec(),
                pid,
                key: head.be_key,
            }
        });
        // SAFETY: the object came from PQgetCancel and is not used after this.
        unsafe { pq::PQfreeCancel(cancel.as_ptr()) };
        key
    }

    /// The number of the session's client_encoding now (libpq follows every
    /// change the server reports, `SET client_encoding` included).
    pub fn client_encoding_id(&self) -> c_int {
        // SAFETY: live connection.
        unsafe { pq::PQclientEncoding(self.raw()) }
    }

    /// The name of an encoding number.
    pub fn encoding_name(id: c_int) -> String {
        // SAFETY: pg_encoding_to_char returns a static name ("" for an
        // unknown number).
        cstr_lossy(unsafe { pq::pg_encoding_to_char(id) })
    }

    /// The server's role as this session last heard it: the values of
    /// `in_hot_standby` and `default_transaction_read_only` that the server
    /// reports (ParameterStatus) at the start and whenever they change;
    /// libpq keeps the last of each as it reads. No query is sent.
    pub fn role(&self) -> Role {
        // Both values are read before anything else calls libpq (which
        // may replace them as it reads).
        Role::from_status(
            self.parameter_status(c"in_hot_standby"),
            self.parameter_status(c"default_transaction_read_only"),
        )
    }

    /// The last value of a parameter the server reported (None: never);
    /// valid until libpq reads from the connection again.
    fn parameter_status(&self, name: &CStr) -> Option<&[u8]> {
        // SAFETY: live connection and a NUL-terminated name. The value is
        // NUL-terminated and owned by libpq until it reads a new one, which
        // takes another call on this connection: its only caller, role(),
        // makes none while it holds the value.
        let p = unsafe { pq::PQparameterStatus(self.raw(), name.as_ptr()) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, see above.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }

    /// The backend's process ID.
    pub fn backend_pid(&self) -> i32 {
        // SAFETY: live connection.
        unsafe { pq::PQbackendPID(self.raw()) }
    }
}

impl Drop for PgConn {
    fn drop(&mut self) {
        // SAFETY: we own the connection; PQfinish closes its socket and frees it.
        unsafe { pq::PQfinish(self.raw()) };
    }
}

/// Status of one result, as the RDS driver error code reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultKind {
    /// PGRES_COMMAND_OK: a statement without rows.
    Command,
    /// PGRES_TUPLES_OK: rows (possibly none).
    Tuples,
    /// PGRES_SINGLE_TUPLE: one row, in single-row mode.
    Row,
    /// PGRES_EMPTY_QUERY: the server got only white space or comments.
    Empty,
    /// An error reported by the server.
    Error,
    /// PGRES_PIPELINE_SYNC: the end of one request's queries in the pipeline.
    Sync,
    /// PGRES_PIPELINE_ABORTED: skipped after an earlier error before the sync.
    Aborted,
    /// COPY and other states a gateway cannot serve.
    Unsupported,
}

/// An owned result (PQclear on drop).
pub struct PgResult(NonNull<pq::PGresult>);

impl PgResult {
    fn raw(&self) -> *const pq::PGresult {
        self.0.as_ptr()
    }

    /// The libpq status code (ExecStatusType as a number).
    pub fn status_code(&self) -> u16 {
        // SAFETY: live result.
        unsafe { pq::PQresultStatus(self.raw()) as u16 }
    }

    pub fn kind(&self) -> ResultKind {
        use pq::ExecStatusType::*;
        // SAFETY: live result.
        match unsafe { pq::PQresultStatus(self.raw()) } {
            PGRES_COMMAND_OK => ResultKind::Command,
            PGRES_TUPLES_OK => ResultKind::Tuples,
            PGRES_SINGLE_TUPLE => ResultKind::Row,
            PGRES_EMPTY_QUERY => ResultKind::Empty,
            PGRES_BAD_RESPONSE | PGRES_FATAL_ERROR | PGRES_NONFATAL_ERROR => ResultKind::Error,
            PGRES_PIPELINE_SYNC => ResultKind::Sync,
            PGRES_PIPELINE_ABORTED => ResultKind::Aborted,
            _ => ResultKind::Unsupported,
        }
    }

    /// What the result is, for the routing of results (core::pipeline).
    pub fn route_kind(&self) -> pipeline::ResultKind {
        match self.kind() {
            ResultKind::Command | ResultKind::Tuples | ResultKind::Empty => pipeline::ResultKind::Final,
            ResultKind::Row => pipeline::ResultKind::Row,
            ResultKind::Error => {
                // 'V': the severity, never translated (PostgreSQL 9.6 on).
                let severity = self.error_field(b'V');
                pipeline::ResultKind::Error(pipeline::ErrorClass::of(&severity, &self.sqlstate()))
            }
            ResultKind::Sync => pipeline::ResultKind::Sync,
            ResultKind::Aborted => pipeline::ResultKind::Aborted,
            ResultKind::Unsupported => pipeline::ResultKind::Copy,
        }
    }

    /// libpq's name of the result's status ("PGRES_COPY_OUT", ...).
    pub fn status_name(&self) -> String {
        // SAFETY: live result; PQresStatus returns a static string.
        cstr_lossy(unsafe { pq::PQresStatus(pq::PQresultStatus(self.raw())) })
    }

    pub fn error_message(&self) -> String {
        // SAFETY: live result.
        cstr_lossy(unsafe { pq::PQresultErrorMessage(self.raw()) })
    }

    fn error_field(&self, code: u8) -> String {
        // SAFETY: live result; the field codes are PG_DIAG_* letters.
        cstr_lossy(unsafe { pq::PQresultErrorField(self.raw(), c_int::from(code)) })
    }

    pub fn sqlstate(&self) -> String {
        self.error_field(b'C')
    }

    /// One line: severity, primary message, detail if any, SQLSTATE.
    pub fn error_summary(&self) -> String {
        let primary = self.error_field(b'M');
        if primary.is_empty() {
            return self.error_message();
        }
        let mut s = format!("{}: {primary}", self.error_field(b'S'));
        let detail = self.error_field(b'D');
        if !detail.is_empty() {
            s.push_str(&format!(" DETAIL: {detail}"));
        }
        s.push_str(&format!(" (SQLSTATE {})", self.sqlstate()));
        s
    }

    /// The command tag, e.g. "UPDATE 3".
    pub fn command_status(&self) -> String {
        // SAFETY: live result; PQcmdStatus takes a non-const pointer but does not write.
        cstr_lossy(unsafe { pq::PQcmdStatus(self.raw() as *mut _) })
    }

    /// Rows affected per the command tag of a statement that changes rows
    /// (INSERT, UPDATE, DELETE, MERGE, ...); None for SELECT and for tags
    /// without a count (DDL, SET).
    /// (Read in place: this runs for every result.)
    pub fn affected(&self) -> Option<u64> {
        // SAFETY: live result; PQcmdStatus takes a non-const pointer but does
        // not write, and returns a NUL-terminated string the result owns.
        let tag = unsafe { pq::PQcmdStatus(self.raw() as *mut _) };
        // SAFETY: as above (checked for NULL first).
        if tag.is_null() || unsafe { CStr::from_ptr(tag) }.to_bytes().starts_with(b"SELECT") {
            return None;
        }
        // SAFETY: live result; PQcmdTuples takes a non-const pointer but does
        // not write, and returns a NUL-terminated string the result owns.
        let count = unsafe { pq::PQcmdTuples(self.raw() as *mut _) };
        if count.is_null() {
            return None;
        }
        // SAFETY: as above.
        let count = unsafe { CStr::from_ptr(count) }.to_bytes();
        std::str::from_utf8(count).ok()?.trim_end().parse().ok()
    }

    /// `affected`, 0 when there is no count.
    pub fn affected_rows(&self) -> u64 {
        self.affected().unwrap_or(0)
    }

    pub fn insert_oid(&self) -> u64 {
        // SAFETY: live result.
        u64::from(unsafe { pq::PQoidValue(self.raw()) })
    }
}

impl ResultSet for PgResult {
    fn columns(&self) -> usize {
        // SAFETY: live result.
        unsafe { pq::PQnfields(self.raw()) }.max(0) as usize
    }

    fn rows(&self) -> usize {
        // SAFETY: live result.
        unsafe { pq::PQntuples(self.raw()) }.max(0) as usize
    }

    fn column_name(&self, col: usize) -> &[u8] {
        // SAFETY: col < columns(); the name lives as long as the result.
        let p = unsafe { pq::PQfname(self.raw(), col as c_int) };
        if p.is_null() {
            return b"";
        }
        // SAFETY: non-null, NUL-terminated, owned by the result.
        unsafe { CStr::from_ptr(p) }.to_bytes()
    }

    fn column_type(&self, col: usize) -> u32 {
        // SAFETY: live result.
        unsafe { pq::PQftype(self.raw(), col as c_int) }
    }

    /// A NULL has length 0: only an empty value asks whether it is one
    /// (two calls into libpq per value, not three; they add up over large
    /// results).
    fn value_len(&self, row: usize, col: usize) -> Option<usize> {
        let (r, c) = (row as c_int, col as c_int);
        // SAFETY: row/col are in range of the live result.
        unsafe {
            let len = pq::PQgetlength(self.raw(), r, c).max(0) as usize;
            (len > 0 || pq::PQgetisnull(self.raw(), r, c) != 1).then_some(len)
        }
    }

    fn value(&self, row: usize, col: usize) -> Option<&[u8]> {
        let len = self.value_len(row, col)?;
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: row/col are in range; the value lives as long as the result.
        let p = unsafe { pq::PQgetvalue(self.raw(), row as c_int, col as c_int) };
        if p.is_null() {
            return Some(&[]);
        }
        // SAFETY: libpq holds `len` bytes at p, as long as the result lives.
        Some(unsafe { std::slice::from_raw_parts(p as *const u8, len) })
    }
}

impl std::fmt::Debug for PgResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgResult({})", self.status_name())
    }
}

impl Drop for PgResult {
    fn drop(&mut self) {
        // SAFETY: we own the result.
        unsafe { pq::PQclear(self.0.as_ptr()) };
    }
}

/// The parameter values as libpq takes them, pointers to their text: on
/// the stack for the usual few, not an allocation per query.
fn with_values<R>(params: &[CString], f: impl FnOnce(&[*const c_char]) -> R) -> R {
    const FEW: usize = 8;
    if params.len() <= FEW {
        let mut values = [std::ptr::null::<c_char>(); FEW];
        for (v, p) in values.iter_mut().zip(params) {
            *v = p.as_ptr();
        }
        f(&values[..params.len()])
    } else {
        f(&params.iter().map(|p| p.as_ptr()).collect::<Vec<_>>())
    }
}
