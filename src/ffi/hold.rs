//! Lending a request: `Req::hold` keeps it (one more reference to its
//! main request) while code that may end it runs, and nginx's posted
//! subrequests (`Posted`) run once no request is held, so that nothing
//! ends a held request under its borrow.

use std::cell::{Cell, RefCell};

use super::*;

/// The holds of this thread, one thread-local (each access of one costs
/// a call in a module nginx loads at run time).
struct Holds {
    /// Requests held now (nested holds).
    depth: Cell<usize>,
    /// Client connections whose posted subrequests wait for the holds to
    /// end (its room is kept from one hold to the next).
    later: RefCell<Vec<*mut ngx_connection_t>>,
}

thread_local! {
    static HOLDS: Holds = const {
        Holds {
            depth: Cell::new(0),
            later: RefCell::new(Vec::new()),
        }
    };
}

impl Req {
    /// Lends the request to `f`, held: one more reference to its main
    /// request while `f` runs, so that a `finalize` inside cannot free it
    /// under the borrow. When the hold ends nginx does what the last
    /// reference's going does (ngx_http_finalize_request with NGX_DONE:
    /// keepalive, lingering close or the close), or only counts it down
    /// when others remain.
    ///
    /// # Safety
    /// `r` is a live request, and no other reference to it is used while
    /// `f` runs; the caller does not use `r` after the call (it may be
    /// freed by then).
    pub unsafe fn hold<T>(r: *mut ngx_http_request_t, f: impl FnOnce(&mut Req) -> T) -> T {
        /// Lets the reference go however `f` ends (a panic included).
        struct Held(*mut ngx_http_request_t);
        impl Drop for Held {
            fn drop(&mut self) {
                HOLDS.with(|h| self.end(h));
            }
        }
        impl Held {
            fn end(&self, holds: &Holds) {
                let depth = holds.depth.get() - 1;
                holds.depth.set(depth);
                // SAFETY: the request is live while held; its main request
                // too. The last reference goes the way nginx's own code
                // lets one go.
                unsafe {
                    let main = &mut *(*self.0).main;
                    if main.count() > 1 {
                        main.set_count(main.count() - 1);
                    } else {
                        ngx_http_finalize_request(self.0, DONE);
                    }
                }
                if depth == 0 && !std::thread::panicking() {
                    // (Out of the cell while they run: one may hold a
                    // request, and post more.)
                    let mut later = holds.later.take();
                    for c in later.drain(..) {
                        Posted(c).run_with(holds);
                    }
                    let mut kept = holds.later.borrow_mut();
                    if kept.is_empty() {
                        *kept = later;
                    }
                }
            }
        }
        // SAFETY: as the caller promises.
        let req = unsafe { Req::from_raw(r) };
        // SAFETY: a live request's main request is live.
        if unsafe { (*(*r).main).count() } == 0 {
            // (Its last reference is gone: nginx is freeing it, and runs
            // its cleanups now. Nothing to hold.)
            return f(req);
        }
        req.count_up();
        HOLDS.with(|h| h.depth.set(h.depth.get() + 1));
        let _held = Held(r);
        f(req)
    }
}

/// A client connection whose posted subrequests run after a handler
/// (`Req::posted`). The request may be gone by then; the connection is not:
/// nginx's connections live in the worker's array, and a request freed or a
/// connection closed marks it `destroyed`, which nginx checks first.
pub struct Posted(*mut ngx_connection_t);

impl Posted {
    pub(super) fn of(c: *mut ngx_connection_t) -> Posted {
        Posted(c)
    }

    /// Runs them now, or, while a request is held, once no request is (a
    /// posted request may end a request: the terminating one frees it).
    pub fn run(self) {
        HOLDS.with(|h| self.run_with(h));
    }

    fn run_with(self, holds: &Holds) {
        if holds.depth.get() > 0 {
            let mut l = holds.later.borrow_mut();
            if !l.contains(&self.0) {
                l.push(self.0);
            }
            return;
        }
        // SAFETY: a connection of the worker's array (see above);
        // ngx_http_run_posted_requests returns at once when it is destroyed.
        unsafe { ngx_http_run_posted_requests(self.0) }
    }
}
