//! Timely congestion control (Mittal et al., SIGCOMM 2015) as eRPC uses it (seeds/000 §6,
//! seeds/002 §6.3).
//!
//! Each client session keeps a sending rate in bits per second, updated from RTT samples
//! (in microseconds) of its packets:
//!
//! - `rtt < T_LOW` (50 µs): additive increase, `rate += ADD_RATE`;
//! - `rtt > T_HIGH` (1000 µs): multiplicative decrease,
//!   `rate *= 1 - BETA * (1 - T_HIGH / rtt)`;
//! - otherwise the gradient mode: the RTT difference to the previous sample is smoothed by an
//!   EWMA (`avg = (1 - ALPHA) * avg + ALPHA * diff`) and normalized by the minimum RTT
//!   ([`Timely::min_rtt_us`]). A
//!   gradient `<= 0` adds `N * ADD_RATE` (`N` = 5 once [`HAI_THRESHOLD`] consecutive
//!   gradient-mode samples had a non-positive gradient, the paper's hyperactive increase,
//!   else 1); a positive gradient multiplies by `1 - BETA * gradient`.
//!
//! The result is clamped to `[MIN_RATE, link bandwidth]`. As in eRPC's implementation, every
//! step is scaled by the time since the previous update in units of the minimum RTT, capped
//! at 1, so a burst of per-packet samples moves the rate about as much as one sample per RTT
//! would (the first update uses the full step).
//!
//! **The minimum RTT is measured.** The Timely paper normalizes the gradient by the path's
//! propagation RTT (`minRTT`), a property of the network; eRPC hard-codes 2 µs for its
//! clusters ([`MIN_RTT_US`]). Here each session takes the smallest round trip it has
//! observed ([`Timely::observe_rtt`], fed every sample, bypassed ones included; the eRPC core
//! feeds it the full round trip from the packet's hand-out, while the samples it gives
//! [`Timely::update`] exclude the sender's serialization delay), never below
//! [`MIN_RTT_US`]: on a 2 µs fabric the result is eRPC's, and on a path whose floor is
//! 20-30 µs (UDP loopback on a VM) a 50 µs blip is a gradient of about 1, not 25, so one
//! delayed sample no longer sends the session to [`MIN_RATE_BPS`].
//!
//! eRPC's bypasses (seeds/002 §6.3): a session whose rate is at link bandwidth is
//! *uncongested* ([`Timely::is_uncongested`]); its packets skip the rate limiter, and a sample
//! below `T_LOW` on an uncongested session skips the update entirely (it could only add to a
//! rate that is already at the clamp). RTT timestamps are taken once per event-loop batch by
//! the caller, hence the explicit `now_ns` argument.

/// Lowest rate: 15 Mbps (bits per second).
pub const MIN_RATE_BPS: f64 = 15e6;
/// Additive increase step: 5 Mbps.
pub const ADD_RATE_BPS: f64 = 5e6;
/// Multiplicative decrease factor.
pub const BETA: f64 = 0.8;
/// Below this RTT (µs) the rate grows additively; also eRPC's bypass threshold.
pub const T_LOW_US: f64 = 50.0;
/// Above this RTT (µs) the rate drops multiplicatively.
pub const T_HIGH_US: f64 = 1000.0;
/// EWMA weight of a new RTT difference.
pub const EWMA_ALPHA: f64 = 0.02;
/// Floor of the minimum (propagation) RTT in µs, and its value before any sample: eRPC's
/// assumed minimum RTT. The one in use is measured ([`Timely::min_rtt_us`]).
pub const MIN_RTT_US: f64 = 2.0;
/// Consecutive non-positive gradients after which increases are 5× (hyperactive increase).
pub const HAI_THRESHOLD: u32 = 5;

/// Timely rate state of one session.
#[derive(Debug, Clone)]
pub struct Timely {
    link_bw_bps: f64,
    rate_bps: f64,
    prev_rtt_us: Option<f64>,
    avg_rtt_diff_us: f64,
    neg_gradient_count: u32,
    last_update_ns: Option<u64>,
    /// Smallest RTT observed, µs (`INFINITY` before the first sample).
    observed_min_rtt_us: f64,
}

impl Timely {
    /// Starts uncongested at `link_bw_bps` (bits per second).
    ///
    /// # Panics
    /// If `link_bw_bps` is not finite or below [`MIN_RATE_BPS`].
    pub fn new(link_bw_bps: f64) -> Timely {
        assert!(
            link_bw_bps.is_finite() && link_bw_bps >= MIN_RATE_BPS,
            "link bandwidth {link_bw_bps} bps must be finite and >= {MIN_RATE_BPS}"
        );
        Timely {
            link_bw_bps,
            rate_bps: link_bw_bps,
            prev_rtt_us: None,
            avg_rtt_diff_us: 0.0,
            neg_gradient_count: 0,
            last_update_ns: None,
            observed_min_rtt_us: f64::INFINITY,
        }
    }

    /// Current rate in bits per second.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.rate_bps
    }

    /// Link bandwidth in bits per second.
    #[inline]
    pub fn link_bw(&self) -> f64 {
        self.link_bw_bps
    }

    /// Records an RTT sample (µs) for the minimum-RTT estimate; ignores a sample that is not
    /// finite or negative. Call it for every sample, including those [`Timely::update`]
    /// bypasses.
    #[inline]
    pub fn observe_rtt(&mut self, sample_rtt_us: f64) {
        if sample_rtt_us.is_finite() && sample_rtt_us >= 0.0 {
            self.observed_min_rtt_us = self.observed_min_rtt_us.min(sample_rtt_us);
        }
    }

    /// The minimum RTT in µs that normalizes the gradient and scales steps: the smallest
    /// observed sample, at least [`MIN_RTT_US`] (which it is before any sample).
    #[inline]
    pub fn min_rtt_us(&self) -> f64 {
        if self.observed_min_rtt_us.is_finite() {
            self.observed_min_rtt_us.max(MIN_RTT_US)
        } else {
            MIN_RTT_US
        }
    }

    /// Whether the rate is at link bandwidth: packets need no pacing.
    #[inline]
    pub fn is_uncongested(&self) -> bool {
        self.rate_bps >= self.link_bw_bps
    }

    /// Time in ns that `bytes` take on the wire at the current rate (the pacing gap to the
    /// next packet).
    #[inline]
    pub fn tx_time_ns(&self, bytes: usize) -> f64 {
        bytes as f64 * 8.0 * 1e9 / self.rate_bps
    }

    /// Feeds one RTT sample (µs) taken at `now_ns` (a monotonic clock in ns). Returns
    /// whether the state changed: false for the uncongested bypass and for samples that are
    /// negative or not finite (ignored).
    pub fn update(&mut self, sample_rtt_us: f64, now_ns: u64) -> bool {
        if !(sample_rtt_us.is_finite() && sample_rtt_us >= 0.0) {
            return false;
        }
        if self.is_uncongested() && sample_rtt_us < T_LOW_US {
            return false;
        }
        let min_rtt_us = self.min_rtt_us();
        let delta_factor = match self.last_update_ns {
            None => 1.0,
            Some(prev) => (now_ns.saturating_sub(prev) as f64 / (min_rtt_us * 1e3)).min(1.0),
        };
        self.last_update_ns = Some(now_ns);

        let rtt_diff = sample_rtt_us - self.prev_rtt_us.unwrap_or(sample_rtt_us);
        self.prev_rtt_us = Some(sample_rtt_us);
        self.avg_rtt_diff_us = (1.0 - EWMA_ALPHA) * self.avg_rtt_diff_us + EWMA_ALPHA * rtt_diff;

        let rate = self.rate_bps;
        let new_rate = if sample_rtt_us < T_LOW_US {
            self.neg_gradient_count = 0;
            rate + ADD_RATE_BPS * delta_factor
        } else if sample_rtt_us > T_HIGH_US {
            self.neg_gradient_count = 0;
            rate * (1.0 - BETA * delta_factor * (1.0 - T_HIGH_US / sample_rtt_us))
        } else {
            let gradient = self.avg_rtt_diff_us / min_rtt_us;
            if gradient <= 0.0 {
                self.neg_gradient_count += 1;
                let n = if self.neg_gradient_count >= HAI_THRESHOLD {
                    5.0
                } else {
                    1.0
                };
                rate + n * ADD_RATE_BPS * delta_factor
            } else {
                self.neg_gradient_count = 0;
                rate * (1.0 - BETA * gradient * delta_factor)
            }
        };
        self.rate_bps = new_rate.clamp(MIN_RATE_BPS, self.link_bw_bps);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: f64 = 10e9;
    /// Spacing that gives full steps (>= MIN_RTT).
    const STEP_NS: u64 = 10_000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn starts_uncongested_and_bypasses_low_rtt() {
        let mut t = Timely::new(LINK);
        assert!(t.is_uncongested());
        assert_eq!(t.rate(), LINK);
        assert!(!t.update(10.0, 0));
        assert_eq!(t.rate(), LINK);
        assert!(!t.update(f64::NAN, 0));
        assert!(!t.update(-1.0, 0));
    }

    #[test]
    fn min_rtt_is_measured_with_the_erpc_value_as_floor() {
        let mut t = Timely::new(LINK);
        assert_eq!(t.min_rtt_us(), MIN_RTT_US);
        t.observe_rtt(f64::NAN);
        t.observe_rtt(-3.0);
        assert_eq!(t.min_rtt_us(), MIN_RTT_US);
        t.observe_rtt(40.0);
        t.observe_rtt(30.0);
        t.observe_rtt(35.0);
        assert_eq!(t.min_rtt_us(), 30.0);
        t.observe_rtt(0.5);
        assert_eq!(t.min_rtt_us(), MIN_RTT_US, "never below eRPC's 2 us");
    }

    /// The same rising RTTs cut the rate far less when the path's measured minimum RTT is
    /// 30 µs than with the assumed 2 µs: the gradient is the smoothed RTT increase over the
    /// minimum RTT (and steps are scaled in units of it).
    #[test]
    fn gradient_is_normalized_by_the_measured_min_rtt() {
        let run = |min_rtt: Option<f64>| {
            let mut t = Timely::new(LINK);
            if let Some(m) = min_rtt {
                t.observe_rtt(m);
            }
            // RTTs above T_LOW update even an uncongested session; they rise by 50 µs per
            // sample, one sample per millisecond (full steps).
            for (i, rtt) in [100.0, 150.0, 200.0, 250.0, 300.0].into_iter().enumerate() {
                t.update(rtt, i as u64 * 1_000_000);
            }
            t.rate() / LINK
        };
        let assumed = run(None);
        let measured = run(Some(30.0));
        assert_eq!(assumed, MIN_RATE_BPS / LINK, "2 us: down to the floor");
        assert!(
            measured > 0.5,
            "30 us: a moderate cut, kept {measured} of the link rate"
        );
    }

    #[test]
    fn multiplicative_decrease_above_t_high() {
        let mut t = Timely::new(LINK);
        assert!(t.update(2000.0, 0));
        // 1 - 0.8 * (1 - 1000 / 2000) = 0.6
        assert!(close(t.rate(), 0.6 * LINK), "{}", t.rate());
        assert!(!t.is_uncongested());
        assert!(t.update(4000.0, STEP_NS));
        // 1 - 0.8 * (1 - 1000 / 4000) = 0.4
        assert!(close(t.rate(), 0.6 * 0.4 * LINK), "{}", t.rate());
    }

    #[test]
    fn additive_increase_below_t_low() {
        let mut t = Timely::new(LINK);
        t.update(2000.0, 0);
        let r = t.rate();
        assert!(t.update(10.0, STEP_NS));
        assert!(close(t.rate(), r + ADD_RATE_BPS));
        assert!(t.update(10.0, 2 * STEP_NS));
        assert!(close(t.rate(), r + 2.0 * ADD_RATE_BPS));
    }

    #[test]
    fn steps_scale_with_time_since_last_update() {
        let mut t = Timely::new(LINK);
        t.update(2000.0, 0);
        let r = t.rate();
        // 1 µs after the previous update = half of MIN_RTT: half a step.
        t.update(10.0, 1_000);
        assert!(close(t.rate(), r + 0.5 * ADD_RATE_BPS));
        // Same timestamp: no change.
        t.update(10.0, 1_000);
        assert!(close(t.rate(), r + 0.5 * ADD_RATE_BPS));
    }

    #[test]
    fn clamps_at_min_rate_and_link_bandwidth() {
        let mut t = Timely::new(LINK);
        for i in 0..200 {
            t.update(100_000.0, i * STEP_NS);
        }
        assert_eq!(t.rate(), MIN_RATE_BPS);
        let mut t = Timely::new(20e6);
        t.update(2000.0, 0);
        assert!(close(t.rate(), 12e6_f64.max(MIN_RATE_BPS)));
        for i in 1..10 {
            t.update(10.0, i * STEP_NS);
        }
        assert_eq!(t.rate(), 20e6);
        assert!(t.is_uncongested());
        // Uncongested again: low samples are bypassed.
        assert!(!t.update(10.0, 100 * STEP_NS));
    }

    #[test]
    fn gradient_decrease_between_thresholds() {
        let mut t = Timely::new(LINK);
        // First sample: difference 0, gradient 0 -> increase, clamped at link bandwidth.
        assert!(t.update(500.0, 0));
        assert_eq!(t.rate(), LINK);
        // diff 100 -> avg = 0.02 * 100 = 2 -> gradient 2 / 2 = 1 -> rate *= 1 - 0.8.
        t.update(600.0, STEP_NS);
        assert!(close(t.rate(), 0.2 * LINK), "{}", t.rate());
        // diff 0 -> avg = 0.98 * 2 = 1.96 -> gradient 0.98 -> rate *= 1 - 0.784.
        t.update(600.0, 2 * STEP_NS);
        assert!(close(t.rate(), 0.2 * 0.216 * LINK), "{}", t.rate());
        // diff -500 -> avg = 1.9208 - 10 < 0 -> additive increase.
        let r = t.rate();
        t.update(100.0, 3 * STEP_NS);
        assert!(close(t.rate(), r + ADD_RATE_BPS));
    }

    #[test]
    fn gradient_hyperactive_increase() {
        let mut t = Timely::new(LINK);
        t.update(2000.0, 0);
        let r = t.rate();
        // Falling RTTs inside [T_LOW, T_HIGH]: six non-positive gradients in a row; the
        // fifth and sixth use 5 * ADD_RATE.
        for (i, rtt) in [900.0, 800.0, 700.0, 600.0, 500.0, 400.0]
            .into_iter()
            .enumerate()
        {
            t.update(rtt, (i as u64 + 1) * STEP_NS);
        }
        assert!(close(t.rate(), r + 14.0 * ADD_RATE_BPS), "{}", t.rate());
    }

    #[test]
    fn tx_time_follows_rate() {
        let t = Timely::new(8e9);
        assert!(close(t.tx_time_ns(1000), 1000.0));
    }

    #[test]
    #[should_panic(expected = "link bandwidth")]
    fn rejects_tiny_link() {
        Timely::new(1e6);
    }
}
