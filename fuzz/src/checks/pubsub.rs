//! What a subscribing connection receives, on arbitrary bytes:
//! `pubsub::next` read the way the module reads it (whole replies taken
//! from the front of what has arrived, the rest kept for the next read).
//!
//! What must hold: no panic; how the bytes are cut into reads never
//! changes what is read (the same pushes, then the same error or the same
//! bytes left over); a reply is taken only once all of it is in.

use gateway_core::pubsub::{next, Push, PushError};

/// The pushes read from `input` arriving in reads that end at `cuts`,
/// and how the stream ended (an error, or the bytes left).
fn read(input: &[u8], cuts: &[usize]) -> (Vec<Push>, Result<Vec<u8>, PushError>) {
    let mut got = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut from = 0;
    for &end in cuts.iter().chain(std::iter::once(&input.len())) {
        let end = end.clamp(from, input.len());
        buf.extend_from_slice(&input[from..end]);
        from = end;
        loop {
            match next(&buf) {
                Ok(None) => break,
                Ok(Some((p, used))) => {
                    assert!(used > 0 && used <= buf.len());
                    got.push(p);
                    buf.drain(..used);
                }
                Err(e) => return (got, Err(e)),
            }
        }
    }
    (got, Ok(buf))
}

pub fn pubsub_stream(data: &[u8]) {
    let (Some(&seed), Some(input)) = (data.first(), data.get(1..)) else {
        return;
    };
    let whole = read(input, &[]);
    let step = usize::from(seed % 16) + 1;
    let cuts: Vec<usize> = (step..input.len()).step_by(step).collect();
    assert_eq!(read(input, &cuts), whole, "reads of {step} bytes changed the outcome");
    let drip: Vec<usize> = (1..input.len()).collect();
    assert_eq!(read(input, &drip), whole, "one byte at a time changed the outcome");
}
