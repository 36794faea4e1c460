//! Every transition of the result routing, the sequences outside testing
//! found (a connection lost mid-query, a request gone mid-stream or while
//! queued), and random event sequences against the invariants: every
//! request gets exactly one outcome, a query that was sent is never sent
//! again (unless its statement vanished, which means it did not run), no
//! outcome reaches a request that has gone, a cancel request never
//! reaches a query of a request that is still there, and one that the
//! server dropped is sent again while the query runs.

use super::*;
use crate::testrng::TestRng as Rng;

const P: Mode = Mode::Pipelined { preparing: false };
const PREP: Mode = Mode::Pipelined { preparing: true };

fn ready(reqs: &[(u32, Mode)]) -> Pipeline<u32> {
    let mut p = Pipeline::connecting(reqs[0].0, false);
    for &(r, _) in &reqs[1..] {
        assert_eq!(p.join(r, false), Join::Wait);
    }
    let steps = p.connected();
    assert_eq!(steps, vec![Step::Send(reqs.iter().map(|r| r.0).collect())]);
    for &(r, m) in reqs {
        p.sent(r, m, false);
    }
    p
}

/// Feeds results; returns the routes and steps in order.
fn feed(p: &mut Pipeline<u32>, kinds: &[ResultKind]) -> Vec<String> {
    let mut out = Vec::new();
    for &k in kinds {
        let (route, steps) = p.on_result(k);
        if route != Route::Drop {
            out.push(format!("{route:?}"));
        }
        out.extend(steps.into_iter().map(|s| format!("{s:?}")));
    }
    out
}

use ResultKind::*;

#[test]
fn a_request_in_pipeline_mode() {
    let mut p = ready(&[(1, P)]);
    assert!(p.shareable());
    assert_eq!(feed(&mut p, &[Final, End, Sync]), ["Result(1)", "Complete(1)"]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
    assert!(p.is_idle());
    assert_eq!(p.served(), 1);
}

#[test]
fn a_prepared_request_drops_the_prepare_result() {
    let mut p = ready(&[(1, PREP)]);
    assert_eq!(
        feed(&mut p, &[Final, End, Final, End, Sync]),
        ["Result(1)", "Complete(1)"]
    );
}

#[test]
fn pipelined_requests_get_their_own_results_and_errors() {
    let mut p = ready(&[(1, P), (2, P), (3, P)]);
    let out = feed(
        &mut p,
        &[
            Final,
            End,
            Sync,
            Error(ErrorClass::Statement),
            End,
            Sync,
            Final,
            End,
            Sync,
        ],
    );
    assert_eq!(
        out,
        [
            "Result(1)",
            "Complete(1)",
            "Error(2)",
            "Complete(2)",
            "Result(3)",
            "Complete(3)"
        ]
    );
}

#[test]
fn several_statements_end_at_the_end_mark() {
    let mut p = Pipeline::connecting(7, true);
    assert!(!p.shareable(), "opened for a query that needs it alone");
    p.connected();
    p.sent(7, Mode::Simple, false);
    assert!(!p.shareable());
    assert_eq!(
        feed(&mut p, &[Final, Final, End]),
        ["Result(7)", "Result(7)", "Complete(7)"]
    );
}

/// A ready connection on which statement `id` was prepared by request 100.
fn holding(ids: &[u32]) -> Pipeline<u32> {
    let mut p = Pipeline::connecting(100, false);
    p.connected();
    for &id in ids {
        assert_eq!(p.sent_statement(100 + id, Some(id), false), Wire::PrepareAndExecute);
        feed(&mut p, &[Final, End, Final, End, Sync]);
    }
    p.after_results();
    p
}

#[test]
fn a_statement_is_prepared_once_and_then_executed_by_name() {
    let mut p = holding(&[]);
    assert_eq!(p.sent_statement(1, Some(7), false), Wire::PrepareAndExecute);
    // Pipelined behind the prepare: executed by name at once.
    assert_eq!(p.sent_statement(2, Some(7), false), Wire::Execute);
    assert_eq!(p.sent_statement(3, None, false), Wire::Unnamed);
    let out = feed(
        &mut p,
        &[Final, End, Final, End, Sync, Final, End, Sync, Final, End, Sync],
    );
    assert_eq!(
        out,
        [
            "Result(1)",
            "Complete(1)",
            "Result(2)",
            "Complete(2)",
            "Result(3)",
            "Complete(3)"
        ]
    );
    assert!(p.holds_statement(7));
}

#[test]
fn statements_past_the_limit_run_unnamed() {
    let ids: Vec<u32> = (0..MAX_PREPARED as u32).collect();
    let mut p = holding(&ids);
    assert_eq!(p.sent_statement(1, Some(5), false), Wire::Execute);
    assert_eq!(p.sent_statement(2, Some(9999), false), Wire::Unnamed);
}

#[test]
fn a_vanished_statement_is_sent_again_once() {
    let mut p = holding(&[4]);
    assert_eq!(p.sent_statement(1, Some(4), false), Wire::Execute);
    let out = feed(&mut p, &[Error(ErrorClass::Vanished), End, Sync]);
    assert_eq!(out, ["Resend(1)"]);
    assert!(!p.holds_statement(4), "the session does not have it");
    assert!(p.after_results().is_empty(), "not idle while the request is sent again");
    assert_eq!(p.sent_statement(1, Some(4), false), Wire::PrepareAndExecute);
    // It vanishes again: now it is the request's error.
    let out = feed(&mut p, &[Final, End, Error(ErrorClass::Vanished), End, Sync]);
    assert_eq!(out, ["Error(1)", "Complete(1)"]);
}

#[test]
fn a_failed_prepare_is_the_request_error_and_forgets_only_that_statement() {
    let mut p = holding(&[1, 2]);
    assert_eq!(p.sent_statement(1, Some(3), false), Wire::PrepareAndExecute);
    // A request pipelined behind the failing prepare runs it by name.
    assert_eq!(p.sent_statement(2, Some(3), false), Wire::Execute);
    let out = feed(&mut p, &[Error(ErrorClass::Statement), End, Aborted, Sync]);
    assert_eq!(out, ["Error(1)", "Complete(1)"]);
    assert!(!p.holds_statement(3));
    assert!(p.holds_statement(1) && p.holds_statement(2), "the others stay prepared");
    // The one behind finds it missing and is sent again, preparing it.
    assert_eq!(feed(&mut p, &[Error(ErrorClass::Vanished), End, Sync]), ["Resend(2)"]);
    assert_eq!(p.sent_statement(2, Some(3), false), Wire::PrepareAndExecute);
    assert_eq!(p.sent_statement(5, Some(1), false), Wire::Execute);
}

#[test]
fn a_statement_that_vanishes_unexplained_shows_a_shared_session() {
    let mut p = holding(&[4]);
    assert_eq!(p.sent_statement(1, Some(4), false), Wire::Execute);
    assert_eq!(feed(&mut p, &[Error(ErrorClass::Vanished), End, Sync]), ["Resend(1)"]);
    assert!(p.take_shared_session(), "nothing of the connection's dropped it");
    assert!(!p.take_shared_session(), "said once");
    // Sent again unnamed (the driver's choice once it knows): it runs.
    assert_eq!(p.sent_statement(1, None, false), Wire::Unnamed);
    assert_eq!(feed(&mut p, &[Final, End, Sync]), ["Result(1)", "Complete(1)"]);
}

#[test]
fn a_statement_dropped_by_the_connections_own_query_is_no_sign_of_sharing() {
    let mut p = holding(&[4]);
    p.touch_session();
    assert_eq!(p.sent_statement(1, Some(4), false), Wire::Execute);
    assert_eq!(feed(&mut p, &[Error(ErrorClass::Vanished), End, Sync]), ["Resend(1)"]);
    assert!(!p.take_shared_session());
    // Nor is one whose own prepare failed just before.
    let mut p = holding(&[]);
    assert_eq!(p.sent_statement(1, Some(3), false), Wire::PrepareAndExecute);
    assert_eq!(p.sent_statement(2, Some(3), false), Wire::Execute);
    feed(&mut p, &[Error(ErrorClass::Statement), End, Aborted, Sync]);
    assert_eq!(feed(&mut p, &[Error(ErrorClass::Vanished), End, Sync]), ["Resend(2)"]);
    assert!(!p.take_shared_session());
}

#[test]
fn a_name_taken_by_another_session_is_prepared_again_never_run() {
    let mut p = holding(&[]);
    assert_eq!(p.sent_statement(1, Some(6), false), Wire::PrepareAndExecute);
    // The prepare fails (the name is there already); the execute behind it
    // in the same sync segment is skipped: nothing ran.
    let out = feed(&mut p, &[Error(ErrorClass::Duplicate), End, Aborted, Sync]);
    assert_eq!(out, ["Resend(1)"]);
    assert!(p.take_shared_session());
    assert!(!p.holds_statement(6));
    assert_eq!(p.sent_statement(1, None, false), Wire::Unnamed);
    assert_eq!(feed(&mut p, &[Final, End, Sync]), ["Result(1)", "Complete(1)"]);
    // A second time for the same request: its error.
    assert_eq!(p.sent_statement(2, Some(6), false), Wire::PrepareAndExecute);
    assert_eq!(
        feed(&mut p, &[Error(ErrorClass::Duplicate), End, Aborted, Sync]),
        ["Resend(2)"]
    );
    assert_eq!(p.sent_statement(2, Some(6), false), Wire::PrepareAndExecute);
    let out = feed(&mut p, &[Error(ErrorClass::Duplicate), End, Aborted, Sync]);
    assert_eq!(out, ["Error(2)", "Complete(2)"]);
}

#[test]
fn a_changed_plan_is_deallocated_before_the_request_is_sent_again() {
    let mut p = holding(&[6]);
    assert_eq!(p.sent_statement(1, Some(6), false), Wire::Execute);
    assert_eq!(p.sent_statement(2, Some(6), false), Wire::Execute);
    let out = feed(&mut p, &[Error(ErrorClass::PlanChanged), End]);
    assert_eq!(out, ["Deallocate(1)"]);
    p.sent_internal();
    assert_eq!(feed(&mut p, &[Sync]), ["Resend(1)"]);
    assert_eq!(p.sent_statement(1, Some(6), false), Wire::PrepareAndExecute);
    // Request 2 ran the old plan too: no second DEALLOCATE (the prepare of
    // request 1 is newer), and it is sent again to run by name.
    let out = feed(&mut p, &[Error(ErrorClass::PlanChanged), End, Sync]);
    assert_eq!(out, ["Resend(2)"]);
    assert_eq!(p.sent_statement(2, Some(6), false), Wire::Execute);
    // The DEALLOCATE's results are dropped; then the two run.
    let out = feed(
        &mut p,
        &[Final, End, Sync, Final, End, Final, End, Sync, Final, End, Sync],
    );
    assert_eq!(out, ["Result(1)", "Complete(1)", "Result(2)", "Complete(2)"]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
}

#[test]
fn the_gateways_own_deallocate_is_never_cancelled() {
    let mut p = holding(&[6]);
    assert_eq!(p.sent_statement(1, Some(6), false), Wire::Execute);
    assert_eq!(feed(&mut p, &[Error(ErrorClass::PlanChanged), End]), ["Deallocate(1)"]);
    p.sent_internal();
    feed(&mut p, &[Sync]);
    // The request leaves before it is sent again: the DEALLOCATE runs on.
    assert!(p.abandon(1).is_empty());
    assert!(feed(&mut p, &[Final, End]).is_empty());
    assert!(p.after_results().is_empty(), "no drain, no cancel");
    feed(&mut p, &[Sync]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
    assert!(!p.holds_statement(6));
}

#[test]
fn errors_of_unnamed_statements_are_never_sent_again() {
    let mut p = ready(&[(1, P), (2, P)]);
    let out = feed(
        &mut p,
        &[
            Error(ErrorClass::PlanChanged),
            End,
            Sync,
            Error(ErrorClass::Vanished),
            End,
            Sync,
        ],
    );
    assert_eq!(out, ["Error(1)", "Complete(1)", "Error(2)", "Complete(2)"]);
}

#[test]
fn requests_that_need_the_connection_alone_wait_their_turn() {
    let mut p = ready(&[(1, P)]);
    // A query of several statements waits for the one in flight.
    assert_eq!(p.join(2, true), Join::Wait);
    assert!(!p.shareable(), "nothing jumps ahead of a waiting request");
    // A plain one queued behind it waits too, in order.
    assert_eq!(p.join(3, false), Join::Wait);
    assert_eq!(feed(&mut p, &[Final, End, Sync]), ["Result(1)", "Complete(1)"]);
    assert_eq!(p.after_results(), vec![Step::Send(vec![2])], "alone");
    p.sent(2, Mode::Simple, false);
    assert_eq!(
        feed(&mut p, &[Final, Final, End]),
        ["Result(2)", "Result(2)", "Complete(2)"]
    );
    assert_eq!(p.after_results(), vec![Step::Send(vec![3])]);
    p.sent(3, P, false);
    // A stream on an idle connection goes at once; nothing queues behind it.
    feed(&mut p, &[Final, End, Sync]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
    assert_eq!(p.join(4, true), Join::SendNow);
    p.sent(4, P, true);
    assert_eq!(p.join(5, false), Join::Wait);
    // The stream's request leaves: its query is cancelled at once (the
    // waiting one does not keep it running), then the waiting one goes.
    assert_eq!(p.abandon(4), vec![Step::DrainTimer, Step::Cancel]);
    feed(&mut p, &[Error(ErrorClass::Statement), End, Sync]);
    assert!(p.after_results().is_empty());
    assert_eq!(p.cancel_done(), vec![Step::Send(vec![5])]);
}

#[test]
fn nothing_queues_behind_a_request_that_changes_its_session() {
    let mut p = holding(&[]);
    // A "begin": one statement, pipelined, but alone on the connection.
    assert_eq!(p.join(1, true), Join::SendNow);
    assert_eq!(p.sent_statement(1, Some(3), false), Wire::PrepareAndExecute);
    assert!(!p.shareable(), "nothing may run inside its transaction");
    assert_eq!(p.join(2, false), Join::Wait);
    assert_eq!(
        feed(&mut p, &[Final, End, Final, End, Sync]),
        ["Result(1)", "Complete(1)"]
    );
    // The driver checks the session before the waiting one goes out.
    assert_eq!(p.after_results(), vec![Step::Send(vec![2])]);
}

#[test]
fn a_failed_prepare_is_the_request_error() {
    let mut p = ready(&[(1, PREP)]);
    let out = feed(&mut p, &[Error(ErrorClass::PlanChanged), End, Aborted, Sync]);
    assert_eq!(out, ["Error(1)", "Complete(1)"]);
}

#[test]
fn lost_mid_query_fails_sent_queries_and_never_resends_them() {
    let mut p = ready(&[(1, P), (2, P)]);
    assert_eq!(feed(&mut p, &[Error(ErrorClass::SessionEnd)]), ["SessionEnding"]);
    assert_eq!(p.lost(), vec![(1, Lost::Sent), (2, Lost::Sent)]);
    assert!(p.is_closed());
    assert!(!p.shareable());
}

#[test]
fn lost_while_connecting_or_draining() {
    let mut p = Pipeline::connecting(1, false);
    p.join(2, false);
    assert_eq!(p.lost(), vec![(1, Lost::Connect), (2, Lost::Connect)]);
    // Waiting on a draining connection: never sent, so one more try.
    let mut p = ready(&[(1, P)]);
    p.abandon(1);
    assert_eq!(p.join(2, false), Join::Wait);
    assert_eq!(p.lost(), vec![(2, Lost::NotSent)]);
}

#[test]
fn a_request_gone_mid_stream_releases_the_connection() {
    let mut p = Pipeline::connecting(1, true);
    p.connected();
    p.sent(1, P, true);
    assert!(!p.shareable(), "nothing queues behind a stream");
    assert!(p.wants_single_row());
    assert!(!p.wants_single_row(), "asked once");
    assert_eq!(feed(&mut p, &[Row, Row]), ["Row(1)", "Row(1)"]);
    p.pause();
    let steps = p.abandon(1);
    assert_eq!(steps, vec![Step::Resume, Step::DrainTimer, Step::Cancel]);
    // The rest of its rows are dropped; a new request waits for the drain.
    assert_eq!(p.join(2, false), Join::Wait);
    assert!(feed(&mut p, &[Row, Error(ErrorClass::Statement), End, Sync]).is_empty());
    assert!(p.after_results().is_empty(), "the cancel request is not through yet");
    assert_eq!(p.cancel_done(), vec![Step::Send(vec![2])]);
    p.sent(2, P, false);
    assert_eq!(feed(&mut p, &[Final, End, Sync]), ["Result(2)", "Complete(2)"]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
}

#[test]
fn a_request_gone_while_queued_behind_a_live_one_is_not_cancelled() {
    let mut p = ready(&[(1, P), (2, P)]);
    assert!(p.abandon(2).is_empty(), "request 1 is still there: no cancel");
    assert_eq!(feed(&mut p, &[Final, End, Sync]), ["Result(1)", "Complete(1)"]);
    // Only the gone one is left, running: now it is cancelled.
    assert_eq!(p.after_results(), vec![Step::DrainTimer, Step::Cancel]);
    assert!(feed(&mut p, &[Final, End, Sync]).is_empty());
    assert!(p.after_results().is_empty());
    assert_eq!(p.cancel_done(), vec![Step::Settle]);
    assert!(p.is_idle());
}

#[test]
fn each_running_query_of_gone_requests_is_cancelled_in_turn() {
    let mut p = ready(&[(1, P), (2, P), (3, P)]);
    p.abandon(1);
    p.abandon(2);
    assert_eq!(p.abandon(3), vec![Step::DrainTimer, Step::Cancel]);
    assert_eq!(
        p.cancel_done(),
        vec![Step::CancelLater(CANCEL_AGAIN_FIRST)],
        "the same query still runs: cancelled again after a pause, its drain time not started again"
    );
    feed(&mut p, &[Error(ErrorClass::Statement), End, Sync]);
    // The next one runs now: one cancel request for it, once, and the
    // drain's time starts again for it.
    assert_eq!(p.after_results(), vec![Step::DrainTimer, Step::Cancel]);
    assert!(p.after_results().is_empty());
    feed(&mut p, &[Error(ErrorClass::Statement), End, Sync]);
    assert!(
        p.after_results().is_empty(),
        "the previous cancel request is not through"
    );
    assert_eq!(p.cancel_done(), vec![Step::DrainTimer, Step::Cancel]);
    feed(&mut p, &[Final, End, Sync]);
    assert!(p.after_results().is_empty());
    assert_eq!(p.cancel_done(), vec![Step::Settle]);
    assert!(p.is_idle());
}

#[test]
fn a_cancel_request_the_server_dropped_is_sent_again_with_a_growing_pause() {
    let mut p = ready(&[(1, P)]);
    assert_eq!(p.abandon(1), vec![Step::DrainTimer, Step::Cancel]);
    assert!(p.gone_query_runs());
    assert!(p.cancel_again().is_empty(), "no timer runs: nothing to send again");
    let mut pauses = Vec::new();
    for _ in 0..7 {
        // The query started after the cancel request reached its backend
        // (which then drops it): it still runs.
        match p.cancel_done().into_iter().collect::<Vec<_>>().as_slice() {
            [Step::CancelLater(ms)] => pauses.push(*ms),
            other => panic!("{other:?}"),
        }
        assert!(p.after_results().is_empty(), "nothing arrived: the timer decides");
        assert_eq!(
            p.cancel_again(),
            vec![Step::Cancel],
            "sent again, without a new drain time"
        );
        assert!(p.cancel_again().is_empty(), "once per timer");
    }
    assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000, 1000]);
    assert_eq!(p.cancel_tries(), 8);
    // This one lands: the query ends. The timer of a request in flight is
    // not started; the connection serves once the request is through.
    assert!(feed(&mut p, &[Error(ErrorClass::Statement), End, Sync]).is_empty());
    assert!(p.after_results().is_empty());
    assert!(!p.gone_query_runs());
    assert_eq!(p.cancel_done(), vec![Step::Settle]);
    assert!(p.is_idle());
    assert_eq!(p.cancel_tries(), 0);
}

#[test]
fn a_query_that_ended_during_the_pause_gets_no_more_cancel_requests() {
    let mut p = ready(&[(1, P)]);
    assert_eq!(p.join(2, false), Join::SendNow);
    p.sent(2, P, false);
    assert!(p.abandon(2).is_empty());
    assert_eq!(p.join(3, false), Join::SendNow);
    p.sent(3, P, false);
    assert!(p.abandon(3).is_empty());
    assert_eq!(p.abandon(1), vec![Step::DrainTimer, Step::Cancel]);
    assert_eq!(p.cancel_done(), vec![Step::CancelLater(100)]);
    // Query 1 ends during the pause: query 2 is cancelled at once, with
    // its own drain time; the timer that was for query 1 then does nothing.
    feed(&mut p, &[Error(ErrorClass::Statement), End, Sync]);
    assert_eq!(p.after_results(), vec![Step::DrainTimer, Step::Cancel]);
    assert!(p.cancel_again().is_empty(), "the timer of query 1");
    assert_eq!(
        p.cancel_done(),
        vec![Step::CancelLater(100)],
        "the pause starts over for query 2"
    );
    // Query 2 ends; query 3 has not been cancelled: the timer sends its first.
    feed(&mut p, &[Error(ErrorClass::Statement), End, Sync]);
    assert_eq!(p.after_results(), vec![Step::DrainTimer, Step::Cancel]);
    assert_eq!(p.cancel_done(), vec![Step::CancelLater(100)]);
    // Query 3 ends during the pause: the connection serves; the timer that
    // fires then sends nothing (a new request could be running by then).
    feed(&mut p, &[Final, End, Sync]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
    assert_eq!(p.join(4, false), Join::SendNow);
    p.sent(4, P, false);
    assert!(p.cancel_again().is_empty());
    assert!(!p.gone_query_runs());
}

#[test]
fn without_a_cancel_key_nothing_is_sent_until_the_drain_is_over() {
    let mut p = ready(&[(1, P), (2, P)]);
    p.abandon(2);
    assert_eq!(p.abandon(1), vec![Step::DrainTimer, Step::Cancel]);
    p.cancel_unavailable();
    assert!(p.gone_query_runs(), "it runs on, uncancelled");
    feed(&mut p, &[Final, End, Sync]);
    assert!(
        p.after_results().is_empty(),
        "no cancel request for the next query either"
    );
    assert!(p.cancel_again().is_empty());
    feed(&mut p, &[Final, End, Sync]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
    // A later drain tries again.
    assert_eq!(p.join(3, false), Join::SendNow);
    p.sent(3, P, false);
    assert_eq!(p.abandon(3), vec![Step::DrainTimer, Step::Cancel]);
}

#[test]
fn a_lost_connection_leaves_no_cancel_to_send_again() {
    let mut p = ready(&[(1, P)]);
    p.abandon(1);
    assert_eq!(p.cancel_done(), vec![Step::CancelLater(100)]);
    assert!(p.gone_query_runs());
    assert!(p.lost().is_empty());
    assert!(!p.gone_query_runs());
    assert!(p.cancel_again().is_empty());
    assert!(p.cancel_done().is_empty());
}

#[test]
fn a_connection_still_connecting_closes_when_everyone_left() {
    let mut p = Pipeline::connecting(1, false);
    p.join(2, false);
    assert!(p.abandon(1).is_empty());
    assert_eq!(p.abandon(2), vec![Step::Close]);
    assert!(p.is_closed());
}

#[test]
fn picked_but_never_used_settles() {
    let mut p = ready(&[(1, P)]);
    feed(&mut p, &[Final, End, Sync]);
    p.after_results();
    assert_eq!(p.join(5, false), Join::SendNow);
    assert_eq!(p.abandon(5), vec![Step::Settle]);
}

#[test]
fn copy_is_refused_and_confusion_is_caught() {
    let mut p = ready(&[(1, P), (2, P)]);
    assert_eq!(feed(&mut p, &[Copy]), ["Refused(1)"]);
    assert_eq!(p.lost(), vec![(2, Lost::Sent)], "the refused one is not failed twice");
    let mut p = ready(&[(1, P)]);
    assert_eq!(feed(&mut p, &[End, End, End]), ["Confused"]);
    let mut p: Pipeline<u32> = ready(&[(1, P)]);
    feed(&mut p, &[Final, End, Sync]);
    assert_eq!(p.on_result(Final).0, Route::Confused, "a result nobody asked for");
}

#[test]
fn severities_and_sqlstates() {
    assert_eq!(ErrorClass::of("ERROR", "26000"), ErrorClass::Vanished);
    assert_eq!(ErrorClass::of("ERROR", "0A000"), ErrorClass::PlanChanged);
    assert_eq!(ErrorClass::of("ERROR", "42P05"), ErrorClass::Duplicate);
    assert_eq!(ErrorClass::of("FATAL", "57P01"), ErrorClass::SessionEnd);
    assert_eq!(ErrorClass::of("PANIC", "XX000"), ErrorClass::SessionEnd);
    assert_eq!(ErrorClass::of("FATAL", "08006"), ErrorClass::SessionEnd);
    assert_eq!(
        ErrorClass::of("ERROR", "08P01"),
        ErrorClass::Statement,
        "a protocol violation in one message answers that query"
    );
    assert_eq!(
        ErrorClass::of("ERROR", "57014"),
        ErrorClass::Statement,
        "a cancelled query is its own error"
    );
    assert_eq!(ErrorClass::of("ERROR", "42P01"), ErrorClass::Statement);
}

// ------------------------------------------------------- random sequences ----

/// What went out for one request (or the gateway's DEALLOCATE).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Sent {
    Simple,
    Pipelined(Wire, Option<u32>),
    Deallocate(u32),
}

/// One query sent to the model server: its answers are made when the server
/// runs it (from what the session holds then), and read in order.
struct Script {
    sent: Sent,
    results: Option<std::collections::VecDeque<ResultKind>>,
    req: u32,
    /// Its prepare has not answered yet (a cancel makes it fail).
    prepare_pending: bool,
    /// A preamble query goes before the request's own.
    pre: bool,
    /// Query ends still to come before its prepare's (the preamble's).
    ends_before_prepare: u8,
}

/// The session's prepared statements at the model server: stale after a
/// schema change.
#[derive(Default)]
struct Session {
    held: std::collections::HashMap<u32, bool>,
}

#[derive(Default)]
struct Log {
    terminal: std::collections::HashMap<u32, String>,
    gone: std::collections::HashSet<u32>,
    sent: std::collections::HashSet<u32>,
    vanished: std::collections::HashSet<u32>,
    resent: std::collections::HashSet<u32>,
}

/// What the random runs went through, to show they are not vacuous.
#[derive(Default, Debug)]
struct Seen {
    complete: u64,
    lost_sent: u64,
    lost_waiting: u64,
    resent: u64,
    cancels: u64,
    /// Cancel requests the server dropped (the query had not started).
    cancels_dropped: u64,
    /// Cancel requests sent again for the same query.
    cancels_again: u64,
    gone: u64,
    rows: u64,
    waited: u64,
    deallocated: u64,
    failed_prepares: u64,
    executed_by_name: u64,
    alone: u64,
    preambles: u64,
    failed_preambles: u64,
}

struct Sim {
    p: Pipeline<u32>,
    seen: Seen,
    rng: Rng,
    server: std::collections::VecDeque<Script>,
    log: Log,
    next_req: u32,
    cancel_pending: bool,
    /// A `CancelLater` timer runs.
    cancel_timer: bool,
    closed: bool,
    session_ending: bool,
    session: Session,
    /// The statement each request runs by name.
    statement_of: std::collections::HashMap<u32, u32>,
    streams: std::collections::HashSet<u32>,
    kind: std::collections::HashMap<u32, Kind>,
}

/// What a request of the random runs asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    /// Several statements: the simple protocol, the connection alone.
    Simple,
    /// Streamed rows: nothing queued behind it.
    Stream,
}

impl Sim {
    /// The server runs the query: its answers, from what the session holds.
    fn run_script(
        &mut self,
        sent: Sent,
        req: u32,
        streaming: bool,
        pre: bool,
    ) -> std::collections::VecDeque<ResultKind> {
        let mut r = std::collections::VecDeque::new();
        // The preamble (the role and settings): it fails now and then (a
        // role that cannot be set), and the request's queries are skipped.
        if pre {
            if self.rng.below(6) == 0 {
                self.seen.failed_preambles += 1;
                r.extend([Error(ErrorClass::Statement), End]);
                let queries = if matches!(sent, Sent::Pipelined(Wire::PrepareAndExecute, _)) {
                    2
                } else {
                    1
                };
                for _ in 0..queries {
                    r.extend([Aborted, End]);
                }
                r.push_back(Sync);
                return r;
            }
            self.seen.preambles += 1;
            r.extend([Final, End]);
        }
        let fate = self.rng.below(10);
        let body = |r: &mut std::collections::VecDeque<ResultKind>, rng: &mut Rng| {
            if fate == 2 {
                r.extend([Error(ErrorClass::Statement), End]);
            } else {
                if streaming {
                    for _ in 0..rng.below(4) {
                        r.push_back(Row);
                    }
                }
                r.extend([Final, End]);
            }
        };
        match sent {
            Sent::Simple => {
                for _ in 0..1 + self.rng.below(3) {
                    r.push_back(if fate == 0 { Error(ErrorClass::Statement) } else { Final });
                }
                r.push_back(End);
                return r;
            }
            Sent::Deallocate(id) => {
                if self.session.held.remove(&id).is_some() {
                    r.extend([Final, End]);
                } else {
                    r.extend([Error(ErrorClass::Vanished), End]);
                }
            }
            Sent::Pipelined(Wire::Unnamed, _) => body(&mut r, &mut self.rng),
            Sent::Pipelined(Wire::Execute, id) => match self.session.held.get(&id.unwrap()) {
                None => {
                    self.log.vanished.insert(req);
                    r.extend([Error(ErrorClass::Vanished), End]);
                }
                Some(true) => {
                    self.log.vanished.insert(req);
                    r.extend([Error(ErrorClass::PlanChanged), End]);
                }
                Some(false) => {
                    self.seen.executed_by_name += 1;
                    body(&mut r, &mut self.rng)
                }
            },
            Sent::Pipelined(Wire::PrepareAndExecute, id) => {
                let id = id.unwrap();
                assert!(
                    !self.session.held.contains_key(&id),
                    "statement {id} prepared while the session holds it (request {req})"
                );
                if fate == 3 {
                    self.seen.failed_prepares += 1;
                    r.extend([Error(ErrorClass::Statement), End, Aborted]);
                } else {
                    self.session.held.insert(id, false);
                    r.extend([Final, End]);
                    body(&mut r, &mut self.rng);
                }
            }
        }
        r.push_back(Sync);
        r
    }

    fn send(&mut self, req: u32) {
        let kind = self.kind.get(&req).copied().unwrap_or(Kind::Plain);
        let streaming = kind == Kind::Stream;
        // Nothing goes out behind a stream or a query of several statements
        // (their requests need the connection alone), and those go out
        // only when nothing is in flight.
        for s in &self.server {
            let k = self.kind.get(&s.req).copied().unwrap_or(Kind::Plain);
            assert!(
                k == Kind::Plain,
                "request {req} sent behind request {} ({k:?}), still in flight",
                s.req
            );
        }
        // (A stream sent again may follow the gateway's own DEALLOCATE.)
        if kind != Kind::Plain {
            assert!(
                self.server.iter().all(|s| s.req == 0),
                "request {req} ({kind:?}) sent while queries are in flight"
            );
        }
        let statement = match self.statement_of.get(&req) {
            Some(&id) => Some(id),
            None if self.rng.below(3) > 0 => Some(1 + self.rng.below(3) as u32),
            None => None,
        };
        if let Some(id) = statement {
            self.statement_of.insert(req, id);
        }
        assert!(
            !self.log.sent.contains(&req) || self.log.resent.contains(&req),
            "request {req} sent twice without its statement vanishing"
        );
        self.log.sent.insert(req);
        let pre = kind != Kind::Simple && self.rng.below(3) == 0;
        let sent = if kind == Kind::Simple {
            self.p.sent(req, Mode::Simple, streaming);
            Sent::Simple
        } else {
            let wire = self.p.sent_statement_with(req, statement, streaming, u8::from(pre));
            Sent::Pipelined(wire, statement)
        };
        if streaming {
            self.streams.insert(req);
        }
        self.server.push_back(Script {
            sent,
            results: None,
            req,
            prepare_pending: matches!(sent, Sent::Pipelined(Wire::PrepareAndExecute, _)),
            pre,
            ends_before_prepare: u8::from(pre),
        });
    }

    fn terminal(&mut self, req: u32, what: String) {
        assert!(
            !self.log.gone.contains(&req),
            "{what} for request {req}, which had gone"
        );
        let before = self.log.terminal.insert(req, what.clone());
        assert!(before.is_none(), "request {req}: {what} after {before:?}");
    }

    fn steps(&mut self, steps: Steps<u32>) {
        for s in steps {
            match s {
                Step::Complete(r) => {
                    self.seen.complete += 1;
                    self.terminal(r, "complete".into())
                }
                Step::Resend(r) => {
                    assert!(self.log.vanished.contains(&r), "request {r} sent again though it ran");
                    assert!(self.log.resent.insert(r), "request {r} sent again twice");
                    self.seen.resent += 1;
                    self.send(r);
                }
                Step::Send(rs) => {
                    for r in rs {
                        self.seen.waited += 1;
                        assert!(!self.log.sent.contains(&r), "request {r} was waiting and already sent");
                        self.send(r);
                    }
                }
                Step::Cancel => {
                    // Only queries of requests that are gone may be cancelled.
                    for s in &self.server {
                        assert!(
                            self.log.gone.contains(&s.req),
                            "a cancel request while request {} runs",
                            s.req
                        );
                    }
                    self.cancel_pending = true;
                    self.seen.cancels += 1;
                }
                Step::Deallocate(r) => {
                    assert!(
                        self.log.vanished.contains(&r),
                        "a DEALLOCATE for request {r}, whose plan held"
                    );
                    assert!(
                        !self.log.gone.contains(&r),
                        "a DEALLOCATE for request {r}, which had gone"
                    );
                    self.seen.deallocated += 1;
                    let id = self.statement_of[&r];
                    self.p.sent_internal();
                    self.server.push_back(Script {
                        sent: Sent::Deallocate(id),
                        results: None,
                        req: 0,
                        prepare_pending: false,
                        pre: false,
                        ends_before_prepare: 0,
                    });
                }
                Step::CancelLater(ms) => {
                    assert!(
                        (CANCEL_AGAIN_FIRST..=CANCEL_AGAIN_MAX).contains(&ms),
                        "a pause of {ms} ms"
                    );
                    assert!(
                        self.server.iter().all(|s| self.log.gone.contains(&s.req)),
                        "a cancel request to come while a request that is there runs"
                    );
                    self.cancel_timer = true;
                }
                Step::Close => self.closed = true,
                Step::DrainTimer | Step::Settle | Step::Resume => {}
            }
        }
    }

    fn lose(&mut self) {
        for (r, lost) in self.p.lost() {
            if lost == Lost::Sent {
                self.seen.lost_sent += 1;
            } else {
                self.seen.lost_waiting += 1;
                assert!(!self.log.sent.contains(&r), "request {r} was sent, yet {lost:?}");
            }
            self.terminal(r, format!("lost {lost:?}"));
        }
        self.closed = true;
        self.server.clear();
    }

    fn deliver_one(&mut self) {
        if self.p.wants_single_row() {
            // The model server sends rows one by one anyway.
        }
        let Some(front) = self.server.front() else { return };
        if front.results.is_none() {
            let (sent, req) = (front.sent, front.req);
            let streaming = self.streams.contains(&req);
            let pre = front.pre;
            let r = self.run_script(sent, req, streaming, pre);
            self.server.front_mut().unwrap().results = Some(r);
        }
        let front = self.server.front_mut().unwrap();
        let results = front.results.as_mut().unwrap();
        let Some(kind) = results.pop_front() else { return };
        if front.prepare_pending && kind == End {
            if front.ends_before_prepare > 0 {
                front.ends_before_prepare -= 1;
            } else {
                front.prepare_pending = false;
            }
        }
        let req = front.req;
        if results.is_empty() {
            self.server.pop_front();
        }
        let (route, steps) = self.p.on_result(kind);
        match route {
            Route::Row(r) | Route::Result(r) | Route::Error(r) | Route::PreambleError(r) => {
                self.seen.rows += u64::from(kind == Row);
                assert_eq!(r, req, "a result of request {req} went to request {r}");
                assert!(
                    !self.log.gone.contains(&r),
                    "a result reached request {r}, which had gone"
                );
            }
            Route::Refused(r) => self.terminal(r, "refused".into()),
            Route::SessionEnding => self.session_ending = true,
            Route::Confused => panic!("the model server sent what was asked"),
            Route::Drop => {}
        }
        self.steps(steps.into_iter().collect());
        let after = self.p.after_results();
        self.steps(after);
        if self.session_ending {
            self.lose();
        }
    }

    fn run(seed: u64, seen: &mut Seen) {
        let mut sim = Sim {
            p: Pipeline::connecting(1, false),
            seen: Seen::default(),
            rng: Rng::new(seed),
            server: Default::default(),
            log: Log::default(),
            next_req: 2,
            cancel_pending: false,
            cancel_timer: false,
            closed: false,
            session_ending: false,
            session: Session::default(),
            statement_of: Default::default(),
            streams: Default::default(),
            kind: Default::default(),
        };
        let mut all = vec![1];
        for _ in 0..80 {
            if sim.closed {
                break;
            }
            match sim.rng.below(12) {
                0 if sim.p.is_connecting() => {
                    let steps = sim.p.connected();
                    sim.steps(steps);
                }
                // The pool may queue a request on any connection that is
                // not closed (at its bound it picks the least busy).
                0 | 1 if !sim.p.is_closed() => {
                    let r = sim.next_req;
                    sim.next_req += 1;
                    all.push(r);
                    let kind = match sim.rng.below(6) {
                        0 => Kind::Simple,
                        1 => Kind::Stream,
                        _ => Kind::Plain,
                    };
                    sim.kind.insert(r, kind);
                    if kind != Kind::Plain {
                        sim.seen.alone += 1;
                    }
                    if sim.p.join(r, kind != Kind::Plain) == Join::SendNow {
                        sim.send(r);
                    }
                }
                2 => {
                    let live: Vec<u32> = all
                        .iter()
                        .copied()
                        .filter(|r| !sim.log.gone.contains(r) && !sim.log.terminal.contains_key(r))
                        .collect();
                    if !live.is_empty() {
                        let r = live[sim.rng.below(live.len() as u64) as usize];
                        sim.log.gone.insert(r);
                        sim.seen.gone += 1;
                        let steps = sim.p.abandon(r);
                        sim.steps(steps);
                    }
                }
                3 if sim.cancel_pending => {
                    sim.cancel_pending = false;
                    // The server drops a cancel request that comes before
                    // the query started: it runs on.
                    let dropped = sim.rng.below(3) == 0;
                    if dropped {
                        sim.seen.cancels_dropped += 1;
                    }
                    // A cancelled query ends with an error (a prepare that
                    // had not answered fails: the session does not have it).
                    if let Some(front) = sim.server.front_mut().filter(|_| !dropped) {
                        let simple = front.sent == Sent::Simple;
                        let pending = front.prepare_pending;
                        let results = front.results.get_or_insert_with(|| [Final].into());
                        if results.iter().any(|k| *k == Row || *k == Final) {
                            results.clear();
                            results.extend([Error(ErrorClass::Statement), End]);
                            if pending {
                                results.push_back(Aborted);
                            }
                            if !simple {
                                results.push_back(Sync);
                            }
                            if let (true, Sent::Pipelined(_, Some(id))) = (pending, front.sent) {
                                sim.session.held.remove(&id);
                            }
                        }
                    }
                    let steps = sim.p.cancel_done();
                    // A query of a request that is gone, still running
                    // after its cancel request: another one is due.
                    if dropped && sim.p.gone_query_runs() {
                        assert!(
                            steps.iter().any(|s| matches!(s, Step::Cancel | Step::CancelLater(_))),
                            "a dropped cancel request is never sent again: {steps:?}"
                        );
                    }
                    sim.steps(steps);
                }
                9 if sim.cancel_timer => {
                    sim.cancel_timer = false;
                    let steps = sim.p.cancel_again();
                    if steps == vec![Step::Cancel] {
                        sim.seen.cancels_again += 1;
                    }
                    sim.steps(steps);
                }
                4 if sim.rng.below(10) == 0 => sim.lose(),
                // Another session changes the schema: every plan is stale.
                7 if sim.rng.below(8) == 0 => sim.session.held.values_mut().for_each(|s| *s = true),
                // DISCARD ALL ran on the session.
                8 if sim.rng.below(12) == 0 => sim.session.held.clear(),
                5 if sim.p.is_paused() => sim.p.resume(),
                6 if !sim.p.is_paused() && sim.rng.below(3) == 0 => sim.p.pause(),
                _ if !sim.p.is_paused() => sim.deliver_one(),
                _ => {}
            }
        }
        // Quiesce: the connection finishes what it has (or is lost).
        sim.p.resume();
        let mut guard = 0;
        while !sim.closed && (!sim.server.is_empty() || sim.cancel_pending) {
            guard += 1;
            assert!(guard < 10_000, "no progress");
            if sim.cancel_pending {
                sim.cancel_pending = false;
                let steps = sim.p.cancel_done();
                sim.steps(steps);
            } else if sim.cancel_timer && sim.rng.below(2) == 0 {
                sim.cancel_timer = false;
                let steps = sim.p.cancel_again();
                sim.steps(steps);
            } else {
                sim.deliver_one();
            }
        }
        if sim.p.is_connecting() && !sim.closed {
            sim.lose();
        }
        // Every request that stayed has exactly one outcome; one that left, none.
        for r in all {
            if sim.log.gone.contains(&r) {
                continue;
            }
            let waiting = sim.p.waiting.contains(&r);
            assert!(
                sim.log.terminal.contains_key(&r) || waiting,
                "seed {seed}: request {r} got no outcome"
            );
        }
        let s = &sim.seen;
        seen.complete += s.complete;
        seen.lost_sent += s.lost_sent;
        seen.lost_waiting += s.lost_waiting;
        seen.resent += s.resent;
        seen.cancels += s.cancels;
        seen.cancels_dropped += s.cancels_dropped;
        seen.cancels_again += s.cancels_again;
        seen.gone += s.gone;
        seen.rows += s.rows;
        seen.waited += s.waited;
        seen.deallocated += s.deallocated;
        seen.failed_prepares += s.failed_prepares;
        seen.executed_by_name += s.executed_by_name;
        seen.preambles += s.preambles;
        seen.failed_preambles += s.failed_preambles;
        seen.alone += s.alone;
    }
}

#[test]
fn random_event_sequences_keep_the_invariants() {
    let mut seen = Seen::default();
    // Miri runs a few hundred of them (it is some thousand times slower).
    let runs: u64 = if cfg!(miri) { 300 } else { 3000 };
    for seed in 1..runs {
        Sim::run(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), &mut seen);
    }
    // Each kind of event happened many times.
    for (what, n) in [
        ("complete", seen.complete),
        ("lost after sending", seen.lost_sent),
        ("lost while waiting", seen.lost_waiting),
        ("sent again", seen.resent),
        ("cancel requests", seen.cancels),
        ("cancel requests dropped", seen.cancels_dropped),
        ("cancel requests sent again", seen.cancels_again),
        ("requests gone", seen.gone),
        ("rows", seen.rows),
        ("sent after waiting", seen.waited),
        ("DEALLOCATEs of changed plans", seen.deallocated),
        ("failed prepares", seen.failed_prepares),
        ("executed by name", seen.executed_by_name),
        ("preambles", seen.preambles),
        ("failed preambles", seen.failed_preambles),
        ("requests that need the connection alone", seen.alone),
    ] {
        assert!(n > runs / 30, "only {n} {what}: {seen:?}");
    }
}

#[test]
fn requests_withdrawn_at_connect_leave_the_others_to_go_out() {
    // 1 needs the connection alone; 2 waits behind it. 1's server turns out
    // not to be what 1 asks for: 1 leaves unsent, 2 goes out.
    let mut p = Pipeline::connecting(1, true);
    assert_eq!(p.join(2, false), Join::Wait);
    assert_eq!(p.connected(), vec![Step::Send(vec![1])]);
    p.withdraw(1);
    assert_eq!(p.resume_waiting(), vec![Step::Send(vec![2])]);
    p.sent(2, P, false);
    assert_eq!(feed(&mut p, &[Final, End, Sync]), ["Result(2)", "Complete(2)"]);
    assert_eq!(p.after_results(), vec![Step::Settle]);
    assert!(p.is_idle());
    // The only request withdrawn: the connection settles, idle.
    let mut p = Pipeline::connecting(3, false);
    assert_eq!(p.connected(), vec![Step::Send(vec![3])]);
    p.withdraw(3);
    assert_eq!(p.resume_waiting(), vec![Step::Settle]);
    assert!(p.is_idle());
    assert_eq!(p.served(), 0);
}

#[test]
fn a_preamble_result_is_dropped_and_the_query_answers() {
    let mut p = holding(&[]);
    assert_eq!(p.sent_statement_with(1, None, false, 1), Wire::Unnamed);
    assert_eq!(
        feed(&mut p, &[Final, End, Final, End, Sync]),
        ["Result(1)", "Complete(1)"]
    );
    // With a prepare: preamble, prepare, execute.
    assert_eq!(p.sent_statement_with(2, Some(3), false, 1), Wire::PrepareAndExecute);
    assert_eq!(
        feed(&mut p, &[Final, End, Final, End, Final, End, Sync]),
        ["Result(2)", "Complete(2)"]
    );
    assert!(p.holds_statement(3));
    // Four query ends in one segment of a request with a preamble (three
    // queries at most): confusion.
    assert_eq!(p.sent_statement_with(4, None, false, 1), Wire::Unnamed);
    assert_eq!(
        feed(&mut p, &[Final, End, Final, End, Final, End, Final, End]),
        ["Result(4)", "Result(4)", "Result(4)", "Confused"]
    );
}

#[test]
fn a_preamble_error_is_the_requests_and_skips_its_queries() {
    let mut p = holding(&[]);
    assert_eq!(p.sent_statement_with(1, Some(5), false, 1), Wire::PrepareAndExecute);
    // Pipelined behind, executing the statement the first one prepares.
    assert_eq!(p.sent_statement(2, Some(5), false), Wire::Execute);
    let out = feed(
        &mut p,
        &[Error(ErrorClass::Statement), End, Aborted, End, Aborted, End, Sync],
    );
    assert_eq!(out, ["PreambleError(1)", "Complete(1)"]);
    assert!(!p.holds_statement(5), "its prepare was skipped");
    // The one behind finds no statement: sent again, prepared, and the
    // connection is not taken for a shared session.
    let out = feed(&mut p, &[Error(ErrorClass::Vanished), End, Sync]);
    assert_eq!(out, ["Resend(2)"]);
    assert!(!p.take_shared_session());
    assert_eq!(p.sent_statement(2, Some(5), false), Wire::PrepareAndExecute);
}

#[test]
fn a_streamed_request_with_a_preamble_asks_single_rows_for_its_own_query() {
    let mut p = holding(&[]);
    p.sent_statement_with(1, None, true, 1);
    assert!(!p.wants_single_row(), "not for the preamble");
    feed(&mut p, &[Final, End]);
    assert!(p.wants_single_row());
    assert_eq!(
        feed(&mut p, &[Row, Row, Final, End, Sync]),
        ["Row(1)", "Row(1)", "Result(1)", "Complete(1)"]
    );
}

#[test]
fn a_session_ending_error_in_the_preamble_still_ends_the_session() {
    let mut p = holding(&[]);
    p.sent_statement_with(1, None, false, 1);
    assert_eq!(feed(&mut p, &[Error(ErrorClass::SessionEnd)]), ["SessionEnding"]);
}

#[test]
fn a_prepared_preamble_that_vanished_sends_the_request_again_once() {
    let mut p = holding(&[8]);
    // Prepare and execute of the preamble, then the request's query.
    assert_eq!(p.sent_statement_with(1, None, false, 2), Wire::Unnamed);
    assert_eq!(
        feed(&mut p, &[Final, End, Final, End, Final, End, Sync]),
        ["Result(1)", "Complete(1)"]
    );
    // Executed by name: gone (DISCARD ALL).
    assert_eq!(p.sent_statement_with(2, Some(6), false, 1), Wire::PrepareAndExecute);
    let out = feed(
        &mut p,
        &[Error(ErrorClass::Vanished), End, Aborted, End, Aborted, End, Sync],
    );
    assert_eq!(out, ["Resend(2)"]);
    assert!(p.take_preamble_vanished());
    assert!(!p.take_preamble_vanished());
    assert!(
        p.take_shared_session(),
        "no query of the connection dropped it: a shared session"
    );
    assert!(!p.holds_statement(6), "its prepare was skipped");
    assert!(
        !p.holds_statement(8),
        "DEALLOCATE ALL or DISCARD ALL dropped the others too"
    );
    // Sent again with the preamble prepared: vanishing again is its error.
    p.sent_statement_with(2, Some(6), false, 2);
    let out = feed(
        &mut p,
        &[
            Final,
            End,
            Error(ErrorClass::Vanished),
            End,
            Aborted,
            End,
            Aborted,
            End,
            Sync,
        ],
    );
    assert_eq!(out, ["PreambleError(2)", "Complete(2)"]);
}

#[test]
fn a_preamble_whose_prepare_finds_its_name_taken_marks_the_session_shared() {
    let mut p = holding(&[]);
    // The preamble prepared (and executed), then the request's query: the
    // prepare meets a statement of that name that this connection never
    // made (a pooler handed it another client's session).
    p.sent_statement_with(1, None, false, 2);
    let out = feed(
        &mut p,
        &[Error(ErrorClass::Duplicate), End, Aborted, End, Aborted, End, Sync],
    );
    assert_eq!(out, ["Resend(1)"]);
    assert!(p.take_shared_session(), "the session is not the connection's own");
    assert!(
        p.take_preamble_vanished(),
        "the connection forgets its prepared preambles"
    );
}

#[test]
fn a_preamble_dropped_by_the_connections_own_query_is_no_sign_of_sharing() {
    let mut p = holding(&[]);
    p.touch_session();
    p.sent_statement_with(1, None, false, 1);
    let out = feed(&mut p, &[Error(ErrorClass::Vanished), End, Aborted, End, Sync]);
    assert_eq!(out, ["Resend(1)"]);
    assert!(p.take_preamble_vanished());
    assert!(!p.take_shared_session());
}

#[test]
fn a_spare_connection_settles_once_up_or_serves_who_joined() {
    // Nobody waits: once up, it is idle.
    let mut p: Pipeline<u32> = Pipeline::spare();
    assert!(p.is_connecting() && p.shareable() && p.depth() == 0);
    assert_eq!(p.connected(), vec![Step::Settle]);
    assert!(p.is_idle());
    // A request joined while it connected: it goes out once up.
    let mut p: Pipeline<u32> = Pipeline::spare();
    assert_eq!(p.join(4, false), Join::Wait);
    assert_eq!(p.connected(), vec![Step::Send(vec![4])]);
    // One that joined and left: the connect goes on for nobody, and the
    // connection closes (as one opened for a request that left).
    let mut p: Pipeline<u32> = Pipeline::spare();
    assert_eq!(p.join(5, false), Join::Wait);
    assert_eq!(p.abandon(5), vec![Step::Close]);
    // Lost while connecting: nobody to tell.
    let mut p: Pipeline<u32> = Pipeline::spare();
    assert!(p.lost().is_empty());
}

#[test]
fn a_spare_taken_by_a_request_that_runs_alone() {
    let mut p: Pipeline<u32> = Pipeline::spare();
    assert!(p.shareable(), "a spare that no request has joined takes one");
    assert_eq!(p.join(1, true), Join::Wait);
    assert!(!p.shareable(), "nothing queues behind a request that runs alone");
    assert_eq!(p.connected(), vec![Step::Send(vec![1])]);
    p.sent(1, P, false);
    assert!(!p.shareable(), "nor once it is sent");
}
