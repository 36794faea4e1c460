//! What the stream hub does with a catch-up's page and with a key's own
//! errors: a page sizes the next one by its bytes; a key that Redis refuses
//! (it is not a stream any more: `WRONGTYPE`) ends its own streams, and the
//! other keys go on.

use gateway_core::streams::Entry;

use super::{StreamHub, PAGE, PAGE_BYTES, READ_COUNT};
use crate::common::token::ReqToken;
use crate::ffi::*;
use crate::log;

/// What a reply holds per entry besides its fields' bytes (the id, the
/// field names, the RESP framing), about.
const ENTRY_FRAMING: usize = 64;

/// The entries a key's next `XREAD` asks for: as many as `PAGE_BYTES`
/// holds at the size of these (its last ones), so that a key of large
/// entries is read in turns, not in one reply past the connection's bound.
/// None when there are none to size it by.
pub(super) fn read_count(entries: &[Entry]) -> Option<usize> {
    if entries.is_empty() {
        return None;
    }
    let bytes: usize = entries
        .iter()
        .map(|e| e.data.len() + e.event.as_ref().map_or(0, Vec::len) + ENTRY_FRAMING)
        .sum();
    let each = (bytes / entries.len()).max(1);
    Some((PAGE_BYTES / each).clamp(1, READ_COUNT))
}

impl StreamHub {
    /// A page of `count` entries asked for `who`'s catch-up came: `entries`,
    /// in a reply of `bytes` bytes.
    pub(super) fn page(&mut self, who: ReqToken, count: usize, entries: &[Entry], bytes: usize) {
        let Some(at) = self.catchups.iter().position(|c| c.who == who) else {
            return;
        };
        let c = &mut self.catchups[at];
        c.asked = false;
        // The next page: as many entries as PAGE_BYTES holds, at
        // the size of these.
        if !entries.is_empty() {
            let each = (bytes / entries.len()).max(1);
            c.count = (PAGE_BYTES / each).clamp(1, PAGE);
        }
        if let Some(e) = entries.last() {
            c.after = c.after.max(e.id);
            self.sink.replayed(who, entries);
        }
        if entries.len() < count {
            if self.sink.lapsed(who) {
                // Held live entries were let go: one more round.
                self.sink.begin_round(who);
            } else {
                self.catchups.remove(at);
                self.sink.release(who);
            }
        }
    }

    /// An `XREAD` of `names` was refused. Of several keys: each is read
    /// alone next round, where each key's own error is its own; of one: its
    /// streams end.
    pub(super) fn read_refused(&mut self, i: usize, names: &[String], msg: &[u8]) {
        if let [name] = names {
            self.drop_key(i, name, "XREAD of", msg);
        }
        for name in names {
            if let Some(k) = self.keys.get_mut(name) {
                k.alone = true;
            }
        }
    }

    /// A Redis error for a key's subscribers: logged (at `info` when the
    /// key is not a stream: `WRONGTYPE` is the key's, not the server's),
    /// their streams end (502 before the header; their clients come back
    /// with their last id).
    pub(super) fn key_error(&mut self, i: usize, what: &str, who: &[ReqToken], msg: &[u8]) {
        let level = if msg.starts_with(b"WRONGTYPE") {
            NGX_LOG_INFO
        } else {
            NGX_LOG_ERR
        };
        log!(
            level,
            Log::cycle(),
            "cache: redis {} of upstream \"{}\" refused {what}: {}",
            self.server(i),
            self.upstream,
            String::from_utf8_lossy(msg)
        );
        self.sink.fail(who, HTTP_BAD_GATEWAY);
    }

    /// A key's own error: its streams end (key_error) and it is read no
    /// more; the other keys go on.
    pub(super) fn drop_key(&mut self, i: usize, name: &str, what: &str, msg: &[u8]) {
        let Some(k) = self.keys.remove(name) else { return };
        self.catchups.retain(|c| c.key != name);
        self.key_error(i, &format!("{what} stream \"{name}\""), &k.subs, msg);
    }
}
