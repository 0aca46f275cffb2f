//! Checks the MPI bootstrap (cargo feature `mpi`) across the ranks of an `mpirun` job: the
//! all-gather, barrier and reductions give every rank the expected values, and the node
//! placement is consistent. Rank 0 prints one line per check; any failure panics, which makes
//! `mpirun` fail.
//!
//! ```text
//! cargo build --release --features mpi --example bootstrap_mpi
//! mpirun --allow-run-as-root --oversubscribe -np 4 target/release/examples/bootstrap_mpi
//! ```

use rpc::bootstrap::mpi::MpiBootstrap;
use rpc::bootstrap::{Bootstrap, BootstrapError};

fn main() {
    let b = MpiBootstrap::init().expect("MPI init");
    let (rank, size) = (b.rank(), b.size());

    // Fixed-size endpoint records, 40 bytes per rank, over many rounds.
    for round in 0..100u8 {
        let mine: Vec<u8> = (0..40).map(|i| (rank as u8) ^ i ^ round).collect();
        let all = b.all_gather(&mine).expect("all_gather");
        assert_eq!(all.len(), 40 * size);
        for (r, part) in all.chunks_exact(40).enumerate() {
            assert!(
                part.iter()
                    .enumerate()
                    .all(|(i, &x)| x == (r as u8) ^ i as u8 ^ round)
            );
        }
        b.barrier().expect("barrier");
    }
    let mut v = [rank as u64, 1];
    b.all_reduce_sum_u64(&mut v).expect("all_reduce u64");
    assert_eq!(v, [(size * (size - 1) / 2) as u64, size as u64]);
    let mut f = [0.25 * rank as f64];
    b.all_reduce_sum_f64(&mut f).expect("all_reduce f64");
    assert_eq!(f[0], 0.25 * (size * (size - 1) / 2) as f64);

    // Mismatched lengths are an error on every rank, not MPI undefined behaviour.
    let odd = vec![0u8; if rank == size - 1 { 3 } else { 2 }];
    match b.all_gather(&odd) {
        Err(BootstrapError::LengthMismatch { .. }) if size > 1 => {}
        Ok(_) if size == 1 => {}
        other => panic!("rank {rank}: expected a length mismatch, got {other:?}"),
    }

    let node = b.node().expect("node");
    let mut locals = [node.local_rank as u64];
    b.all_reduce_sum_u64(&mut locals)
        .expect("sum of local ranks");
    assert!(node.local_rank < node.local_size && node.node < node.nodes);
    if rank == 0 {
        println!("bootstrap_mpi: {size} ranks on {} node(s)", node.nodes);
        println!("  all_gather x100, barrier x100, all_reduce u64/f64, length mismatch: ok");
        println!(
            "  rank 0 on {} (local rank {} of {}); sum of local ranks {}",
            b.hostname(),
            node.local_rank,
            node.local_size,
            locals[0]
        );
    }
    b.barrier().expect("final barrier");
}
