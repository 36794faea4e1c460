//! Work on one of nginx's threads (its `default` thread pool): a step that
//! would hold the worker's event loop for milliseconds (the SCRAM proof of
//! a database password, computed while a connection is made). The step
//! runs on the thread; what follows it, back in the event loop. Without a
//! thread pool (nginx built without threads, or none to be had) the caller
//! runs the step itself.

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::*;

thread_local! {
    /// The worker's thread pool, once looked up (null: none).
    static POOL: Cell<Option<*mut ngx_thread_pool_t>> = const { Cell::new(None) };
}

/// At configuration: asks nginx for its `default` thread pool (made at
/// start with 32 threads unless a `thread_pool default` line says
/// otherwise). False when nginx has none to give.
pub fn want_pool(cf: Conf) -> bool {
    // SAFETY: a configuration being read; null names the default pool.
    !unsafe { ngx_thread_pool_add(cf.raw_ptr(), std::ptr::null_mut()) }.is_null()
}

fn pool() -> Option<*mut ngx_thread_pool_t> {
    POOL.with(|p| {
        if let Some(tp) = p.get() {
            return (!tp.is_null()).then_some(tp);
        }
        let mut name = ngx_str_t {
            len: 7,
            data: c"default".as_ptr() as *mut u8,
        };
        // SAFETY: the worker's cycle; the name is read during the call.
        let tp = unsafe { ngx_thread_pool_get(ngx_cycle as *mut ngx_cycle_t, &mut name) };
        p.set(Some(tp));
        (!tp.is_null()).then_some(tp)
    })
}

/// A posted step: nginx's task, and the work with what runs it.
#[repr(C)]
struct Task<W> {
    task: ngx_thread_task_t,
    work: W,
    run: fn(&mut W),
    done: fn(W),
    /// The step panicked on the thread (`done` still gets the work, as the
    /// step left it).
    panicked: bool,
}

/// Runs `run` on a thread of the pool, then `done` in the event loop (with
/// the work back). Err(work): no thread to be had; run it in place. The
/// work crosses to the thread and back (`Send`); `run`, a plain function,
/// reaches nothing else of the worker's (its thread-locals are the
/// thread's own, its statics `Sync`).
pub fn post<W: Send + 'static>(work: W, run: fn(&mut W), done: fn(W)) -> Result<(), W> {
    let Some(tp) = pool() else { return Err(work) };
    let task = Box::new(Task {
        // SAFETY: all-zero is the initial state of a task and its event.
        task: unsafe { std::mem::zeroed() },
        work,
        run,
        done,
        panicked: false,
    });
    let task = Box::into_raw(task);
    // SAFETY: a fresh task of ours; nginx owns it until its event's
    // handler runs (which takes it back).
    unsafe {
        (*task).task.ctx = task.cast();
        (*task).task.handler = Some(run_on_thread::<W>);
        (*task).task.event.data = task.cast();
        (*task).task.event.handler = Some(completed::<W>);
        (*task).task.event.log = Log::cycle().as_ptr();
        if ngx_thread_task_post(tp, &mut (*task).task) != OK {
            // (Its queue is full: nginx said so in the log.)
            let task = Box::from_raw(task);
            return Err(task.work);
        }
    }
    Ok(())
}

/// On the thread: the step (a panic stays on the thread).
extern "C" fn run_on_thread<W>(data: *mut c_void, _log: *mut ngx_log_t) {
    // SAFETY: the task's ctx is its Task, which nothing else uses until
    // its completion runs in the event loop.
    let task = unsafe { &mut *(data as *mut Task<W>) };
    let run = task.run;
    task.panicked = catch_unwind(AssertUnwindSafe(|| run(&mut task.work))).is_err();
}

/// Back in the event loop: the work goes to `done`.
extern "C" fn completed<W>(ev: *mut ngx_event_t) {
    // SAFETY: the event is a Task's (post), which nginx hands back once,
    // after the thread is done with it.
    let task = unsafe { Box::from_raw((*ev).data as *mut Task<W>) };
    let Task {
        work, done, panicked, ..
    } = *task;
    if panicked {
        crate::log!(
            NGX_LOG_ALERT,
            Log::cycle(),
            "gateway: internal error (panic) in a step on a thread"
        );
    }
    guard(Log::cycle(), "thread step completed", (), || done(work));
}
