use rpc::rpc_service;

/// Has no zerocopy derives.
#[derive(Clone, Copy)]
pub struct Plain {
    pub a: u32,
}

#[rpc_service(transport = "delegation")]
pub trait Store {
    fn put(&mut self, key: u64, value: Plain);
}

fn main() {}
