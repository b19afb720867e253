//! Self-preservation, as Eureka's servers have it: when far fewer renewals arrive than the
//! registered instances should send, the likely cause is that the registry lost touch with
//! its clients (a network partition, an overloaded host), not that they all died; evicting
//! them would take the whole mesh down. So lease eviction stops until renewals recover.
//!
//! Plain state, fed with the time: [`SelfPreservation::renewed`] counts each renewal, and
//! [`SelfPreservation::allows_eviction`] compares the renewals of the last `window` with
//! those expected from the registered instances (each renews every `renewalIntervalInSecs`,
//! and none is expected to have renewed before it registered).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// When self-preservation engages.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreservationConfig {
    /// Eviction stops when the renewals of the last window fall below this share of those
    /// expected (Eureka's `renewalPercentThreshold`, 0.85). 0 turns self-preservation off.
    pub threshold: f64,
    /// The window renewals are counted over (Eureka: one minute).
    pub window: Duration,
    /// Below this many registered instances, self-preservation never engages: one instance
    /// that dies is already a large share of renewals, and cannot be told from a partition.
    pub min_instances: usize,
}

impl Default for PreservationConfig {
    /// 0.85 over one minute, from 10 instances.
    fn default() -> PreservationConfig {
        PreservationConfig {
            threshold: 0.85,
            window: Duration::from_secs(60),
            min_instances: 10,
        }
    }
}

/// Renewals counted per second over the window, and whether eviction is on.
#[derive(Debug)]
pub struct SelfPreservation {
    config: PreservationConfig,
    /// (second, renewals in it), oldest first; seconds counted from `origin`.
    buckets: VecDeque<(u64, u64)>,
    origin: Instant,
    engaged: bool,
}

/// Whether eviction may go on, and the figures that decided it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub allows_eviction: bool,
    /// Renewals within the window.
    pub renewals: u64,
    /// Renewals expected within the window.
    pub expected: f64,
    /// Whether this verdict changed self-preservation's state (engaged or released).
    pub changed: bool,
}

impl SelfPreservation {
    /// Counting from `now`.
    pub fn new(config: PreservationConfig, now: Instant) -> SelfPreservation {
        SelfPreservation {
            config,
            buckets: VecDeque::new(),
            origin: now,
            engaged: false,
        }
    }

    /// Counts one renewal at `now`.
    pub fn renewed(&mut self, now: Instant) {
        let second = now.saturating_duration_since(self.origin).as_secs();
        match self.buckets.back_mut() {
            Some((s, n)) if *s == second => *n += 1,
            _ => self.buckets.push_back((second, 1)),
        }
        self.prune(now);
    }

    /// Renewals counted within the window before `now`.
    pub fn renewals(&mut self, now: Instant) -> u64 {
        self.prune(now);
        self.buckets.iter().map(|(_, n)| n).sum()
    }

    fn prune(&mut self, now: Instant) {
        let second = now.saturating_duration_since(self.origin).as_secs();
        let window = self.config.window.as_secs().max(1);
        while self
            .buckets
            .front()
            .is_some_and(|(s, _)| s + window <= second)
        {
            self.buckets.pop_front();
        }
    }

    /// Whether leases may be evicted now, given the registered instances as
    /// `(registered at, renewal interval)`.
    pub fn allows_eviction(
        &mut self,
        now: Instant,
        instances: impl IntoIterator<Item = (Instant, Duration)>,
    ) -> Verdict {
        let window = self.config.window;
        let (mut count, mut expected) = (0usize, 0f64);
        for (registered, interval) in instances {
            count += 1;
            let age = now.saturating_duration_since(registered).min(window);
            expected += age.as_secs_f64() / interval.as_secs_f64().max(1.0);
        }
        let renewals = self.renewals(now);
        let engaged = self.config.threshold > 0.0
            && count >= self.config.min_instances
            && (renewals as f64) < self.config.threshold * expected;
        let changed = engaged != self.engaged;
        self.engaged = engaged;
        Verdict {
            allows_eviction: !engaged,
            renewals,
            expected,
            changed,
        }
    }

    /// Whether self-preservation is engaged (as of the last verdict).
    pub fn is_engaged(&self) -> bool {
        self.engaged
    }

    /// How many of `registered` instances one eviction round may take: Eureka's bound, the
    /// share above the threshold (15 % by default), at least one. Leases expire together
    /// when something is wrong with the registry, rarely when their instances die.
    pub fn eviction_limit(&self, registered: usize) -> usize {
        if self.config.threshold <= 0.0 {
            return registered;
        }
        let keep = (registered as f64 * self.config.threshold).floor() as usize;
        registered.saturating_sub(keep).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn config() -> PreservationConfig {
        PreservationConfig {
            threshold: 0.85,
            window: Duration::from_secs(10),
            min_instances: 3,
        }
    }

    /// `n` instances registered at `at`, renewing every second.
    fn fleet(n: usize, at: Instant) -> Vec<(Instant, Duration)> {
        vec![(at, SEC); n]
    }

    #[test]
    fn eviction_goes_on_while_renewals_arrive_as_expected() {
        let t0 = Instant::now();
        let mut sp = SelfPreservation::new(config(), t0);
        for s in 1..=20u64 {
            for _ in 0..10 {
                sp.renewed(t0 + SEC * s as u32);
            }
        }
        let v = sp.allows_eviction(t0 + SEC * 20, fleet(10, t0));
        assert!(v.allows_eviction, "{v:?}");
        assert_eq!(v.renewals, 100);
        assert!((v.expected - 100.0).abs() < 1e-9);
    }

    #[test]
    fn eviction_stops_when_renewals_fall_below_the_threshold_and_resumes_when_they_recover() {
        let t0 = Instant::now();
        let mut sp = SelfPreservation::new(config(), t0);
        for s in 1..=10u64 {
            for _ in 0..10 {
                sp.renewed(t0 + SEC * s as u32);
            }
        }
        // A partition: no renewal for 3 s of the 10 s window leaves 70 % < 85 %.
        let v = sp.allows_eviction(t0 + SEC * 13, fleet(10, t0));
        assert!(!v.allows_eviction && v.changed, "{v:?}");
        assert!(sp.is_engaged());
        for s in 14..=23u64 {
            for _ in 0..10 {
                sp.renewed(t0 + SEC * s as u32);
            }
        }
        let v = sp.allows_eviction(t0 + SEC * 23, fleet(10, t0));
        assert!(v.allows_eviction && v.changed, "{v:?}");
    }

    #[test]
    fn instances_registered_recently_are_expected_to_have_renewed_only_since() {
        let t0 = Instant::now();
        let mut sp = SelfPreservation::new(config(), t0);
        // Registered 2 s ago, renewed twice each: exactly as expected, whatever the window.
        let now = t0 + SEC * 100;
        for _ in 0..2 {
            for _ in 0..5 {
                sp.renewed(now - SEC);
            }
        }
        let v = sp.allows_eviction(now, fleet(5, now - SEC * 2));
        assert!(v.allows_eviction, "{v:?}");
    }

    #[test]
    fn a_small_registry_or_a_zero_threshold_never_engages() {
        let t0 = Instant::now();
        let now = t0 + SEC * 20;
        let mut small = SelfPreservation::new(config(), t0);
        assert!(small.allows_eviction(now, fleet(2, t0)).allows_eviction);
        let off = PreservationConfig {
            threshold: 0.0,
            ..config()
        };
        let mut off = SelfPreservation::new(off, t0);
        assert!(off.allows_eviction(now, fleet(100, t0)).allows_eviction);
        assert_eq!(off.eviction_limit(100), 100);
    }

    #[test]
    fn one_round_evicts_at_most_the_share_above_the_threshold() {
        let sp = SelfPreservation::new(config(), Instant::now());
        assert_eq!(sp.eviction_limit(100), 15);
        assert_eq!(sp.eviction_limit(1), 1);
        assert_eq!(sp.eviction_limit(0), 1);
    }
}
