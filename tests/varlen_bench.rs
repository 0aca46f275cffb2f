//! Smoke test of `examples/varlen_bench.rs` (issue 15 §3): the benchmark's library-level
//! function [`bench::run`] on two transports, its CSV, its plot, and the rows it prints for a
//! transport that cannot carry a size (instead of skipping it).

#[path = "../examples/varlen_bench.rs"]
#[allow(dead_code)]
mod bench;

use bench::{Args, Row, System};

/// `--quick` on delegation and copyrpc at 4 calls in flight: 32 B and 4 KiB each, every call checked by the bench
/// (digest of the bytes sent), and one CSV line per point.
#[test]
fn quick_run_on_two_transports() {
    let a = Args {
        transports: vec![System::Delegation, System::Copyrpc],
        quick: true,
        qd: 4,
        ..Args::defaults()
    };
    let rows = bench::run(&a);
    let got: Vec<(System, usize)> = rows.iter().map(|r| (r.system, r.size)).collect();
    assert_eq!(
        got,
        [
            (System::Delegation, 32),
            (System::Delegation, 4096),
            (System::Copyrpc, 32),
            (System::Copyrpc, 4096),
        ]
    );
    for r in &rows {
        assert!(r.error.is_none(), "{r:?}");
        // Every call issued was answered with its digest; how many fell inside the 50 ms
        // window depends on the machine's load, so only the total is checked.
        assert!(r.completed >= 4, "{r:?}");
        assert_eq!(r.qd, 4);
    }
    let csv = bench::csv(&rows);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], bench::CSV_HEADER);
    assert_eq!(lines.len(), 5);
    assert!(lines[1].starts_with("delegation,32,4,"), "{}", lines[1]);
    // No tarpc row: no ratio; no error.
    assert!(lines[4].ends_with(",,"), "{}", lines[4]);
}

/// A copyrpc ring too small for the service's 1 MiB messages inline, with the rendezvous
/// path turned off (`--copyrpc-large 0`), and a size above `max_var_bytes`: each point gets a
/// row naming the cause and the setting to raise.
#[test]
fn sizes_a_transport_cannot_carry_get_rows_saying_why() {
    let a = Args {
        transports: vec![System::Copyrpc, System::Delegation],
        sizes: vec![32, bench::MAX_VAR_BYTES + 1],
        duration: 0.02,
        copyrpc_ring: 1 << 20,
        copyrpc_large: 0,
        ..Args::defaults()
    };
    let rows = bench::run(&a);
    assert_eq!(rows.len(), 4);
    for r in &rows[..2] {
        assert_eq!(r.system, System::Copyrpc);
        let e = r
            .error
            .as_deref()
            .expect("copyrpc with a 1 MiB ring must refuse");
        assert!(e.contains("ring_size"), "{e}");
        assert_eq!((r.calls, r.completed), (0, 0));
    }
    assert!(
        rows[2].error.is_none() && rows[2].calls > 0,
        "{:?}",
        rows[2]
    );
    let e = rows[3].error.as_deref().expect("above max_var_bytes");
    assert!(e.contains("max_var_bytes"), "{e}");
    let csv = bench::csv(&rows);
    assert!(
        csv.lines()
            .nth(1)
            .unwrap()
            .starts_with("copyrpc,32,1,0,0,0.0000,,,,\""),
        "{csv}"
    );
}

fn row(system: System, size: usize, calls: u64, latencies_ns: &[u64]) -> Row {
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    for &ns in latencies_ns {
        hist.record(ns).unwrap();
    }
    Row {
        system,
        size,
        qd: 1,
        calls,
        completed: calls + 1,
        secs: 0.5,
        hist,
        error: None,
    }
}

/// The CSV's figures and ratios, and the plot, from rows of known figures.
/// With the rendezvous path (the default `max_large_message`), a 1 MiB ring carries the
/// service's 1 MiB messages: no refusal row.
#[test]
fn copyrpc_rendezvous_carries_what_the_ring_cannot() {
    let a = Args {
        transports: vec![System::Copyrpc],
        sizes: vec![1 << 20],
        duration: 0.02,
        copyrpc_ring: 1 << 20,
        ..Args::defaults()
    };
    let rows = bench::run(&a);
    assert_eq!(rows.len(), 1);
    assert!(
        rows[0].error.is_none() && rows[0].completed > 0,
        "{:?}",
        rows[0].error
    );
}

#[test]
fn csv_ratios_and_plot_of_known_rows() {
    let rows = vec![
        row(System::Tarpc, 32, 1000, &[1_500]),
        row(System::Tarpc, 1 << 20, 100, &[2_000]),
        row(System::Delegation, 32, 3000, &[300, 300, 500]),
        row(
            System::Delegation,
            1 << 20,
            250,
            &[1_000, 1_000, 1_000, 2_000],
        ),
        row(System::Erpc, 32, 10, &[]),
    ];
    let csv = bench::csv(&rows);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[1], "tarpc,32,1,1000,2000,0.0005,1.50,1.50,1.000,");
    // 250 calls of 1 MiB in 0.5 s: 500/s, 4.194 Gbit/s, 2.5x tarpc; latencies below 2048 ns
    // are exact in the histogram.
    assert_eq!(
        lines[4],
        "delegation,1048576,1,250,500,4.1943,1.00,2.00,2.500,"
    );
    assert!(
        lines[3].starts_with("delegation,32,1,3000,6000,"),
        "{}",
        lines[3]
    );
    assert!(lines[3].ends_with(",3.000,"), "{}", lines[3]);
    // No latency sample: empty latency columns, not zeros.
    assert_eq!(lines[5], "erpc,32,1,10,20,0.0000,,,0.010,");
    let svg = std::env::temp_dir().join(format!("varlen_bench-{}.svg", std::process::id()));
    bench::plot(svg.to_str().unwrap(), &rows, 1).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_file(&svg).unwrap();
    for label in [
        "<svg",
        "tarpc",
        "delegation",
        "erpc",
        "1 MiB",
        "32 B",
        "QD 1",
    ] {
        assert!(text.contains(label), "{label} missing from the plot");
    }
}
