//! A service with no methods still generates every item.

use rpc::{Service, rpc_service};

#[rpc_service(transport = "delegation")]
pub trait Nothing {}

struct Impl;
impl NothingServer for Impl {}

fn main() {
    let d = <NothingService as Service>::DESCRIPTOR;
    assert_eq!(d.name, "Nothing");
    assert!(d.methods.is_empty());
    assert_eq!(d.max_request_bytes, rpc::wire::HEADER_BYTES);
    let msg = [0u8; 8];
    assert_eq!(
        <NothingService as Service>::decode_request(&msg).err(),
        Some(rpc::wire::WireError::UnknownMethod(0))
    );
    let _: fn(&mut Impl, NothingRequest) -> NothingResponse = NothingService::dispatch::<Impl>;
    let _: Option<NothingClient> = None;
}
