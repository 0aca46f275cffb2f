//! The command line of `kv` (clap): every flag with its default and help text
//! ([`Cli`], its subcommands [`Cmd`] and their argument groups), the transports, backends
//! and per-run topologies they choose ([`Transport`], [`Backend`], [`Topology`]: the backends
//! of a `--backend` are listed in one place, `topologies`), and the checks of argument
//! combinations that run before anything starts.

use clap::{Args, Parser, Subcommand, ValueEnum};
use rpc::delegation::DelegationConfig;
use rpc::erpc::transport::MAX_IN_FLIGHT_LIMIT as ERPC_MAX_IN_FLIGHT;

use crate::api::{Corrupt, MIN_VALUE_BYTES, SizeRange, Sizes, digits};
use crate::workload::*;

/// The command line of `kv` (its help text is the `about`/`long_about` below).
#[derive(Parser, Debug)]
#[command(
    about = "Distributed key-value benchmark (seeds/004): ipc, Flux, the delegation ring and copyrpc, or ScaleRPC or eRPC",
    long_about = "Distributed key-value benchmark (seeds/004): per-client ipc rings to the \
        shard daemons, Flux between them, the delegation ring and copyrpc between ranks \
        (--backend meta|delegation|direct|all; --preset seed004 runs the seed's Meta vs \
        Delegation experiment).\n\nWithout a subcommand (or with `run`), daemons and clients of every rank run \
        in this process; `--ranks R` runs R in-process ranks connected by copyrpc on the \
        device model. `--mpi` (a build with `--features mpi`) makes every process of \
        `mpirun -np N` one rank of the same topology, with copyrpc between the processes on \
        the device model shared by the processes of a host (or on an RDMA NIC: `--device`), \
        or eRPC over UDP between them (`--transport erpc`): \
        `mpirun -np 4 target/release/examples/kv --mpi --backend all`. The `serve`/`client` \
        subcommands split one rank's daemons and clients into two processes. \
        `--transport scalerpc` (`--transport erpc`) serves the daemons of one rank over \
        ScaleRPC on the device model (eRPC over UDP loopback) instead of ipc and rings.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// The subcommand, if one is given ([`Cli::into_command`]).
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    /// The flags of `run`, given without a subcommand.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The subcommands of `kv`.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Daemons and clients of every rank in this process (the default when no subcommand is
    /// given).
    Run(RunArgs),
    /// Only the daemons of one rank: create `<shm>-0 .. <shm>-{D-1}`, list them in the ring
    /// manifest `<shm>.rings`, and serve until SIGINT/SIGTERM or `--duration` (one rank; for
    /// ranks as processes, see `--mpi`).
    Serve(ServeArgs),
    /// Only the clients of one rank, attached to the rings a `kv serve` process listed in its
    /// ring manifest `<shm>.rings`.
    Client(ClientArgs),
}

/// The flags of `kv run` (and of `kv` without a subcommand).
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Daemon (shard server) threads per rank.
    #[arg(long, short = 'd', default_value_t = 1)]
    pub daemons: usize,
    /// In-process ranks, each with its own simulated NIC on one device-model fabric; requests
    /// target a rank chosen uniformly. 1: a single node, no copyrpc. (With `--mpi`, the ranks
    /// are the MPI processes.)
    #[arg(long, default_value_t = 1)]
    pub ranks: usize,
    /// Run a published configuration instead of the flags above: `seed004` is seeds/004 §10's
    /// experiment (2 daemons, 4 clients, QD 4, `resp_depth = QD`, ring depth 1024; Meta and
    /// Delegation on one rank and on two ranks, in-process; under `--mpi`, at the job's
    /// rank count) and prints its table beside ours. `--duration`, `--runs`, `--warmup`,
    /// `--no-pin` and the output flags still apply.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// This process is one rank of an MPI job (`mpirun -np N .../kv --mpi`): the ranks are the
    /// MPI processes, connected by copyrpc (delegation transport) or eRPC over UDP (`--transport
    /// erpc`). Needs a build with `--features mpi`.
    #[arg(long)]
    pub mpi: bool,
    /// Open this RDMA device (e.g. `mlx5_0`) through rdma-core for copyrpc between ranks,
    /// instead of the software device model.
    #[arg(long)]
    pub device: Option<String>,
    /// The port of `--device` (1-based).
    #[arg(long, default_value_t = 1, requires = "device")]
    pub port: u8,
    /// `--mpi --transport erpc`: the IP address the daemons' UDP sockets bind to and advertise
    /// (default: 127.0.0.1 when every rank runs on one host, else the first non-loopback address
    /// the host name resolves to).
    #[arg(long)]
    pub erpc_ip: Option<std::net::IpAddr>,
    /// How clients reach other ranks (seeds/004 §1): through the key's owner daemon, Flux and
    /// the endpoint's holder (meta), straight into Daemon#0's ring (delegation), with their
    /// own copyrpc endpoints (direct, upstream's baseline), or each in turn (all).
    #[arg(long, value_enum, default_value_t = Backend::Delegation)]
    pub backend: Backend,
    /// copyrpc send and receive ring size per endpoint, bytes (power of two, >= 1024).
    #[arg(long, default_value_t = 1 << 20)]
    pub copyrpc_ring: usize,
    /// How clients reach the daemons of their rank: the shared-memory delegation ring,
    /// ScaleRPC on the device model (one simulated NIC per daemon and per client thread), or
    /// eRPC over UDP loopback (one socket per daemon and per client connection). ScaleRPC runs
    /// one rank only; eRPC one rank, or the ranks of `--mpi`.
    #[arg(long, value_enum, default_value_t = Transport::Delegation)]
    pub transport: Transport,
    /// ScaleRPC settings (`--transport scalerpc`).
    #[command(flatten)]
    pub scale: ScaleArgs,
    /// Delegation ring sizes.
    #[command(flatten)]
    pub ring: RingArgs,
    /// The clients' load.
    #[command(flatten)]
    pub load: LoadArgs,
    /// How the summary is printed.
    #[command(flatten)]
    pub out: OutArgs,
}

/// The flags of `kv serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Base name of the rings in /dev/shm.
    #[arg(long)]
    pub shm: String,
    /// Daemon (shard server) threads.
    #[arg(long, short = 'd', default_value_t = 1)]
    pub daemons: usize,
    /// Delegation ring sizes.
    #[command(flatten)]
    pub ring: RingArgs,
    /// Stop after this many seconds (0: until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0.0)]
    pub duration: f64,
    /// Serve the variable-size `KvVar` service (byte-string keys and values), for
    /// `kv client --value-size ... / --key-size ...`.
    #[arg(long)]
    pub variable: bool,
    /// Test hook (hidden): daemon 0 executes its N-th request (1-based) but drops the reply,
    /// as a lost reply would (tests/kv_faults.rs).
    #[arg(long, hide = true)]
    pub drop_reply: Option<u64>,
}

/// The flags of `kv client`.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// Base name of the rings in /dev/shm (as given to `kv serve`).
    #[arg(long)]
    pub shm: String,
    /// The clients' load.
    #[command(flatten)]
    pub load: LoadArgs,
    /// How the summary is printed.
    #[command(flatten)]
    pub out: OutArgs,
}

/// Delegation ring sizes (seeds/004 §9), shared by `run` and `serve`.
#[derive(Args, Debug, Clone)]
pub struct RingArgs {
    /// Request slots per ring (power of two; seeds/004 §9: 1024).
    #[arg(long, default_value_t = 1024)]
    pub ring_depth: u32,
    /// Most clients per ring.
    #[arg(long, default_value_t = 64)]
    pub max_clients: u32,
    /// Response slots per client (power of two, at least the largest queue depth used).
    #[arg(long, default_value_t = 64)]
    pub resp_depth: u32,
}

/// ScaleRPC settings (seeds/003) of `--transport scalerpc`.
#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    /// ScaleRPC: connections per group; each daemon serves one group per time slice (0:
    /// grouping off). The seeds/003 default is 400.
    #[arg(long, default_value_t = 400)]
    pub scalerpc_group: u32,
    /// ScaleRPC: a group's time slice, microseconds (warm-up: a quarter of it).
    #[arg(long, default_value_t = 200)]
    pub scalerpc_slice_us: u64,
    /// ScaleRPC: message pool slot size, bytes (a multiple of 64). Default: 128 (the
    /// fixed-size KV messages fit), or with `--value-size`/`--key-size` the slot ScaleRPC
    /// derives from the largest `KvVar` message (4480).
    #[arg(long)]
    pub scalerpc_slot: Option<u32>,
}

/// The clients' load: threads, queue depth, keys, mix, sizes and duration.
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Client threads (per rank).
    #[arg(long, short = 'c', default_value_t = 1)]
    pub clients: usize,
    /// Calls in flight per client thread (closed loop).
    #[arg(long, default_value_t = 32)]
    pub qd: usize,
    /// Fraction of gets (the rest are puts).
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    /// Key range: keys are 0..keys (on every rank).
    #[arg(long, default_value_t = 1 << 20)]
    pub keys: u64,
    /// Key distribution.
    #[arg(long, value_enum, default_value_t = Dist::Uniform)]
    pub dist: Dist,
    /// Zipf exponent θ (with --dist zipf).
    #[arg(long, default_value_t = 0.99)]
    pub theta: f64,
    /// Measured time of each run in seconds (seeds/004 §9 step 12: `sleep(duration)`).
    #[arg(long, default_value_t = 8.0)]
    pub duration: f64,
    /// Measured runs per backend (seeds/004 §9 step 12), each after a barrier of all ranks;
    /// the summary gives each run's throughput and their median.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Warm-up before the first run, seconds: the clients run but nothing is measured
    /// (neither throughput nor latency).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Do not pin daemons and clients to cores (seeds/004 §9 step 1; pinning is on by
    /// default when the host has a core for every daemon and client thread of its ranks).
    #[arg(long)]
    pub no_pin: bool,
    /// Pre-generated operations per client (the pattern is replayed cyclically).
    #[arg(long, default_value_t = 1 << 20)]
    pub pattern_len: usize,
    /// RNG seed (same seed, same access patterns).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Value size in bytes: `N`, or `LO-HI` for a length drawn uniformly from `LO..=HI`
    /// (inclusive) for each write (a hash of the key and the version, so that a reader can
    /// check it). `8` (the default) with no `--key-size`: `u64` values over the fixed-size
    /// `Kv` service (seeds/004 §8). Anything else runs the `KvVar` service (byte-string keys
    /// and values) with values of 16..=4096 bytes: each carries its version and key id in its
    /// first 16 bytes and a pattern derived from both after them, and every read checks every
    /// byte and the length.
    #[arg(long, default_value = "8")]
    pub value_size: SizeRange,
    /// Key size in bytes (runs the `KvVar` service): `N`, or `LO-HI` for a length drawn
    /// uniformly from `LO..=HI` (inclusive) per key id. A key is `k` and the key id in
    /// decimal, zero-padded to its length (`k0000042`), so `LO` must leave room for the digits
    /// of the largest key id; at most 256. Default with a `--value-size` other than 8: 16.
    #[arg(long)]
    pub key_size: Option<SizeRange>,
    /// Test hook (hidden): client thread 0 of rank 0 damages every value it writes (`KvVar`
    /// only): its last byte flipped, or one byte short (tests/kv_varsize.rs).
    #[arg(long, hide = true, value_enum)]
    pub corrupt_puts: Option<Corrupt>,
    /// Written keys read back by the end-of-run correctness check.
    #[arg(long, default_value_t = 10_000)]
    pub check_samples: usize,
    /// Per-call deadline, milliseconds: a call with no reply this long after it was issued
    /// (a lost reply, a stopped daemon) counts as an error and is given up (a late reply is
    /// dropped), so the run and its check always end.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub deadline_ms: u64,
    /// Test hook (hidden): client thread 0 of rank 0 fails on purpose once it has completed
    /// this many operations, as a fault would make it fail (tests/kv_faults.rs).
    #[arg(long, hide = true)]
    pub fail_client_after: Option<u64>,
    /// Test hook (hidden): client thread 0 of rank 0 never sends the N-th (1-based) of its
    /// calls to other ranks (`--backend direct`), as if its request or reply were lost, so
    /// that its deadline ends it (`kvbench::direct::LoseCall`, tests/kv_faults.rs).
    #[arg(long, hide = true)]
    pub lose_direct_call: Option<u64>,
}

/// How the summary is printed: text, `--json` or `--csv`.
#[derive(Args, Debug, Clone)]
pub struct OutArgs {
    /// Print the summary as one JSON object on stdout (one line per backend run).
    #[arg(long)]
    pub json: bool,
    /// Print the summary as CSV (header + one row per backend run) on stdout.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// No per-second progress lines.
    #[arg(long)]
    pub quiet: bool,
}

/// How clients reach the daemons of their rank (`--transport`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// The shared-memory delegation ring of seeds/004 (`/dev/shm`).
    Delegation,
    /// ScaleRPC (seeds/003) on the device model: every daemon is a ScaleRPC server.
    Scalerpc,
    /// eRPC (seeds/000, 002) over UDP loopback: every daemon is an eRPC server.
    Erpc,
}

/// A published configuration (`--preset`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// seeds/004 §10: 2 daemons, 4 clients, QD 4, Meta vs Delegation on 1 and 2 nodes.
    Seed004,
}

impl RunArgs {
    /// These arguments with the seeds/004 §10 configuration on `ranks` ranks (Meta, then
    /// Delegation): 2 daemons, 4 clients, QD 4, `resp_depth = QD` (every
    /// ring's response slots per client), request ring depth 1024 (§9 steps 3-4).
    pub fn seed004(&self, ranks: usize) -> RunArgs {
        let mut a = self.clone();
        a.preset = Some(Preset::Seed004);
        a.ranks = ranks;
        a.daemons = 2;
        a.load.clients = 4;
        a.load.qd = 4;
        a.ring.resp_depth = 4;
        a.ring.ring_depth = 1024;
        a.transport = Transport::Delegation;
        a
    }
}

/// How clients reach other ranks (`--backend`; seeds/004 §1).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// seeds/004 Meta (§1.1): every call goes over ipc to the key's owner daemon; a remote
    /// one is passed over Flux to the daemon holding the target rank's copyrpc endpoint
    /// (daemon `rank % D`, §1.4).
    Meta,
    /// seeds/004 Delegation (§1.2): local calls over ipc to the owner daemon, remote calls
    /// straight into Daemon#0's delegation ring; Daemon#0 holds every endpoint.
    Delegation,
    /// Upstream's third baseline, not in seeds/004's table: each client thread has its own
    /// copyrpc endpoints to every remote rank's daemon 0; local calls go to each daemon's
    /// delegation ring.
    Direct,
    /// `meta`, `delegation`, then `direct`, in one process.
    All,
}

/// The topology of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// [`Backend::Meta`].
    Meta,
    /// [`Backend::Delegation`].
    Delegation,
    /// [`Backend::Direct`].
    Direct,
}

impl Cli {
    /// The subcommand given, or `run` with the top-level flags when none is.
    pub fn into_command(self) -> Cmd {
        self.cmd.unwrap_or(Cmd::Run(self.run))
    }
}

impl Topology {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Topology::Meta => "meta",
            Topology::Delegation => "delegation",
            Topology::Direct => "direct",
        }
    }
}

pub(crate) fn delegation_config(r: &RingArgs, qd: usize) -> Result<DelegationConfig, String> {
    if !r.resp_depth.is_power_of_two() || (r.resp_depth as usize) < qd.max(1) {
        return Err(format!(
            "--resp-depth {} must be a power of two >= --qd {qd}",
            r.resp_depth
        ));
    }
    Ok(DelegationConfig {
        max_clients: r.max_clients,
        ring_depth: r.ring_depth,
        resp_depth: r.resp_depth,
        ..DelegationConfig::default()
    })
}

/// Checks the arguments of the delegation transport for `ranks` ranks; the rings'
/// configuration.
pub(crate) fn delegation_args(a: &RunArgs, ranks: usize) -> Result<DelegationConfig, String> {
    let cfg = delegation_config(&a.ring, a.load.qd)?;
    if a.daemons == 0 {
        return Err("--daemons must be at least 1".into());
    }
    if ranks > 1 {
        if !a.copyrpc_ring.is_power_of_two() || a.copyrpc_ring < 1024 {
            return Err("--copyrpc-ring must be a power of two >= 1024".into());
        }
        // The largest message of the service must fit an endpoint of this ring (with the
        // default response reservation, a quarter of the ring).
        let d = match a.load.sizes()? {
            None => <idl::kv::KvService as rpc::Service>::DESCRIPTOR,
            Some(_) => <idl::kv::KvVarService as rpc::Service>::DESCRIPTOR,
        };
        let ring = a.copyrpc_ring as u64;
        let fits = rpc::copyrpc::endpoint::max_payload_for(ring, ring / 4) as usize;
        let need = d.max_request_bytes.max(d.max_response_bytes);
        if fits < need {
            let min = (10..48)
                .map(|s| 1u64 << s)
                .find(|&r| rpc::copyrpc::endpoint::max_payload_for(r, r / 4) as usize >= need);
            return Err(format!(
                "--copyrpc-ring {}: its endpoints carry messages of at most {fits} B, and {}'s \
                 are up to {need} B: give --copyrpc-ring {} or more",
                a.copyrpc_ring,
                d.name,
                min.unwrap_or(u64::MAX)
            ));
        }
        // Each ring: the rank's clients, the checker and (daemons 1..) the delegate.
        if a.load.clients + 2 > a.ring.max_clients as usize {
            return Err(
                "--max-clients must be at least --clients + 2 with more than one rank".into(),
            );
        }
    }
    load_args(&a.load, ranks)?;
    Ok(cfg)
}

/// Checks the client load for `ranks` ranks.
pub(crate) fn load_args(load: &LoadArgs, ranks: usize) -> Result<(), String> {
    if load.clients == 0 || load.qd == 0 || load.keys < (load.clients * ranks) as u64 {
        return Err("need --clients >= 1, --qd >= 1 and --keys >= --clients * ranks".into());
    }
    load.sizes().map(drop)
}

impl LoadArgs {
    /// The key and value sizes of a run of the `KvVar` service, or `None` for the fixed-size
    /// `Kv` service (`--value-size 8`, no `--key-size`).
    ///
    /// # Errors
    /// A size out of range: values `16..=4096` bytes, keys at most 256 and at least `1 +`
    /// the digits of the largest key id; `--corrupt-puts` without variable sizes.
    pub fn sizes(&self) -> Result<Option<Sizes>, String> {
        let fixed = SizeRange { lo: 8, hi: 8 };
        if self.value_size == fixed && self.key_size.is_none() {
            if self.corrupt_puts.is_some() {
                return Err("--corrupt-puts needs --value-size or --key-size".into());
            }
            return Ok(None);
        }
        let v = self.value_size;
        if v == fixed {
            return Err(format!(
                "--key-size runs the KvVar service, whose values are {MIN_VALUE_BYTES}..={} \
                 bytes: give --value-size too (e.g. --value-size 16)",
                idl::kv::MAX_VALUE_BYTES
            ));
        }
        if v.lo < MIN_VALUE_BYTES || v.hi > idl::kv::MAX_VALUE_BYTES {
            return Err(format!(
                "--value-size {v}: variable-size values are {MIN_VALUE_BYTES}..={} bytes \
                 (each carries its version and key id in its first 16 bytes; 8 alone selects \
                 the fixed-size u64 values)",
                idl::kv::MAX_VALUE_BYTES
            ));
        }
        let k = self.key_size.unwrap_or(SizeRange { lo: 16, hi: 16 });
        let need = 1 + digits(self.keys.saturating_sub(1));
        if k.lo < need || k.hi > idl::kv::MAX_KEY_BYTES {
            return Err(format!(
                "--key-size {k}: keys are `k` and the key id in decimal, so with --keys {} they \
                 need at least {need} bytes; at most {}",
                self.keys,
                idl::kv::MAX_KEY_BYTES
            ));
        }
        Ok(Some(Sizes { value: v, key: k }))
    }
}

/// The backends a run of `a` measures, in order: the preset's, else `--backend`'s.
pub(crate) fn topologies_of(a: &RunArgs) -> &'static [Topology] {
    match a.preset {
        Some(Preset::Seed004) => &[Topology::Meta, Topology::Delegation],
        None => topologies(a.backend),
    }
}

/// The backends `b` measures, in order.
pub(crate) fn topologies(b: Backend) -> &'static [Topology] {
    match b {
        Backend::Meta => &[Topology::Meta],
        Backend::Delegation => &[Topology::Delegation],
        Backend::Direct => &[Topology::Direct],
        Backend::All => &[Topology::Meta, Topology::Delegation, Topology::Direct],
    }
}

/// Checks the arguments of `--transport erpc`.
pub(crate) fn erpc_args(a: &RunArgs, ranks: usize) -> Result<(), String> {
    if a.backend != Backend::Delegation {
        return Err("--backend applies to copyrpc between ranks, not to --transport erpc".into());
    }
    if a.device.is_some() {
        return Err("--device applies to copyrpc between ranks (the delegation transport)".into());
    }
    if a.daemons == 0 {
        return Err("--daemons must be at least 1".into());
    }
    if a.load.qd == 0 || a.load.qd > ERPC_MAX_IN_FLIGHT {
        return Err(format!(
            "--qd must be in 1..={ERPC_MAX_IN_FLIGHT} with --transport erpc"
        ));
    }
    load_args(&a.load, ranks)
}
