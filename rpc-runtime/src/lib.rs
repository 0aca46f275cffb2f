//! Runtime for `#[rpc_service]`: the wire format, the service/client/server traits that generated
//! code targets, and the transports.

pub mod delegation;
