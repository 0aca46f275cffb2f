use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Names {
    fn set(&mut self, name: String);
}

fn main() {}
