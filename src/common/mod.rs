//! What both gateways use, and neither owns: request tokens, subscription
//! hubs, their reconnect supervision and their server-sent-event side, and which gateway an upstream
//! block belongs to. `sqldb` and `cache` import from here, never from each
//! other.

pub mod failure;
pub mod hub;
pub mod reconnect;
pub mod sse;
pub mod token;
pub mod upstream;
