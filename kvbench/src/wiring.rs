//! Wiring the ranks of a job together (seeds/004 §9 steps 6-9): where their NICs come from
//! (`Nic`), each rank's copyrpc contexts and endpoints (`Wiring`) and how a client thread
//! reaches other ranks (`Remote`), the exchange of endpoint information through the bootstrap
//! (checked, never trusted: issue 14), and the helpers that end every setup step on all ranks
//! together (`agree`).

use std::marker::PhantomData;
use std::time::Duration;

use rpc::Service;
use rpc::bootstrap::threads::{ThreadGroup, ThreadRank};
use rpc::bootstrap::wire::{self};
use rpc::bootstrap::{Bootstrap, BootstrapError};
use rpc::copyrpc::info::INFO_BYTES;
use rpc::copyrpc::{
    ClientContext, Context, ContextConfig, Copyrpc, EndpointConfig, EndpointId, EndpointInfo,
    SetupError,
};
use rpc::delegation::DelegToken;
use rpc::mlx5::sim::{Fabric, SimConfig};

use crate::api::Api;
use crate::config::*;
use crate::direct::{DirectCopyrpc, LoseCall};

/// The device model of multi-rank runs.
pub(crate) fn sim_config() -> SimConfig {
    SimConfig {
        // Steps the model now and then, so that a sender stalled on a full receive queue
        // resumes even when nobody rings a doorbell.
        progress_thread: Some(Duration::from_millis(1)),
        ..SimConfig::default()
    }
}

/// Where the NICs of a job's ranks come from.
#[derive(Clone)]
pub(crate) enum Nic {
    /// A simulated NIC per rank on the device-model fabric (one fabric for the ranks of this
    /// process, or for the processes of a host that joined it).
    Sim(Fabric),
    /// `--device`: the RDMA device through rdma-core.
    Hw { device: String, port: u8 },
}

impl Nic {
    /// Opens one NIC (a device context).
    pub(crate) fn open(&self) -> Result<rpc::mlx5::verbs::Context, String> {
        match self {
            Nic::Sim(fabric) => Ok(fabric.open()),
            Nic::Hw { device, port } => rpc::mlx5::hw::open(Some(device), *port)
                .map_err(|e| format!("opening RDMA device {device} port {port}: {e}")),
        }
    }
}

/// `--device`, if given: the NIC, opened once here so that a missing device fails before
/// anything else (every rank of an MPI job fails alike).
pub(crate) fn hw_nic(a: &RunArgs) -> Result<Option<Nic>, String> {
    let Some(device) = &a.device else {
        return Ok(None);
    };
    let nic = Nic::Hw {
        device: device.clone(),
        port: a.port,
    };
    nic.open()?;
    Ok(Some(nic))
}

/// What the ranks of a job share.
pub(crate) struct Job {
    /// Prefix of the rings in /dev/shm: `kv-<pid>`, with the pid of this host's first rank.
    pub(crate) base: String,
    /// The ranks' NICs (`None`: a single rank, no copyrpc).
    pub(crate) nic: Option<Nic>,
    /// The ranks are MPI processes (else threads of this process).
    pub(crate) mpi: bool,
}

/// What a client thread uses to reach other ranks.
pub(crate) enum Remote<A: Api> {
    /// Single rank: no remote requests.
    None,
    /// Meta backend (seeds/004 §1.1): remote calls too go over ipc to the key's owner daemon
    /// (`rings[key % D]`), which passes them on.
    Meta,
    /// Delegation backend (seeds/004 §1.2, §7): remote calls go into Daemon#0's delegation
    /// ring through this client.
    Ring(Box<A::Conn<rpc::delegation::Delegation>>),
    /// A typed client to each remote rank's daemon 0 (`conns[rank]`), all riding this client
    /// thread's one copyrpc context ([`DirectCopyrpc`]).
    Direct {
        conns: Vec<Option<A::Conn<DirectCopyrpc>>>,
    },
    /// The client's rings reach the daemons of every rank, rank-major, `daemons` per rank
    /// (eRPC across ranks).
    Rings { daemons: usize },
}

/// Ends a setup step on every rank together: its outcome here, or an error on every rank if
/// it failed on any, so that no rank goes on to a collective that the failed ones never join.
pub(crate) fn agree<B: Bootstrap, T>(b: &B, step: &str, r: Result<T, String>) -> Result<T, String> {
    let mut failed = [u64::from(r.is_err())];
    b.all_reduce_sum_u64(&mut failed)
        .map_err(|e| format!("{step}: {}", boot(e)))?;
    match r {
        Err(e) => Err(e),
        Ok(_) if failed[0] > 0 => Err(format!("{step} failed on {} other rank(s)", failed[0])),
        Ok(v) => Ok(v),
    }
    .map_err(|e| on_rank(b, e))
}

/// `msg`, prefixed with the rank if there are several.
pub(crate) fn on_rank<B: Bootstrap>(b: &B, msg: String) -> String {
    if b.size() > 1 {
        format!("rank {}: {msg}", b.rank())
    } else {
        msg
    }
}

pub(crate) fn boot(e: BootstrapError) -> String {
    format!("bootstrap: {e}")
}

/// A rank's copyrpc contexts and endpoints for the `direct` backend (upstream's baseline):
/// the delegate's context with one endpoint serving each client thread of each other rank,
/// and each client thread's own context with an endpoint to each other rank's delegate.
/// Created, then connected to the other ranks' ([`Wiring::connect`]), then split into the
/// delegate's context and the client threads' typed clients ([`Wiring::into_parts`]).
pub(crate) struct Wiring<A: Api> {
    pub(crate) ranks: usize,
    pub(crate) clients: usize,
    /// The delegate's context.
    pub(crate) dlg: Context<DelegToken>,
    /// The delegate's endpoint serving client `c` of rank `s`, at `s * clients + c`.
    pub(crate) served: Vec<Option<EndpointId>>,
    /// Each client thread's context, and its endpoint to each other rank (`None`: this rank).
    pub(crate) contexts: Vec<(ClientContext, Vec<Option<EndpointId>>)>,
    _api: PhantomData<fn() -> A>,
}

impl<A: Api> Wiring<A> {
    /// Opens the rank's NIC and creates its contexts and endpoints.
    pub(crate) fn new(
        nic: &Nic,
        (rank, ranks): (usize, usize),
        clients: usize,
        ring_size: usize,
    ) -> Result<Wiring<A>, String> {
        let device = nic.open()?;
        let ecfg = EndpointConfig {
            ring_size,
            fingerprint: A::S::DESCRIPTOR.fingerprint,
            ..EndpointConfig::default()
        };
        let setup = |e: SetupError| format!("copyrpc setup: {e}");
        let mut dlg =
            Context::<DelegToken>::new(&device, ContextConfig::default()).map_err(setup)?;
        let mut served = vec![None; ranks * clients];
        let mut contexts = Vec::with_capacity(clients);
        let others = || (0..ranks).filter(move |&s| s != rank);
        for s in others() {
            for c in 0..clients {
                let ep = dlg.create_endpoint(&ecfg).map_err(setup)?;
                served[s * clients + c] = Some(ep);
            }
        }
        for _ in 0..clients {
            let mut ctx = Context::<u32>::new(&device, ContextConfig::default()).map_err(setup)?;
            let mut eps = vec![None; ranks];
            for s in others() {
                eps[s] = Some(ctx.create_endpoint(&ecfg).map_err(setup)?);
            }
            contexts.push((ClientContext::from_context(ctx), eps));
        }
        Ok(Wiring {
            ranks,
            clients,
            dlg,
            served,
            contexts,
            _api: PhantomData,
        })
    }

    /// What the other ranks need to connect to this one's endpoints, in a fixed layout
    /// (the same length on every rank): `served` (R × C, rank-major), then the clients'
    /// endpoints (C × R, client-major); `None` where there is no endpoint.
    pub(crate) fn infos(&self) -> Vec<Option<EndpointInfo>> {
        let mut v: Vec<_> = (self.served.iter())
            .map(|ep| ep.and_then(|ep| self.dlg.local_info(ep)))
            .collect();
        for (ctx, eps) in &self.contexts {
            ctx.with(|ctx| v.extend(eps.iter().map(|ep| ep.and_then(|ep| ctx.local_info(ep)))));
        }
        v.resize(2 * self.ranks * self.clients, None);
        v
    }

    /// Connects every endpoint of rank `rank` to its counterpart in `all` (every rank's
    /// [`Wiring::infos`]).
    pub(crate) fn connect(
        &mut self,
        rank: usize,
        all: &[Vec<Option<EndpointInfo>>],
    ) -> Result<(), String> {
        let (r, c) = (self.ranks, self.clients);
        let info = |s: usize, slot: usize| {
            all[s][slot]
                .ok_or_else(|| format!("rank {s} sent no endpoint information for this rank"))
        };
        let connect = |e: SetupError| format!("copyrpc connect: {e}");
        for (i, ep) in self.served.iter().enumerate() {
            if let Some(ep) = *ep {
                let (s, client) = (i / c, i % c);
                let remote = info(s, r * c + client * r + rank)?;
                self.dlg.connect(ep, &remote).map_err(connect)?;
            }
        }
        for (client, (ctx, eps)) in self.contexts.iter().enumerate() {
            for (s, ep) in eps.iter().enumerate() {
                if let Some(ep) = *ep {
                    let remote = info(s, rank * c + client)?;
                    ctx.with(|ctx| ctx.connect(ep, &remote)).map_err(connect)?;
                }
            }
        }
        Ok(())
    }

    /// Once connected: the delegate's context, and each client thread's remote path, a typed
    /// client per other rank on the thread's context with `qd` calls in flight at most. Client
    /// thread 0 of rank `rank` 0 gets the test hook `lose_at` (`--lose-direct-call`).
    ///
    /// # Errors
    /// A typed client refused the connected endpoint ([`Copyrpc::on`]'s checks).
    pub(crate) fn into_parts(
        self,
        rank: usize,
        qd: usize,
        lose_at: Option<u64>,
    ) -> Result<(Context<DelegToken>, Vec<Remote<A>>), String> {
        let mut remotes = Vec::with_capacity(self.contexts.len());
        for (client, (ctx, eps)) in self.contexts.into_iter().enumerate() {
            let lose = lose_at
                .filter(|_| rank == 0 && client == 0)
                .map(LoseCall::new);
            let conns = (eps.into_iter().enumerate())
                .map(|(s, ep)| {
                    ep.map(|ep| {
                        let t = Copyrpc::on(&ctx, ep, A::S::DESCRIPTOR, qd as u32)
                            .map_err(|e| format!("copyrpc client to rank {s}: {e}"))?;
                        Ok(A::from_transport(DirectCopyrpc::new(t, lose.clone())))
                    })
                    .transpose()
                })
                .collect::<Result<Vec<_>, String>>()?;
            remotes.push(Remote::Direct { conns });
        }
        Ok((self.dlg, remotes))
    }
}

/// All-gathers every rank's endpoint information ([`Wiring::infos`], the same number of
/// slots everywhere) in its fixed-size encoding; by rank, then slot.
pub(crate) fn exchange_infos<B: Bootstrap>(
    b: &B,
    mine: &[Option<EndpointInfo>],
) -> Result<Vec<Vec<Option<EndpointInfo>>>, String> {
    let mut buf = vec![0u8; mine.len() * INFO_BYTES];
    for (slot, info) in buf.chunks_exact_mut(INFO_BYTES).zip(mine) {
        if let Some(info) = info {
            slot.copy_from_slice(&info.to_bytes());
        }
    }
    let all = b.all_gather(&buf).map_err(boot)?;
    decode_infos(&all, b.size(), mine.len())
}

/// Every rank's endpoint slots from [`exchange_infos`]'s all-gather (`ranks` contributions of
/// `slots` encodings): an all-zero slot is no endpoint; any other slot must decode
/// ([`EndpointInfo::from_bytes`]), else the error names the rank and slot (issue 14: bytes
/// from other processes are checked, never trusted).
pub(crate) fn decode_infos(
    all: &[u8],
    ranks: usize,
    slots: usize,
) -> Result<Vec<Vec<Option<EndpointInfo>>>, String> {
    wire::decode_slots(all, ranks, slots, INFO_BYTES, EndpointInfo::from_bytes)
        .map_err(|e| format!("endpoint information: {e}"))
}

/// The bootstrap of a job of one rank (this thread): its collectives return at once.
pub(crate) fn solo() -> ThreadRank {
    ThreadGroup::ranks(1).pop().expect("one rank")
}

/// Longest byte string a rank may contribute to [`gather_var`] (256 MiB): a length read from
/// another rank never sizes an allocation beyond it.
pub(crate) const GATHER_MAX_BYTES: usize = 256 << 20;

/// All-gathers a byte string of any length from every rank ([`wire::gather_var`], at most
/// [`GATHER_MAX_BYTES`]); the strings by rank.
pub(crate) fn gather_var<B: Bootstrap>(b: &B, mine: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    wire::gather_var(b, mine, GATHER_MAX_BYTES).map_err(boot)
}
