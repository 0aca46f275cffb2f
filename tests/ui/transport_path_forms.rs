use rpc::rpc_service;

// A built-in transport is named by a string.
#[rpc_service(transport = copyrpc)]
pub trait C {
    fn get(&self, key: u64) -> u64;
}

// Generic arguments go through a type alias.
#[rpc_service(transport = Vec::<u8>)]
pub trait D {
    fn get(&self, key: u64) -> u64;
}

// Neither a string nor a path.
#[rpc_service(transport = 7)]
pub trait E {
    fn get(&self, key: u64) -> u64;
}

fn main() {}
