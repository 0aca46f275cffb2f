use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Kv {
    const fn a(&self);
    unsafe fn b(&self, ptr: usize);
    extern "C" fn c(&self);
}

fn main() {}
