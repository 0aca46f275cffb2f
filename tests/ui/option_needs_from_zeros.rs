use rpc::rpc_service;
use zerocopy::{Immutable, IntoBytes, KnownLayout, TryFromBytes};

/// Every value is valid except all-zero: fine on its own, not inside an `Option`.
#[derive(Clone, Copy, TryFromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(u8)]
pub enum Color {
    Red = 1,
    Green = 2,
}

#[rpc_service(transport = "delegation")]
pub trait Paint {
    fn paint(&mut self, color: Color) -> Color;
    fn last(&self) -> Option<Color>;
}

fn main() {}
