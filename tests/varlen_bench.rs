//! Smoke test of `examples/varlen_bench.rs` (issue 15 §3): the benchmark's library-level
//! function [`bench::run`] on two transports, its CSV, its plot, and the rows it prints for a
//! transport that cannot carry a size (instead of skipping it).

#[path = "../examples/varlen_bench.rs"]
#[allow(dead_code)]
mod bench;

use bench::{Args, System};

/// `--quick` on delegation and copyrpc at 4 calls in flight: 32 B and 4 KiB each, every call checked by the bench
/// (digest of the bytes sent), figures for every point, and the CSV/SVG written.
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
        assert!(r.calls > 0 && r.gbit_per_s() > 0.0, "{r:?}");
        assert_eq!(r.qd, 4);
    }
    let csv = bench::csv(&rows);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], bench::CSV_HEADER);
    assert_eq!(lines.len(), 5);
    assert!(lines[1].starts_with("delegation,32,4,"), "{}", lines[1]);
    // No tarpc row: no ratio; no error.
    assert!(lines[4].ends_with(",,"), "{}", lines[4]);
    let svg = std::env::temp_dir().join(format!("varlen_bench-{}.svg", std::process::id()));
    bench::plot(svg.to_str().unwrap(), &rows, 4).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_file(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("copyrpc"), "{text}");
}

/// A copyrpc ring too small for the service's 1 MiB messages, and a size above
/// `max_var_bytes`: each point gets a row naming the cause and the setting to raise.
#[test]
fn sizes_a_transport_cannot_carry_get_rows_saying_why() {
    let a = Args {
        transports: vec![System::Copyrpc, System::Delegation],
        sizes: vec![32, bench::MAX_VAR_BYTES + 1],
        duration: 0.02,
        copyrpc_ring: 1 << 20,
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
        assert_eq!(r.calls, 0);
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
