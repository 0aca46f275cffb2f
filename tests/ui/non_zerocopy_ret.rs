use rpc::rpc_service;

/// Not a zerocopy type.
#[derive(Clone, Copy)]
pub struct Plain {
    pub v: u64,
}

// The element type of a variable-length result must be a zerocopy type like any other.
#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn get(&self, key: u64) -> Vec<Plain>;
}

fn main() {}
