//! `kvbench`: the key-value benchmark of seeds/004, over typed `#[rpc_service]` stubs, the
//! shared-memory delegation ring and, across ranks, copyrpc on the device model. The `kv`
//! example (`examples/kv.rs`) is its command line: it parses [`config::Cli`] and calls
//! [`run::main`]. In-process runs are also a library call, [`run::run_all`], returning one
//! [`report::Summary`] per backend run without printing it ([`report::print_summaries`]
//! prints them as text, JSON or CSV).
//!
//! Layout, one module per concern: [`config`] (the command line), [`workload`] (access
//! patterns), [`api`] (the two KV services, their shards, request routing, keys and
//! values), [`daemon`] (daemon threads),
//! [`seed`] (the Meta and Delegation backends of seeds/004), [`wiring`] (NICs, copyrpc
//! endpoints and the bootstrap between ranks), [`client`] (client threads, the warm-up and
//! the measured runs), [`pinning`] (CPU pinning), [`check`] (the correctness check),
//! [`report`] (summaries, the seeds/004 table), [`run`] (jobs).
//!
//! Topology of one rank (seeds/004 §1.3, §7, §9): `D` daemon threads each own a shard
//! (`key % D`) and serve it to the rank's clients through their own ipc server in `/dev/shm`
//! (per-client SPSC rings, [`rpc::ipc`]); they talk to each other over Flux
//! ([`rpc::flux`]). `C` client threads run a closed loop with `QD` calls in flight each,
//! sending every request for their own rank to the owner daemon over ipc. Access patterns
//! (rank, key, read/write) are pre-generated per client (seeds/004 §9 step 2): uniform or
//! zipfian (θ = 0.99 by default) keys, with a read ratio, and (with `--ranks R > 1`) a target
//! rank uniform over the ranks. Each daemon runs [`rpc::delegation::node::NodeDaemon`] (its
//! module docs give the routing and the phase order of seeds/004 §5-§6).
//!
//! `--ranks R` runs `R` ranks in this process (threads, with the in-process bootstrap
//! `rpc::bootstrap::threads`), each with its own simulated NIC on one shared device-model
//! fabric. How a client reaches another rank (`--backend`):
//! - `meta` (seeds/004 §1.1, §1.4): over ipc to the key's owner daemon like a local call; that
//!   daemon passes it over Flux to the daemon holding the target rank's copyrpc endpoint
//!   (daemon `rank % D`), which sends it (3 hops).
//! - `delegation` (seeds/004 §1.2, §4): straight into Daemon#0's delegation ring
//!   ([`rpc::delegation`], `fetch_add` on a shared MPSC ring); Daemon#0 holds every endpoint
//!   and sends it over copyrpc (1 hop).
//! - `direct` (upstream's third baseline, not in seeds/004's table): each client thread has
//!   its own copyrpc context ([`rpc::copyrpc::ClientContext`]) with one endpoint per remote
//!   rank, connected to that rank's daemon 0 ([`rpc::delegation::Delegate`]), and a typed
//!   client on each (`direct::DirectCopyrpc`), polled alongside its connections; local
//!   calls go to the daemons' delegation rings.
//! - `all`: the three, one after the other in this process, and their ratios.
//!
//! On the receiving rank a call is served by the daemon that holds the endpoint it arrived
//! on, or passed over Flux to the key's owner daemon (seeds/004 §4.3). With one rank there is
//! no remote traffic: the summary says so instead of comparing the backends.
//!
//! The benchmark method is seeds/004 §9's: a warm-up (`--warmup`, not measured), then
//! `--runs N` measured runs of `--duration` seconds, each after a barrier of all ranks; a
//! run counts the operations completed up to its stop time, and the summary gives each run's
//! throughput and their median. Daemons and clients are pinned to cores (daemons first,
//! `core_affinity`) when the host has one for each, unless `--no-pin`. `--preset seed004`
//! runs seeds/004 §10's experiment (2 daemons, 4 clients, QD 4, Meta and Delegation on one
//! rank and on two) and prints its table beside ours ([`report::seed004_table`]).
//!
//! `--transport scalerpc` (one rank) replaces the delegation rings by ScaleRPC (seeds/003): each
//! daemon serves its shard through a `ScaleRpcServer` on its own simulated NIC, and each client
//! thread, on a NIC of its own, connects a `KvClient<ScaleRpc>` to every daemon
//! (`--scalerpc-group`, `--scalerpc-slice-us` set the connection grouping). ScaleRPC may execute
//! two calls outstanding on one connection in either order, so a client then never has two
//! writes of one key outstanding.
//!
//! `--transport erpc` (one rank; several under `--mpi`, below) does the same over eRPC on UDP
//! loopback (seeds/000, 002):
//! each daemon serves its shard through an `ErpcServer` on its own UDP socket, and each client
//! thread connects a `KvClient<Erpc>` (`--qd` calls in flight, over `ceil(qd / 8)` sessions) to
//! every daemon. eRPC too may execute a client's outstanding calls in either order.
//!
//! Ranks as MPI processes (`--mpi`, a build with `--features mpi`): under `mpirun -np N` each
//! process is one rank of the same topology (its daemons, its rings in `/dev/shm`, its clients,
//! copyrpc to the other ranks; `--backend meta|delegation|direct|all`), running exactly the per-rank
//! code of `--ranks R`, whose ranks are threads: the ranks exchange copyrpc endpoint information
//! through the bootstrap ([`rpc::bootstrap`]: `MPI_Allgather`), connect, and meet at a barrier
//! before any traffic. On one host the ranks' simulated NICs share one device-model fabric
//! ([`rpc::mlx5::sim::Fabric::join`], named after the pid of the host's first rank), so the device model needs
//! every rank on one host; `--device mlx5_0 [--port 1]` opens a real NIC through rdma-core
//! instead. `--mpi --transport erpc` runs eRPC over UDP across the processes: each rank's
//! daemons serve `ErpcServer`s (on 127.0.0.1 when all ranks share a host, else on `--erpc-ip`
//! or the address the host name resolves to), and every client thread connects a
//! `KvClient<Erpc>` to every daemon of every rank. Rank 0 prints the totals: throughput overall and per rank, requests served per rank,
//! latency percentiles merged over all ranks (each rank's histogram travels in hdrhistogram's V2
//! encoding), and the correctness check; every rank exits nonzero if any rank failed.
//!
//! Correctness: every client has a global id `g = rank * C + c` and only writes keys `k` with
//! `k % (R * C) == g` (on any rank), so every (rank, key) has one writer, whose successive
//! calls reach the owner daemon in issue order (one client's `fetch_add`s on a ring are
//! ordered; the delegate forwards a client's calls in ring order, and copyrpc and the
//! hand-off ring keep that order). Values encode `(writer << 48) | seq`, so every read is
//! checked for a plausible writer during the run, and at the end a sample of written keys,
//! local and remote, is read back from the owner daemon of the owner rank and must return the
//! last value written. The check runs where the keys live: each rank samples the keys its
//! clients wrote, sends every sampled key to its owner rank (an all-gather), and each rank reads
//! the keys it owns back from their owner daemon; the counts are summed over the ranks.
//!
//! Value and key sizes (issue 15; [`api`]): by default (`--value-size 8`, no `--key-size`)
//! keys and values are `u64`s over the fixed-size `idl::kv::Kv` service, as in seeds/004 §8.
//! `--value-size N` or `--value-size LO-HI` (16..=4096 bytes; a range is uniform, the length
//! of each write a hash of its key and version) and `--key-size N|LO-HI` (a key is `k` and
//! the key id in decimal, zero-padded to the key's length, a hash of the key id) run the
//! `idl::kv::KvVar` service instead (`&str` keys, `&[u8]` values), over the same transports,
//! backends and check: a value is its version, its key id and a pattern derived from both,
//! so every read (during the run and in the check) verifies every byte and the length and
//! recovers the version the check compares. A damaged value is an error (`damaged_reads`)
//! and fails the run. Within a rank a `KvVar` key's owner daemon is a hash of its bytes
//! (`idl::kv::owner_daemon_of`). `kv serve --variable` serves `KvVar` to `kv client`s with
//! sizes. The `KvVar` path is not allocation-free where the runtime hands the daemon owned
//! requests (the ipc/Flux daemons of Meta and Delegation, the copyrpc delegate) or the client
//! owned responses (pipelined calls): the fixed-size default is unchanged.
//!
//! `kv serve` lists its rings in a ring manifest, `/dev/shm/<shm>.rings`
//! ([`rpc::delegation::RingManifest`]: this user's file, mode 0600), and `kv client` attaches
//! to exactly the rings listed there, never to whatever `<shm>-N` names exist, so a ring file
//! another local user creates is never taken for a daemon (and is refused if named).
//!
//! `kv client` shares its daemons with any other `kv client` process, before, after or at the
//! same time, so there a client's writer id is instead its client id on ring 0, which the ring
//! hands out at attach (unique among the clients attached at once, whatever their process),
//! and it writes the keys `k` with `k % max_clients == id` (`kv serve --max-clients`, which
//! `--keys` must reach): every key still has one writer among the processes, and a value a
//! read finds, written by any process, names it. A client thread stays attached until the
//! check has read its keys back.
//!
//! Faults: every call has a deadline (`--deadline-ms`, 1000 by default); one with no
//! completion by then (a lost reply, a stopped daemon) counts as an error and is given up (its
//! tag comes back only if a late completion arrives, which is dropped), so the stop loop and
//! the check always end; the summary names how many expired. A client thread that fails
//! (a call's error, a daemon gone) ends the run at once: the other threads stop, the summary
//! keeps what every thread did and names the failure, and the exit code is 1.
//!
//! ```text
//! cargo run --release --example kv                      # all in one process, ~10 s
//! cargo run --release --example kv -- --ranks 2 --backend all --duration 5
//! cargo run --release --example kv -- --preset seed004 --runs 3
//! cargo run --release --example kv -- --transport scalerpc --clients 4 --scalerpc-group 2
//! cargo run --release --example kv -- --transport erpc --clients 2 --daemons 2
//! cargo run --release --example kv -- --value-size 16-4096 --key-size 10-40
//! cargo run --release --example kv -- --help
//! cargo build --release --features mpi --example kv   # then, ranks as processes:
//! mpirun -np 4 target/release/examples/kv --mpi --backend all --duration 5
//! mpirun -np 2 target/release/examples/kv --mpi --transport erpc --duration 5
//! mpirun -np 2 --host a,b target/release/examples/kv --mpi --device mlx5_0 --port 1
//! kv serve --shm kvbench --daemons 2                    # process 1: daemons (one rank)
//! kv client --shm kvbench --clients 2                   # process 2: clients + check
//! ```

pub mod api;
pub mod check;
pub mod client;
pub mod config;
pub mod daemon;
pub(crate) mod direct;
pub mod pinning;
pub mod report;
pub mod run;
pub mod seed;
pub mod wiring;
pub mod workload;
