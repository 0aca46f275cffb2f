//! `transport = "erpc"` makes `rpc::erpc::Erpc` (over UDP) the client's default transport,
//! connected by server address, and `from_transport` wraps an already connected one.

use rpc::erpc::{Erpc, ErpcServer};
use rpc::rpc_service;

#[rpc_service(transport = "erpc")]
pub trait Counter {
    fn add(&mut self, n: u64) -> u64;
}

fn main() {
    let _: Option<CounterClient<Erpc>> = None::<CounterClient>;
    let _: fn(&std::net::SocketAddr) -> Result<CounterClient, rpc::RpcError> =
        CounterClient::connect;
    let _: fn(Erpc) -> CounterClient = CounterClient::from_transport;
    let _ = ErpcServer::serve::<CounterService>;
}
