//! `transport = "scalerpc"` makes `rpc::scalerpc::ScaleRpc` the client's default transport,
//! and `from_transport` wraps an already connected one.

use rpc::rpc_service;
use rpc::scalerpc::{ScaleRpc, ScaleRpcAddr, ScaleRpcServer};

#[rpc_service(transport = "scalerpc")]
pub trait Counter {
    fn add(&mut self, n: u64) -> u64;
}

fn main() {
    let _: Option<CounterClient<ScaleRpc>> = None::<CounterClient>;
    let _: fn(&ScaleRpcAddr) -> Result<CounterClient, rpc::RpcError> = CounterClient::connect;
    let _: fn(ScaleRpc) -> CounterClient = CounterClient::from_transport;
    let _ = ScaleRpcServer::serve::<CounterService>;
}
