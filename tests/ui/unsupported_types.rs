use rpc::rpc_service;

#[rpc_service(transport = "delegation")]
pub trait Bad {
    fn reference(&self, key: &u64);
    fn slice(&self, keys: [u64]) -> &'static [u8];
    fn impl_trait(&self, f: impl Copy) -> impl Copy;
    fn dyn_trait(&self, d: Box<u8>) -> dyn Send;
    fn tuple(&self, pair: (u32, u32), nested: Option<(u8, u8)>);
    fn pointer(&self, p: *const u8);
    fn fn_pointer(&self, f: fn(u8) -> u8);
}

fn main() {}
