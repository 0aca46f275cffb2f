use rpc::rpc_service;

pub struct NotATransport;

// A path must name a type implementing `rpc::ClientTransport`.
#[rpc_service(transport = NotATransport)]
pub trait A {
    fn get(&self, key: u64) -> u64;
}

#[rpc_service(transport = no_such::Transport)]
pub trait B {
    fn get(&self, key: u64) -> u64;
}

fn main() {}
