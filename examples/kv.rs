//! `kv`: the key-value benchmark of seeds/004, a thin command line over the `kvbench` crate
//! (its crate docs describe the topology, the backends, the correctness check and the
//! fault handling; `cargo run --release --example kv -- --help` lists the flags).

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() {
    let cli = kvbench::config::Cli::parse();
    // RUST_LOG if set, else warnings and errors.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    std::process::exit(kvbench::run::main(cli));
}
