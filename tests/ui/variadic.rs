use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Log {
    fn log(&self, level: u8, _: ...);
}

fn main() {}
