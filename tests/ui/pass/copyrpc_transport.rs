//! `transport = "copyrpc"` makes `rpc::copyrpc::Copyrpc` the client's default transport, and
//! `from_transport` wraps an already connected one.

use rpc::copyrpc::{Copyrpc, CopyrpcAddr};
use rpc::rpc_service;

#[rpc_service(transport = "copyrpc")]
pub trait Counter {
    fn add(&mut self, n: u64) -> u64;
}

fn main() {
    let _: Option<CounterClient<Copyrpc>> = None::<CounterClient>;
    let _: fn(&CopyrpcAddr) -> Result<CounterClient, rpc::RpcError> = CounterClient::connect;
    let _: fn(Copyrpc) -> CounterClient = CounterClient::from_transport;
}
