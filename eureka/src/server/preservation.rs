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
    /// The shortest renewal interval an instance is expected at, whatever it states
    /// (Eureka's servers expect every client at `expectedClientRenewalIntervalSeconds`, 30 s):
    /// one registration stating 1 s and never renewing must not weigh as 30 instances, nor
    /// switch eviction off for everyone. A client renewing faster counts as renewing this
    /// often (see [`counts`]).
    pub min_interval: Duration,
}

impl Default for PreservationConfig {
    /// 0.85 over one minute, from 10 instances, each expected at most every 30 s.
    fn default() -> PreservationConfig {
        PreservationConfig {
            threshold: 0.85,
            window: Duration::from_secs(60),
            min_instances: 10,
            min_interval: Duration::from_secs(30),
        }
    }
}

impl PreservationConfig {
    /// How often an instance stating `stated` is expected to renew.
    pub fn expected_interval(&self, stated: Duration) -> Duration {
        stated.max(self.min_interval)
    }
}

/// Whether a renewal `since` the last one counted counts, for an instance stating `stated`
/// and expected every `expected`: at most one per expected interval, less half the stated
/// one for jitter. Without a floor (`expected == stated`) that is one per half interval; a
/// client renewing much faster than the floor is counted about once per floor, as expected,
/// so that it cannot hide that others went quiet.
pub fn counts(since: Duration, stated: Duration, expected: Duration) -> bool {
    since >= expected.saturating_sub(stated / 2)
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

/// The renewals the registered instances should have sent within the window: each renews
/// every `renewalIntervalInSecs`, and none before it registered. Kept as instances come and
/// go, so that asking costs what matured since the last time, not the registry.
///
/// An instance registered a full window ago or more is expected to have renewed
/// `window / interval` times: the sum of their rates (`mature_rate`) times the window. One
/// registered at `t` within the window: `(now - t) / interval`; summed, that is
/// `now * Σ rate - Σ rate * t`, kept as two sums over the young instances, which are queued
/// in registration order and move to the mature sum as they age.
#[derive(Debug)]
pub struct Expected {
    window: Duration,
    origin: Instant,
    /// `(token, registered, rate)` of the instances not yet moved to `mature_rate`, oldest
    /// first; tokens grow with registration time.
    young: VecDeque<(u64, Instant, f64)>,
    /// Tokens still queued in `young` whose instance left: skipped when they mature.
    gone: std::collections::HashSet<u64>,
    /// Σ rate over `young` (renewals per second), and Σ rate * (registered - origin) in s.
    young_rate: f64,
    young_weighted: f64,
    mature_rate: f64,
}

impl Expected {
    /// No instances; times measured from `origin`.
    pub fn new(window: Duration, origin: Instant) -> Expected {
        Expected {
            window,
            origin,
            young: VecDeque::new(),
            gone: std::collections::HashSet::new(),
            young_rate: 0.0,
            young_weighted: 0.0,
            mature_rate: 0.0,
        }
    }

    fn rate(interval: Duration) -> f64 {
        1.0 / interval.as_secs_f64().max(1.0)
    }

    fn since_origin(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.origin).as_secs_f64()
    }

    /// An instance registered at `registered` (no earlier than any added before), renewing
    /// every `interval`; `token` names it, and grows with every call.
    pub fn add(&mut self, token: u64, registered: Instant, interval: Duration) {
        let rate = Self::rate(interval);
        debug_assert!(
            (self.young.back()).is_none_or(|&(t, at, _)| t < token && at <= registered),
            "tokens and registration times only grow"
        );
        self.young.push_back((token, registered, rate));
        self.young_rate += rate;
        self.young_weighted += rate * self.since_origin(registered);
    }

    /// The instance `add` was told of with these arguments left.
    pub fn remove(&mut self, token: u64, registered: Instant, interval: Duration) {
        let rate = Self::rate(interval);
        if self
            .young
            .front()
            .is_some_and(|(oldest, ..)| token >= *oldest)
        {
            self.young_rate -= rate;
            self.young_weighted -= rate * self.since_origin(registered);
            self.gone.insert(token);
        } else {
            self.mature_rate -= rate;
        }
    }

    /// The renewals expected within the window before `now`.
    pub fn at(&mut self, now: Instant) -> f64 {
        while let Some(&(token, registered, rate)) = self.young.front()
            && now.saturating_duration_since(registered) >= self.window
        {
            self.young.pop_front();
            if self.gone.remove(&token) {
                continue;
            }
            self.young_rate -= rate;
            self.young_weighted -= rate * self.since_origin(registered);
            self.mature_rate += rate;
        }
        if self.young.is_empty() {
            // What floating point left over, once nothing is young.
            (self.young_rate, self.young_weighted) = (0.0, 0.0);
        }
        let young = self.young_rate * self.since_origin(now) - self.young_weighted;
        (self.mature_rate * self.window.as_secs_f64() + young).max(0.0)
    }
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

    /// Whether leases may be evicted now, with `count` instances registered that should
    /// have renewed `expected` times within the window (see [`Expected`]).
    pub fn allows_eviction(&mut self, now: Instant, count: usize, expected: f64) -> Verdict {
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
            min_interval: SEC,
        }
    }

    #[test]
    fn a_renewal_counts_about_once_per_expected_interval() {
        // Stated 30 s, expected 30 s: one per 15 s at most (jitter).
        let (stated, floor) = (SEC * 30, SEC * 30);
        assert!(!counts(SEC * 14, stated, stated.max(floor)));
        assert!(counts(SEC * 15, stated, stated.max(floor)));
        // Stated 2 s, expected every 30 s: a renewal 29 s after the last counted one counts,
        // one 28 s after does not: about one per 30 s, not 15 a minute.
        let stated = SEC * 2;
        assert!(!counts(SEC * 28, stated, stated.max(floor)));
        assert!(counts(SEC * 29, stated, stated.max(floor)));
        let config = PreservationConfig {
            min_interval: floor,
            ..config()
        };
        assert_eq!(config.expected_interval(SEC), floor);
        assert_eq!(config.expected_interval(SEC * 60), SEC * 60);
    }

    /// `n` instances registered at `at`, renewing every second.
    /// The verdict for `fleet`'s instances, their expectation kept by [`Expected`].
    fn verdict(sp: &mut SelfPreservation, now: Instant, fleet: &[(Instant, Duration)]) -> Verdict {
        let origin = fleet.iter().map(|(at, _)| *at).min().unwrap_or(now);
        let mut expected = Expected::new(sp.config.window, origin);
        for (token, (at, interval)) in fleet.iter().enumerate() {
            expected.add(token as u64, *at, *interval);
        }
        let count = fleet.len();
        sp.allows_eviction(now, count, expected.at(now))
    }

    /// What [`Expected`] keeps, computed from scratch.
    fn expected_from_scratch(window: Duration, now: Instant, fleet: &[(Instant, Duration)]) -> f64 {
        fleet
            .iter()
            .map(|(at, interval)| {
                let age = now.saturating_duration_since(*at).min(window);
                age.as_secs_f64() / interval.as_secs_f64().max(1.0)
            })
            .sum()
    }

    #[test]
    fn the_kept_expectation_matches_one_computed_from_scratch_as_instances_come_and_go() {
        let window = SEC * 10;
        let t0 = Instant::now();
        let mut expected = Expected::new(window, t0);
        let mut live: Vec<(u64, Instant, Duration)> = Vec::new();
        // A fixed pseudo-random walk: register, leave, let time pass, ask.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut now = t0;
        for token in 0..3_000u64 {
            match next(4) {
                0 | 1 => {
                    let interval = SEC * (1 + next(40)) as u32;
                    expected.add(token, now, interval);
                    live.push((token, now, interval));
                }
                2 if !live.is_empty() => {
                    let (token, at, interval) = live.swap_remove(next(live.len() as u64) as usize);
                    expected.remove(token, at, interval);
                }
                _ => now += Duration::from_millis(next(700)),
            }
            if token % 7 == 0 {
                let fleet: Vec<(Instant, Duration)> =
                    live.iter().map(|(_, at, i)| (*at, *i)).collect();
                let want = expected_from_scratch(window, now, &fleet);
                let got = expected.at(now);
                assert!(
                    (got - want).abs() < 1e-6 * want.max(1.0),
                    "at step {token}: {got} != {want}"
                );
            }
        }
    }

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
        let v = verdict(&mut sp, t0 + SEC * 20, &fleet(10, t0));
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
        let v = verdict(&mut sp, t0 + SEC * 13, &fleet(10, t0));
        assert!(!v.allows_eviction && v.changed, "{v:?}");
        assert!(sp.is_engaged());
        for s in 14..=23u64 {
            for _ in 0..10 {
                sp.renewed(t0 + SEC * s as u32);
            }
        }
        let v = verdict(&mut sp, t0 + SEC * 23, &fleet(10, t0));
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
        let v = verdict(&mut sp, now, &fleet(5, now - SEC * 2));
        assert!(v.allows_eviction, "{v:?}");
    }

    #[test]
    fn a_small_registry_or_a_zero_threshold_never_engages() {
        let t0 = Instant::now();
        let now = t0 + SEC * 20;
        let mut small = SelfPreservation::new(config(), t0);
        assert!(verdict(&mut small, now, &fleet(2, t0)).allows_eviction);
        let off = PreservationConfig {
            threshold: 0.0,
            ..config()
        };
        let mut off = SelfPreservation::new(off, t0);
        assert!(verdict(&mut off, now, &fleet(100, t0)).allows_eviction);
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
