//! FastMap against a BTreeMap model over the whole 32-bit key space (24-bit QPNs valid).

use std::collections::BTreeMap;

use mlx5::fastmap::{FastMap, QPN_LIMIT};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Insert(u32, u64),
    Remove(u32),
    Get(u32),
}

fn qpn() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..QPN_LIMIT,
        2 => (0u32..8, 0u32..4096).prop_map(|(hi, lo)| (hi << 12) | lo), // dense pages
        1 => QPN_LIMIT..=u32::MAX,
    ]
}

proptest! {
    #[test]
    fn matches_a_btreemap(ops in prop::collection::vec(
        prop_oneof![
            (qpn(), any::<u64>()).prop_map(|(q, v)| Op::Insert(q, v)),
            qpn().prop_map(Op::Remove),
            qpn().prop_map(Op::Get),
        ],
        1..200,
    )) {
        let mut m = FastMap::new();
        let mut model = BTreeMap::new();
        for op in ops {
            match op {
                Op::Insert(q, v) => {
                    let r = m.insert(q, v);
                    if q >= QPN_LIMIT {
                        prop_assert!(r.is_err());
                    } else {
                        prop_assert_eq!(r.unwrap(), model.insert(q, v));
                    }
                }
                Op::Remove(q) => prop_assert_eq!(m.remove(q), model.remove(&q)),
                Op::Get(q) => {
                    prop_assert_eq!(m.get(q), model.get(&q));
                    if let Some(v) = m.get_mut(q) {
                        *v = v.wrapping_add(1);
                        let w = model.get_mut(&q).unwrap();
                        *w = w.wrapping_add(1);
                    }
                }
            }
            prop_assert_eq!(m.len(), model.len());
        }
        let all: Vec<(u32, u64)> = m.iter().map(|(q, v)| (q, *v)).collect();
        let want: Vec<(u32, u64)> = model.into_iter().collect();
        prop_assert_eq!(all, want);
    }
}
