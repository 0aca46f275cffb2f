//! Service definitions shared by the examples, tests and benchmarks.
//!
//! - [`kv`]: the key-value service of the seeds/004 benchmark (§8 `Request`/`Response`).
//! - [`echo`]: ping-pong with fixed-size payloads (32 B and 256 B).

pub mod echo;
pub mod kv;
