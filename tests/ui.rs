//! Compile-error and compile-pass tests of `#[rpc_service]` (trybuild).
//!
//! The expected messages (`tests/ui/*.stderr`) are what rustc 1.95 prints; other compilers
//! word and place some diagnostics differently, so there the test is skipped with that reason.
//! Regenerate after a deliberate change with `TRYBUILD=overwrite cargo test --test ui`, then
//! review the diff.

#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the .stderr expectations were generated with rustc 1.95; other compilers word diagnostics differently"
)]
#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/*.rs");
}
