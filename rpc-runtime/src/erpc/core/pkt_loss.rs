//! Loss recovery: go-back-N per slot (seeds/002 §9).
//!
//! A client slot with packets outstanding (`num_tx > num_rx`) whose answers stop arriving for
//! `rto` rolls back: the unanswered packets' credits return to the session, `num_tx` drops to
//! `num_rx`, and the slot re-sends from there (request packets or RFRs). Answers to the
//! original copies that arrive later are accepted if they are next in order and dropped as
//! duplicates otherwise, so each packet's credit comes back exactly once. Transmit descriptors
//! already in the transmit queue for the old copies are harmless: they render the same bytes.
//!
//! With pacing, the timeout counts from when the slot's last paced packet was due to leave,
//! so packets waiting for their pacing time are not mistaken for lost ones, and since
//! `handle_timeout` releases due wheel packets before it checks timeouts, a slot that rolls
//! back has nothing left in the timing wheel. The rollback still purges the slot's wheel
//! packets (a no-op then), so that the re-sent copies could never be queued behind
//! originals (invariant I1, seeds/002 §4). The reachable case, an exchange completing while
//! its re-sent copies wait in the wheel, is handled at completion (`resp.rs`).

use std::hash::Hash;

use super::sslot::SLOTS_PER_SESSION;
use super::{Rpc, SessionId, Time};

impl<A: Copy + Eq + Hash + std::fmt::Debug> Rpc<A> {
    /// Client: rolls back and re-sends every slot of `sid` whose RTO expired.
    pub(super) fn rto_timers(&mut self, now: Time, sid: SessionId) {
        for i in 0..SLOTS_PER_SESSION {
            let Some(c) =
                super::sess_mut(&mut self.sessions, sid).and_then(|s| s.role.client_mut())
            else {
                return;
            };
            let slot = &mut c.slots[i];
            if !slot.active || slot.rto_deadline.is_none_or(|d| d > now) {
                continue;
            }
            let outstanding = slot.num_tx - slot.num_rx;
            slot.rto_deadline = None;
            slot.num_tx = slot.num_rx;
            slot.paced_until = 0;
            c.credits += outstanding;
            self.stats.rollbacks += 1;
            self.stats.retransmitted_pkts += outstanding as u64;
            self.purge_slot(sid, i);
            self.kick_session(now, sid, Some(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim_tests::{Node, connect_pair};
    use super::super::{Event, MS};

    /// Every client packet is lost once: the slot rolls back after the RTO, re-sends, and
    /// the credits add up throughout.
    #[test]
    fn rollback_returns_credits_and_resends() {
        let (mut cl, mut sv, sid) = connect_pair(0);
        let mut buf = vec![0; 4096];
        let data = vec![7u8; 3 * cl.rpc.data_per_pkt()];
        cl.rpc.enqueue_request(cl.now, sid, 1, &data, 5).unwrap();
        // Lose the three request packets.
        let mut lost = 0;
        while cl.rpc.poll_transmit(&mut buf).is_some() {
            lost += 1;
        }
        assert_eq!(lost, 3);
        cl.rpc.check_invariants();
        let t = cl.rpc.next_timeout().unwrap();
        assert_eq!(t, cl.now + 5 * MS);
        cl.now = t;
        cl.rpc.handle_timeout(t);
        cl.rpc.check_invariants();
        assert_eq!(cl.rpc.stats().rollbacks, 1);
        assert_eq!(cl.rpc.stats().retransmitted_pkts, 3);
        // Now deliver everything reliably.
        Node::run_reliable(&mut cl, &mut sv, |_, d| d.to_vec());
        match cl.rpc.poll_event() {
            Some(Event::Response {
                tag: 5, data: d, ..
            }) => assert_eq!(d, data),
            e => panic!("unexpected {e:?}"),
        }
        assert_eq!(sv.rpc.stats().requests_dispatched, 1);
        cl.rpc.check_invariants();
        let _ = &mut sv;
    }
}
