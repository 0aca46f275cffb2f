//! `transport = "ipc"` makes `rpc::ipc::Ipc` the client's default transport (connected by a
//! name in `/dev/shm`), and `from_transport` wraps an already attached one.

use rpc::ipc::Ipc;
use rpc::rpc_service;

#[rpc_service(transport = "ipc")]
pub trait Counter {
    fn add(&mut self, n: u64) -> u64;
}

fn main() {
    let _: Option<CounterClient<Ipc>> = None::<CounterClient>;
    let _: fn(&str) -> Result<CounterClient, rpc::RpcError> = CounterClient::connect;
    let _: fn(Ipc) -> CounterClient = CounterClient::from_transport;
}
