use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn a(self);
    fn b(mut self, key: u64);
    fn c(self: Box<Self>);
    fn d(self: &Self);
}

fn main() {}
