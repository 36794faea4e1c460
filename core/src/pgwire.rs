//! The few bytes of PostgreSQL's wire protocol the gateway writes itself
//! (libpq writes the rest).

/// The CancelRequest code: 1234 in the high 16 bits, 5678 in the low.
pub const CANCEL_REQUEST_CODE: u32 = 1234 << 16 | 5678;

/// The 16 bytes of a CancelRequest for backend `pid` with its secret `key`,
/// sent alone on a new connection to the server.
pub fn cancel_request(pid: i32, key: i32) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[0..4].copy_from_slice(&16u32.to_be_bytes());
    p[4..8].copy_from_slice(&CANCEL_REQUEST_CODE.to_be_bytes());
    p[8..12].copy_from_slice(&pid.to_be_bytes());
    p[12..16].copy_from_slice(&key.to_be_bytes());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_request() {
        assert_eq!(CANCEL_REQUEST_CODE, 80_877_102);
        assert_eq!(
            cancel_request(0x01020304, -2),
            [0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 1, 2, 3, 4, 0xff, 0xff, 0xff, 0xfe]
        );
    }
}
