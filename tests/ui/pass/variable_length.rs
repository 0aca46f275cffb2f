use rpc::rpc_service;

#[derive(
    zerocopy::TryFromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable,
    Clone, Copy, Debug, PartialEq,
)]
#[repr(C)]
pub struct Extent {
    pub off: u64,
    pub len: u32,
    pub flags: u32,
}

#[rpc_service(transport = "delegation", derive(Debug, PartialEq), max_var_bytes = 65536)]
pub trait Objects {
    fn put(&mut self, key: &str, value: &[u8], ttl: Option<u32>) -> bool;
    fn get(&self, key: &str) -> Option<Vec<u8>>;
    fn peek(&self, key: &str) -> Option<&[u8]>;
    fn name(&self) -> &str;
    fn label(&self, id: u64) -> String;
    fn extents(&self, key: Option<&str>, want: &[Extent]) -> Vec<Extent>;
    fn count(&self) -> u64;
}

fn main() {
    // Requests and responses own their data and are not `Copy`.
    let req = ObjectsRequest::put("k", b"v", Some(3));
    let _clone = req.clone();
    assert!(<ObjectsService as rpc::Service>::DESCRIPTOR.variable);
}
