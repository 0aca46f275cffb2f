//! Congestion control wired into the client datapath: Timely rate updates from RTT samples
//! and Carousel pacing through the timing wheel, with eRPC's bypasses (seeds/000 §6, §12.3,
//! §12.7, §12.8; seeds/002 §6.3).
//!
//! - **Sending** (`queue_client_pkt`, called by `kick_slot` for every request packet and RFR
//!   that got a credit): eRPC's `kick_req_st` bypass decision (seeds/000 §12.3). With pacing
//!   on, a packet goes straight to the transmit queue only if its session is uncongested and
//!   its slot has nothing in the wheel (eRPC's `can_bypass_wheel`: the slot check keeps the
//!   slot's packets in order); otherwise it is filed in the wheel at
//!   `t = max(now, next_tx_at)` and the session's `next_tx_at` moves to `t` plus the packet's
//!   wire time at the session's rate.
//! - **Releasing** (`release_wheel`, from `poll_transmit_at` and `handle_timeout`): due
//!   entries move to the transmit queue in time order; the slot's retransmission deadline is
//!   pushed to at least `now + rto` because the packet only now leaves.
//! - **Sampling** (`cc_sample`, on every accepted CR or response packet): the RTT is the time
//!   since packet `pkt_num` left this endpoint's link (`tx_ts`, stamped by `stamp_tx`): the
//!   time `poll_transmit_at` handed it out, plus the time the link (at `link_bandwidth_bps`)
//!   needs for the packets handed out before it that it has not yet finished, plus its own
//!   wire time (`link_departure`). This is the Timely paper's RTT (§4.1: completion time
//!   minus send time minus the segment's serialization delay at line rate), applied to a
//!   burst: a window of eight 64 KB packets handed out at once takes 168 µs to serialize at
//!   25 Gbit/s, and without the subtraction its last packet's sample would report that
//!   self-inflicted delay as queueing in the network. The samples of one receive burst
//!   (same `now`) are one completion event, whose RTT is their smallest
//!   ([`Timely::sample`](crate::erpc::timely::Timely::sample)); uncongested sessions skip
//!   events below `T_LOW` (Timely bypass), others update the rate. Two kinds of
//!   answers give no sample, as in the Timely paper (Mittal et al. 2015, §3-4: RTTs from
//!   NIC-generated acknowledgements, of packets sent once): the answer to a retransmitted
//!   packet (Karn's rule: it may answer an earlier copy, `rtt_skipped_retransmit`), and, in
//!   an exchange of more than one packet either way, the answer to the request's last packet
//!   (response packet 0, sent only after the server's handler ran, so it includes handler
//!   time: `rtt_skipped_server_time`); such an exchange is sampled by its CRs and RFR
//!   answers, which the server's event loop sends at once. A single-packet request with a
//!   single-packet response has no other sample and keeps eRPC's (handler time included).
//!   The mirror image on the client, time its own event loop did not run, is cut off too:
//!   a sample ends at the last receive poll that found nothing waiting after the packet
//!   left ([`Rpc::note_rx_drained`]; the answer arrived after it), not when the answer was
//!   handled, so a client thread descheduled for milliseconds, or an application that polls
//!   late, does not read as congestion (`rtt_bounded_by_poll`; Timely timestamps the
//!   answer's arrival at the NIC, which this bound approaches). Every sample also feeds
//!   the session's measured minimum RTT
//!   ([`Timely::observe_rtt`](crate::erpc::timely::Timely::observe_rtt)), which normalizes
//!   Timely's gradient in place of the seed's assumed 2 µs. Last, the sample passes the
//!   session's RTT filter ([`crate::erpc::rtt_filter`], `Config::cc_rtt_filter_events`,
//!   default 4): Timely gets the smallest sample of the current completion event and the
//!   three before it, so that a server thread descheduled for a few milliseconds (it
//!   answers one event late) does not read as congestion, while queueing that lasts gets
//!   through three events late.
//! - **Purging** (`purge_wheel`): go-back-N, completion of an exchange that still has
//!   retransmitted copies queued, and session teardown remove the slot's / session's
//!   entries, so nothing of a finished or rolled-back exchange stays queued (invariant I1,
//!   seeds/002 §4; eRPC instead drops responses while such copies are queued, seeds/002 §8.1
//!   / Appendix C).
//!
//! **On a shared or virtual machine.** The seed's constants (15 Mbit/s floor, 5 Mbit/s
//! additive increase per sample, `T_LOW` 50 µs) assume a datacenter fabric whose RTT samples
//! are stable (the minimum RTT is measured instead of assumed, see Sampling). Over loopback on an oversubscribed
//! VM, one sample inflated by a descheduled thread can throw a session's rate to the floor,
//! from which it climbs back 5 Mbit/s per sample, and its packets are paced meanwhile
//! (measured: 70-78% of QD-1 echo packets and nearly all large-message packets through the
//! wheel; large-message goodput 1.5-12x lower). `Config::cc_rate_comp` and
//! `Config::cc_pacing` switch it off where that matters more than eRPC fidelity.

use std::hash::Hash;

use super::session::ClientSession;
use super::sslot::{NO_TS, SLOTS_PER_SESSION, TxStamp, pkt_range, slot_of};
use super::{Rpc, SessionId, Time, Tx};
use crate::erpc::pkthdr::PKTHDR_SIZE;
use crate::erpc::timely::Sample;
use crate::erpc::wheel::TimingWheel;
use crate::fifo::Fifo;

/// Width of a timing-wheel slot in ns (4 µs). eRPC uses 0.5 µs (seeds/000 §12.7); here the
/// width is only a bucketing granularity, because a reap compares each entry's exact time,
/// so wider slots cost no pacing precision, only a sort of a few more entries per slot.
pub const WHEEL_SLOT_WIDTH_NS: Time = 4_000;
/// Number of timing-wheel slots: an 8.192 ms horizon, which covers a full window of 8
/// maximal (4 KiB) packets of one session at 15 Mbit/s only partly; later packets are parked
/// and re-filed, never released early (eRPC covers about 1 s with 2 million slots). The
/// wheel (16 KiB of slot heads plus a node pool that grows to the most packets ever paced
/// at once) is created with the endpoint when `cc_pacing` is on.
pub const WHEEL_NUM_SLOTS: usize = 2048;
/// A gap in ns between the last drained receive poll and the handling of an answer beyond
/// which [`Stats::rtt_bounded_by_poll`](super::Stats::rtt_bounded_by_poll) counts the
/// sample (10 µs: far more than one iteration of a spinning event loop).
const POLL_GAP_NS: Time = 10_000;

/// Paced packets the wheel has room for before its pool first grows.
pub(super) const WHEEL_INITIAL_ENTRIES: usize = 64;

/// A paced client packet: packet `pkt` (request packet if below the request's packet count,
/// else RFR) of request `req_num` on client session `session`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WheelEnt {
    pub session: SessionId,
    pub generation: u64,
    pub req_num: u64,
    pub pkt: u32,
}

/// The parts of an [`Rpc`] that queueing a client packet touches, borrowed apart from the
/// session table, so that a kick (`Rpc::kick_session` in `req.rs`) looks its session up once
/// and then works on the borrowed session and these together.
pub(super) struct ClientTxq<'a, A> {
    pub cfg: &'a super::Config,
    pub data_per_pkt: usize,
    pub stats: &'a mut super::Stats,
    pub txq: &'a mut Fifo<Tx<A>>,
    pub wheel: &'a mut Option<TimingWheel<WheelEnt>>,
    pub wheel_out: &'a mut Vec<WheelEnt>,
    /// `Rpc::timer_lb`, lowered by `arm`.
    pub timer_lb: &'a mut Time,
    /// The session kicked, and its generation.
    pub sid: SessionId,
    pub generation: u64,
}

impl<A: Copy> ClientTxq<'_, A> {
    /// Lowers the timer bound to cover a deadline at `t` (`Rpc::arm`).
    #[inline]
    pub(super) fn arm(&mut self, t: Time) {
        *self.timer_lb = (*self.timer_lb).min(t);
    }

    /// Client: queues packet `pkt` of slot `i` of the session `c` (session `self.sid`),
    /// either directly or through the wheel (see the module docs). The caller has already
    /// taken the packet's credit. Returns the time the packet is due to leave (`now` when
    /// direct). The packet's size on the wire is only computed when it is paced.
    #[inline]
    pub(super) fn queue_client_pkt(
        &mut self,
        now: Time,
        c: &mut ClientSession,
        i: usize,
        pkt: usize,
    ) -> Time {
        let pacing = self.cfg.cc_pacing;
        let (sid, generation) = (self.sid, self.generation);
        let slot = &mut c.slots[i];
        let req_num = slot.req_num;
        let is_req = pkt < slot.num_req_pkts;
        if !pacing || (c.timely.is_uncongested() && slot.in_wheel == 0) {
            if pacing {
                self.stats.wheel_bypassed += 1;
            }
            let tx = if is_req {
                Tx::ReqPkt {
                    session: sid,
                    generation,
                    req_num,
                    pkt,
                }
            } else {
                Tx::Rfr {
                    session: sid,
                    generation,
                    req_num,
                    pkt,
                }
            };
            self.txq.push_back(tx);
            return now;
        }
        self.queue_paced(now, c, i, pkt)
    }

    /// The paced branch of [`queue_client_pkt`](Self::queue_client_pkt): files packet `pkt`
    /// of slot `i` in the timing wheel and returns its due time. Out of line, so that the
    /// direct branch (every packet of an uncongested session) stays small where it is
    /// inlined.
    #[inline(never)]
    fn queue_paced(&mut self, now: Time, c: &mut ClientSession, i: usize, pkt: usize) -> Time {
        let (sid, generation) = (self.sid, self.generation);
        let slot = &mut c.slots[i];
        let req_num = slot.req_num;
        let is_req = pkt < slot.num_req_pkts;
        // Bytes on the wire: header plus the packet's share of the request (an RFR is a
        // header alone).
        let bytes = if is_req {
            PKTHDR_SIZE + pkt_range(slot.req_len(), self.data_per_pkt, pkt).len()
        } else {
            PKTHDR_SIZE
        };
        let t = now.max(c.next_tx_at);
        c.next_tx_at = t.saturating_add(c.timely.tx_time_ns(bytes).ceil() as Time);
        slot.in_wheel += 1;
        slot.paced_until = slot.paced_until.max(t);
        let Some(wheel) = self.wheel.as_mut() else {
            return now; // unreachable: the wheel exists when pacing is on
        };
        if wheel.is_empty() {
            // Turn an idle wheel to now (O(1) when empty) so the entry is filed in its own
            // slot rather than parked behind a stale current slot.
            wheel.reap(now, self.wheel_out);
        }
        wheel.insert(
            WheelEnt {
                session: sid,
                generation,
                req_num,
                pkt: pkt as u32,
            },
            t,
        );
        self.stats.wheel_paced += 1;
        self.arm(t);
        t
    }
}

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Moves the wheel's packets due at `now` to the transmit queue. Called on every
    /// transmit poll and timer run: the test for due packets inlines (two loads with pacing
    /// off or an empty wheel), the release does not.
    #[inline(always)]
    pub(super) fn release_wheel(&mut self, now: Time) {
        if let Some(w) = &self.wheel
            && w.next_due().is_some_and(|t| t <= now)
        {
            self.release_due(now);
        }
    }

    /// The release of [`Rpc::release_wheel`], with packets due.
    #[inline(never)]
    fn release_due(&mut self, now: Time) {
        let Some(w) = self.wheel.as_mut() else { return };
        let mut out = std::mem::take(&mut self.wheel_out);
        w.reap(now, &mut out);
        let rto = self.cfg.rto;
        for e in out.drain(..) {
            let Some(s) = super::sess_mut(&mut self.sessions, e.session)
                .filter(|s| s.generation == e.generation)
            else {
                continue;
            };
            let Some(c) = s.role.client_mut() else {
                continue;
            };
            let slot = &mut c.slots[slot_of(e.req_num)];
            if !slot.active || slot.req_num != e.req_num {
                continue;
            }
            slot.in_wheel -= 1;
            if let Some(d) = slot.rto_deadline {
                slot.rto_deadline = Some(d.max(now + rto));
            }
            let pkt = e.pkt as usize;
            self.txq.push_back(if pkt < slot.num_req_pkts {
                Tx::ReqPkt {
                    session: e.session,
                    generation: e.generation,
                    req_num: e.req_num,
                    pkt,
                }
            } else {
                Tx::Rfr {
                    session: e.session,
                    generation: e.generation,
                    req_num: e.req_num,
                    pkt,
                }
            });
        }
        self.wheel_out = out;
    }

    /// Removes the wheel entries matching `pred`; returns how many.
    pub(super) fn purge_wheel(&mut self, pred: impl FnMut(&WheelEnt) -> bool) -> usize {
        let n = self.wheel.as_mut().map_or(0, |w| w.purge(pred));
        self.stats.wheel_purged += n as u64;
        n
    }

    /// Client: removes the queued wheel packets of slot `i` of `sid` (its current exchange).
    pub(super) fn purge_slot(&mut self, sid: SessionId, i: usize) {
        let Some(s) = super::sess_mut(&mut self.sessions, sid) else {
            return;
        };
        let generation = s.generation;
        let Some(c) = s.role.client_mut() else { return };
        let slot = &mut c.slots[i];
        if slot.in_wheel == 0 {
            return;
        }
        let req_num = slot.req_num;
        slot.in_wheel = 0;
        self.purge_wheel(|e| {
            e.session == sid && e.generation == generation && e.req_num == req_num
        });
    }

    /// The time a datagram of `bytes` handed out at `now` has left this endpoint's link: it
    /// starts once the link has serialized everything handed out before it (at
    /// [`Config::link_bandwidth_bps`](super::Config::link_bandwidth_bps)) and takes its own
    /// wire time. RTT samples count from this departure, so they exclude the serialization
    /// delay of the packet and of the burst ahead of it (Timely, Mittal et al. 2015, §4.1:
    /// the RTT is the completion time minus the send time minus the segment's serialization
    /// delay at line rate; see the module docs, "Sampling").
    #[inline]
    pub(super) fn link_departure(&mut self, now: Time, bytes: usize) -> Time {
        let wire_ns = (bytes as u64).saturating_mul(self.link_ps_per_byte) / 1000;
        let departed = now.max(self.link_free_at).saturating_add(wire_ns);
        self.link_free_at = departed;
        departed
    }

    /// Records when a client packet was handed out (`now`) and left the link (`departed`,
    /// from [`Rpc::link_departure`]), for RTT samples.
    pub(super) fn stamp_tx(&mut self, now: Time, departed: Time, tx: Tx<A>) {
        let (Tx::ReqPkt {
            session,
            generation,
            req_num,
            pkt,
        }
        | Tx::Rfr {
            session,
            generation,
            req_num,
            pkt,
        }) = tx
        else {
            return;
        };
        let Some(c) = super::sess_mut(&mut self.sessions, session)
            .filter(|s| s.generation == generation)
            .and_then(|s| s.role.client_mut())
        else {
            return;
        };
        let slot = &mut c.slots[slot_of(req_num)];
        // Only packets still awaiting their answer (not stale copies of answered ones).
        if slot.req_num == req_num && pkt >= slot.num_rx && pkt < slot.num_tx {
            let n = slot.tx_ts.len();
            // Karn's rule: the answer to a retransmitted packet may answer any of its copies,
            // so its RTT is unknown and it gives no sample.
            slot.tx_ts[pkt % n] = if pkt < slot.tx_high {
                NO_TS
            } else {
                TxStamp {
                    handed_out: now,
                    departed,
                }
            };
            slot.tx_high = slot.tx_high.max(pkt + 1);
        }
    }

    /// Client: an answer to packet `pkt` of slot `i` of `sid` was accepted at `now`: feeds
    /// the RTT sample to the session's Timely state (with the uncongested bypass).
    /// The test of `cc_rate_comp` inlines into the caller; the sample itself does not.
    #[inline(always)]
    pub(super) fn cc_sample(&mut self, now: Time, sid: SessionId, i: usize, pkt: usize) {
        if self.cfg.cc_rate_comp {
            self.cc_sample_rate(now, sid, i, pkt);
        }
    }

    /// [`Rpc::cc_sample`] with rate computation on.
    #[inline(never)]
    fn cc_sample_rate(&mut self, now: Time, sid: SessionId, i: usize, pkt: usize) {
        debug_assert!(i < SLOTS_PER_SESSION);
        let Some(c) = super::sess_mut(&mut self.sessions, sid).and_then(|s| s.role.client_mut())
        else {
            return;
        };
        let slot = &c.slots[i];
        // The last request packet is answered by response packet 0, which the server sends
        // only after the handler ran: that time is not the network's (Timely samples
        // NIC-generated acknowledgements, which carry no handler time). Skipped when the
        // exchange has other samples (CRs of a multi-packet request, RFR answers of a
        // multi-packet response); a single-packet exchange keeps it, as eRPC does, since it
        // is its only sample (response packet 0 has arrived, so `num_resp_pkts` is known).
        if pkt + 1 == slot.num_req_pkts && (slot.num_req_pkts > 1 || slot.num_resp_pkts > 1) {
            self.stats.rtt_skipped_server_time += 1;
            return;
        }
        let sent = slot.tx_ts[pkt % slot.tx_ts.len()];
        if sent == NO_TS {
            self.stats.rtt_skipped_retransmit += 1;
            return;
        }
        // The sample counts from the packet's departure; an answer before it (a path faster
        // than the configured link rate) is a sample of no queueing at all. The minimum RTT
        // that normalizes the gradient is the smallest full round trip (from the hand-out),
        // which a path faster than the link model cannot drive to zero.
        // The answer arrived after the last drained receive poll, if that followed the
        // departure: the sample ends there, not when this endpoint got round to handling
        // it (within an iteration of each other while the event loop spins).
        let end = if self.rx_drained_at > sent.departed && self.rx_drained_at < now {
            if now - self.rx_drained_at > POLL_GAP_NS {
                self.stats.rtt_bounded_by_poll += 1;
            }
            self.rx_drained_at
        } else {
            now
        };
        let rtt_us = end.saturating_sub(sent.departed) as f64 / 1e3;
        self.stats.rtt_samples += 1;
        c.timely
            .observe_rtt(now.saturating_sub(sent.handed_out) as f64 / 1e3);
        let rtt_us = c.rtt_filter.filter(rtt_us, now);
        match c.timely.sample(rtt_us, now) {
            Sample::Updated => self.stats.timely_updates += 1,
            Sample::Bypassed => self.stats.timely_bypassed += 1,
            Sample::Invalid => {}
        }
    }
}
