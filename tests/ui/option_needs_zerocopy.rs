use rpc::rpc_service;
use zerocopy::{Immutable, IntoBytes, KnownLayout};

/// Sendable except that received bytes cannot be validated: no `TryFromBytes`. Inside an
/// `Option` it still must be a complete zerocopy type (only `FromZeros` is no longer needed).
#[derive(Clone, Copy, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Unchecked {
    pub a: u32,
}

#[rpc_service(transport = "delegation")]
pub trait Store {
    fn last(&self) -> Option<Unchecked>;
}

fn main() {}
