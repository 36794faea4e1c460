//! Buffers and chains of them, the way nginx's output and upstream code
//! take data: memory that lives as long as the request (its pool).

use std::ptr::{self, NonNull};

use super::*;

/// A chain of buffers being built, first to last.
#[derive(Debug)]
pub struct Chain<'p> {
    head: *mut ngx_chain_t,
    tail: *mut ngx_chain_t,
    pool: &'p Pool,
}

impl<'p> Chain<'p> {
    pub fn new(pool: &'p Pool) -> Chain<'p> {
        Chain {
            head: ptr::null_mut(),
            tail: ptr::null_mut(),
            pool,
        }
    }

    /// Appends a buffer (one of nginx's, or one made by `memory`).
    pub fn push(&mut self, buf: NonNull<ngx_buf_t>) -> Option<()> {
        let cl = self.pool.chain_link()?.as_ptr();
        // SAFETY: cl is a fresh link of the pool; the tail, when there is
        // one, is a link this chain made in the same pool.
        unsafe {
            (*cl).buf = buf.as_ptr();
            (*cl).next = ptr::null_mut();
            match self.tail.as_mut() {
                Some(t) => t.next = cl,
                None => self.head = cl,
            }
        }
        self.tail = cl;
        Some(())
    }

    /// Appends bytes, moved into the pool (they live as long as the request).
    pub fn push_bytes(&mut self, data: Vec<u8>) -> Option<()> {
        let buf = memory(self.pool, data)?;
        self.push(buf)
    }

    /// The last buffer closes the response (`last_buf` for the main request,
    /// `last_in_chain` always).
    pub fn mark_last(&mut self, main: bool) {
        // SAFETY: the tail is a link this chain made; its buffer is live.
        if let Some(t) = unsafe { self.tail.as_mut() } {
            // SAFETY: as above.
            let b = unsafe { &mut *t.buf };
            b.set_last_buf(main as u32);
            b.set_last_in_chain(1);
        }
    }

    /// The last buffer is to be sent at once: a TLS connection, which
    /// gathers what is written into records, sends nothing before it.
    pub fn mark_flush(&mut self) {
        // SAFETY: the tail is a link this chain made; its buffer is live.
        if let Some(t) = unsafe { self.tail.as_mut() } {
            // SAFETY: as above.
            unsafe { &mut *t.buf }.set_flush(1);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.head.is_null()
    }

    /// The chain for nginx (null when empty).
    pub fn into_raw(self) -> *mut ngx_chain_t {
        self.head
    }
}

/// Bodies up to this size are copied into the pool rather than moved into
/// it: a copy this short costs less than the pool's cleanup of a Vec.
const COPY_MAX: usize = 2048;

/// A memory buffer over a copy of `data` in the pool.
pub fn copied(pool: &Pool, data: &[u8]) -> Option<NonNull<ngx_buf_t>> {
    pooled(pool, pool.str(data)?)
}

/// A memory buffer over bytes already in the pool (`Pool::str`'s).
pub fn pooled(pool: &Pool, s: ngx_str_t) -> Option<NonNull<ngx_buf_t>> {
    let b = pool.calloc::<ngx_buf_t>()?;
    // SAFETY: b is a fresh zeroed buffer of the pool; s.data..s.data+len
    // are bytes of the same pool.
    unsafe {
        let bm = &mut *b.as_ptr();
        bm.start = s.data;
        bm.pos = s.data;
        bm.last = s.data.add(s.len);
        bm.end = bm.last;
        bm.set_memory(1);
    }
    Some(b)
}

/// A memory buffer over `data`, which the pool then owns (a short one is
/// copied, see `COPY_MAX`).
pub fn memory(pool: &Pool, data: Vec<u8>) -> Option<NonNull<ngx_buf_t>> {
    if data.len() <= COPY_MAX {
        return copied(pool, &data);
    }
    let len = data.len();
    let owned = pool.alloc(data)?;
    // SAFETY: owned is the Vec just moved into the pool; its heap bytes stay
    // where they are until the pool drops it.
    let start = unsafe { (*owned.as_ptr()).as_ptr() } as *mut u8;
    let b = pool.calloc::<ngx_buf_t>()?;
    // SAFETY: b is a fresh zeroed buffer of the pool; start..start+len are
    // the Vec's bytes.
    unsafe {
        let bm = &mut *b.as_ptr();
        bm.start = start;
        bm.pos = start;
        bm.last = start.add(len);
        bm.end = bm.last;
        bm.set_memory(1);
    }
    Some(b)
}

/// One link over bytes already in the pool, marked last when asked.
pub fn pooled_chain(pool: &Pool, data: ngx_str_t, last: Option<bool>) -> Option<*mut ngx_chain_t> {
    let mut chain = Chain::new(pool);
    chain.push(pooled(pool, data)?)?;
    if let Some(main) = last {
        chain.mark_last(main);
    }
    Some(chain.into_raw())
}

/// One link with `data` as its buffer, marked last when asked.
pub fn memory_chain(pool: &Pool, data: Vec<u8>, last: Option<bool>) -> Option<*mut ngx_chain_t> {
    let mut chain = Chain::new(pool);
    chain.push_bytes(data)?;
    if let Some(main) = last {
        chain.mark_last(main);
    }
    Some(chain.into_raw())
}

/// A link that `Reuse::fill` gave: for the output filter (`as_ptr`), then
/// back to its `Reuse` (`update`).
#[derive(Debug)]
pub struct ReuseLink(NonNull<ngx_chain_t>);

impl ReuseLink {
    pub fn as_ptr(&self) -> *mut ngx_chain_t {
        self.0.as_ptr()
    }
}

/// Buffers reused for a streamed response: nginx's free/busy chains
/// (`ngx_chain_get_free_buf`, `ngx_chain_update_chains`).
#[derive(Debug)]
pub struct Reuse {
    free: *mut ngx_chain_t,
    busy: *mut ngx_chain_t,
    tag: ngx_buf_tag_t,
}

impl Reuse {
    /// `tag`: the module whose buffers they are.
    pub fn new(tag: &'static ngx_module_t) -> Reuse {
        Reuse {
            free: ptr::null_mut(),
            busy: ptr::null_mut(),
            tag: ptr::from_ref(tag) as ngx_buf_tag_t,
        }
    }

    /// A buffer holding a copy of `data` (a free one reused when it is
    /// large enough), in a link of its own; marked last when asked.
    pub fn fill(&mut self, pool: &Pool, data: &[u8], last: Option<bool>, min_size: usize) -> Option<ReuseLink> {
        // SAFETY: the free chain is made of this response's links, of the
        // request's pool.
        let cl = unsafe { ngx_chain_get_free_buf(pool.as_ptr(), &mut self.free) };
        // SAFETY: nginx returns a live link with a buffer, or null.
        let link = unsafe { cl.as_mut() }?;
        // SAFETY: as above.
        let b = unsafe { &mut *link.buf };
        let have = if b.start.is_null() {
            0
        } else {
            b.end as usize - b.start as usize
        };
        if have < data.len().max(1) {
            if !b.start.is_null() {
                // A large allocation of the pool is given back (a small one
                // stays with the pool): a buffer that grows does not pile up.
                // SAFETY: the buffer's memory came from this pool (below).
                unsafe { ngx_pfree(pool.as_ptr(), b.start.cast()) };
            }
            let size = data.len().max(min_size);
            // SAFETY: the pool is live; memory for size bytes or null.
            let mem = unsafe { ngx_palloc(pool.as_ptr(), size) } as *mut u8;
            if mem.is_null() {
                return None;
            }
            b.start = mem;
            // SAFETY: within the allocation.
            b.end = unsafe { mem.add(size) };
        }
        // SAFETY: the buffer has room for data (above); the regions are distinct.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), b.start, data.len()) };
        b.pos = b.start;
        b.last = b.start.wrapping_add(data.len());
        // An empty buffer is a special one (flush, last): marked as memory it
        // would be a "zero size buf" to nginx's writer, which fails the
        // request. A reused buffer may carry the flag of its last use.
        b.set_temporary(u32::from(!data.is_empty()));
        b.set_memory(0);
        b.set_flush(1);
        b.tag = self.tag;
        if let Some(main) = last {
            b.set_last_buf(main as u32);
            b.set_last_in_chain(1);
        }
        link.next = ptr::null_mut();
        NonNull::new(cl).map(ReuseLink)
    }

    /// After the output filter: sent buffers (`out`: what `fill` gave,
    /// passed to the output filter; None: only what was pending) become
    /// free, the rest busy.
    pub fn update(&mut self, pool: &Pool, out: Option<ReuseLink>) {
        let mut out = out.map_or(ptr::null_mut(), |l| l.0.as_ptr());
        // SAFETY: the chains are this response's, of the request's pool:
        // free and busy are made of links `fill` gave, and so is out.
        unsafe { ngx_chain_update_chains(pool.as_ptr(), &mut self.free, &mut self.busy, &mut out, self.tag) };
    }

    /// Bytes the client has yet to take.
    pub fn busy_bytes(&self) -> usize {
        let mut n = 0;
        let mut cl = self.busy;
        // SAFETY: the busy chain is made of this response's links and buffers.
        while let Some(link) = unsafe { cl.as_ref() } {
            // SAFETY: as above.
            if let Some(b) = unsafe { link.buf.as_ref() } {
                n += (b.last as usize).saturating_sub(b.pos as usize);
            }
            cl = link.next;
        }
        n
    }

    /// Buffers the client has yet to take.
    pub fn busy(&self) -> usize {
        let mut n = 0;
        let mut cl = self.busy;
        // SAFETY: the busy chain is made of this response's links.
        while let Some(link) = unsafe { cl.as_ref() } {
            n += 1;
            cl = link.next;
        }
        n
    }
}

/// What waits for the client of a response that lasts (server-sent
/// events): bytes are appended to a queue as they come, and handed to the
/// output filters in one buffer once what was handed before has gone out.
/// While the client's connection is blocked, more bytes cost only their
/// copy into the queue, however much waits: nothing walks what waits.
#[derive(Debug)]
pub struct Outbox {
    /// Bytes not handed to nginx yet.
    queue: Vec<u8>,
    /// The bytes `buf` is over, handed to nginx (never changed until it
    /// has sent them all).
    flight: Vec<u8>,
    /// The buffer handed to the output filters (in the request's pool;
    /// null until first used).
    buf: *mut ngx_buf_t,
    tag: ngx_buf_tag_t,
}

/// The pool had no memory for a buffer or a link.
#[derive(Debug)]
pub struct NoMemory;

/// A queue that grew larger than this is given back once it is sent.
const OUTBOX_KEEP: usize = 64 * 1024;

impl Outbox {
    /// `tag`: the module whose buffers they are.
    pub fn new(tag: &'static ngx_module_t) -> Outbox {
        Outbox {
            queue: Vec::new(),
            flight: Vec::new(),
            buf: ptr::null_mut(),
            tag: ptr::from_ref(tag) as ngx_buf_tag_t,
        }
    }

    /// Appends bytes to what waits.
    pub fn push(&mut self, data: &[u8]) {
        self.queue.extend_from_slice(data);
    }

    /// Bytes handed to nginx that it has yet to send.
    fn in_flight(&self) -> usize {
        // SAFETY: the buffer, when there is one, is this outbox's own, in
        // the request's pool; nginx moves its pos as it sends.
        match unsafe { self.buf.as_ref() } {
            Some(b) => (b.last as usize).saturating_sub(b.pos as usize),
            None => 0,
        }
    }

    /// Bytes the client has yet to take (queued and handed to nginx).
    pub fn waiting(&self) -> usize {
        self.queue.len() + self.in_flight()
    }

    /// A chain of what is queued, for the output filters, once what was
    /// handed before is all sent (None: nothing to hand now; Err: no
    /// memory).
    pub fn next(&mut self, pool: &Pool) -> Result<Option<*mut ngx_chain_t>, NoMemory> {
        if self.queue.is_empty() || self.in_flight() > 0 {
            return Ok(None);
        }
        if self.buf.is_null() {
            self.buf = pool.calloc::<ngx_buf_t>().ok_or(NoMemory)?.as_ptr();
        }
        let cl = pool.chain_link().ok_or(NoMemory)?.as_ptr();
        // The bytes sent before are not needed any more: their vector
        // takes what comes next (given back when it grew large).
        std::mem::swap(&mut self.queue, &mut self.flight);
        self.queue.clear();
        if self.queue.capacity() > OUTBOX_KEEP {
            self.queue = Vec::new();
        }
        let start = self.flight.as_ptr() as *mut u8;
        // SAFETY: buf is this outbox's buffer, in the request's pool, and
        // nginx has sent all of what it was over (in_flight is 0): nothing
        // reads its bytes any more. flight is not changed until nginx has
        // sent it all; cl is a fresh link of the pool.
        unsafe {
            let b = &mut *self.buf;
            *b = std::mem::zeroed();
            b.start = start;
            b.pos = start;
            b.last = start.add(self.flight.len());
            b.end = b.last;
            b.set_memory(1);
            b.set_flush(1);
            b.tag = self.tag;
            (*cl).buf = self.buf;
            (*cl).next = ptr::null_mut();
        }
        Ok(Some(cl))
    }

    /// What is queued, in a buffer of its own that the pool then owns
    /// (for the end of the response, whatever is in flight); None when
    /// nothing is queued or no memory.
    pub fn rest(&mut self, pool: &Pool) -> Option<*mut ngx_chain_t> {
        if self.queue.is_empty() {
            return None;
        }
        memory_chain(pool, std::mem::take(&mut self.queue), None)
    }
}
