//! One check per fuzz target. Each takes the raw fuzz input.

mod cluster;
mod conninfo;
mod formats;
mod jwt;
mod methods;
mod pubsub;
mod rds;
mod redis;
mod resp;
mod sql;
mod table;
mod template;

pub use cluster::cluster_slots;
pub use conninfo::conninfo;
pub use formats::formats;
pub use jwt::jwt_token;
pub use methods::methods;
pub use pubsub::pubsub_stream;
pub use rds::rds_decode;
pub use redis::redis_exchange;
pub use resp::resp_reply;
pub use sql::sql_statements;
pub use template::template_split;

/// A check: panics when its input shows a bug.
pub type Check = fn(&[u8]);

/// The targets by name, as in fuzz/Cargo.toml and fuzz/corpus/.
pub const TARGETS: &[(&str, Check)] = &[
    ("resp_reply", resp_reply),
    ("template_split", template_split),
    ("sql_statements", sql_statements),
    ("conninfo", conninfo),
    ("rds_decode", rds_decode),
    ("formats", formats),
    ("methods", methods),
    ("redis_exchange", redis_exchange),
    ("cluster_slots", cluster_slots),
    ("pubsub_stream", pubsub_stream),
    ("jwt_token", jwt_token),
];
