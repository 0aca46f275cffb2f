use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    fn a(&self, (x, y): (u32, u32));
    fn b(&self, _: u32);
    fn c(&self, mut key: u64);
    fn d(&self, #[allow(unused)] key: u64);
}

fn main() {}
