use rpc::rpc_service;

#[rpc_service(transport = "delegation", derive(Debug, PartialEq))]
pub trait Store {
    fn put(&mut self, key: &str, value: &[u8]) -> bool;
    fn get(&self, key: &str) -> Option<Vec<u8>>;
    fn words(&self, n: u32, w: &[u64], tag: Option<u8>) -> Vec<u64>;
    fn name(&self) -> &str;
    fn fixed(&mut self, x: u64) -> u64;
}

struct S(std::collections::HashMap<String, Vec<u8>>);
impl StoreServer for S {
    fn put(&mut self, key: &str, value: &[u8]) -> bool {
        self.0.insert(key.to_string(), value.to_vec()).is_none()
    }
    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.0.get(key).cloned()
    }
    fn words(&self, n: u32, w: &[u64], tag: Option<u8>) -> Vec<u64> {
        w.iter()
            .map(|x| x * n as u64 + tag.unwrap_or(0) as u64)
            .collect()
    }
    fn name(&self) -> &str {
        "store"
    }
    fn fixed(&mut self, x: u64) -> u64 {
        x + 1
    }
}

#[test]
fn smoke() {
    let name = format!("varlen-smoke-{}", std::process::id());
    let server =
        rpc::delegation::DelegationServer::serve::<StoreService>(&name, Default::default())
            .unwrap();
    let mut st = S(Default::default());
    let h = server.spawn_raw(move |msg, out| StoreService::dispatch_raw(&mut st, msg, out));
    let mut c = StoreClient::<rpc::delegation::Delegation>::connect(&name).unwrap();
    assert!(c.put("a", b"hello").unwrap());
    assert_eq!(c.get("a").unwrap(), Some(b"hello".to_vec()));
    assert_eq!(c.get("b").unwrap(), None);
    assert_eq!(c.get_with("a", |v| v.map(|v| v.len())).unwrap(), Some(5));
    assert_eq!(c.words(2, &[1, 2, 3], Some(1)).unwrap(), vec![3, 5, 7]);
    assert_eq!(c.name().unwrap(), "store");
    assert_eq!(c.fixed(1).unwrap(), 2);
    c.issue(7).put("b", &[1; 100]).unwrap();
    let done = loop {
        if let Some(d) = c.poll().unwrap() {
            break d;
        }
    };
    assert_eq!(done, (7, StoreResponse::Put(true)));
    let big = vec![0u8; 5000];
    assert!(matches!(
        c.put("x", &big),
        Err(rpc::RpcError::MessageTooLarge { .. })
    ));
    h.join().unwrap();
}
