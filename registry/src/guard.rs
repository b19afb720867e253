//! Not following a source blindly when it suddenly loses most of the registry.
//!
//! A Eureka server that restarted empty, a half-written or truncated registry file, a
//! deployment tool that wrote the wrong file: each looks like most services vanishing at
//! once, and following it would turn every request to them into a 503. Real mass
//! deregistrations are rare and can wait a little. So a source's new registry that has lost
//! more than `max_drop` of the instances of the registry in use is *held*: the registry in
//! use stays, and the drop is applied only when the source still says so on a read at least
//! `confirm_after` after the first (for Eureka, the next fetch; for a file, the file
//! unchanged that long). A registry that recovers in between is followed at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::{Registry, RegistryMetrics, SourceHealth};
use odmesh_base::metrics::{inc, set};

/// Below this many instances in use, every change is followed: losing "most" of a handful
/// of instances is too ordinary to hold.
pub const MIN_INSTANCES: usize = 10;

/// When a drop is held, and for how long.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropGuardConfig {
    /// The share of the instances in use a new registry may lose at once without being
    /// held (0.5: a registry that keeps at least half is followed). 1 turns the guard off.
    pub max_drop: f64,
    /// How long a held drop must persist before it is applied.
    pub confirm_after: Duration,
}

impl Default for DropGuardConfig {
    /// Hold a loss of more than half, for 10 s.
    fn default() -> DropGuardConfig {
        DropGuardConfig {
            max_drop: 0.5,
            confirm_after: Duration::from_secs(10),
        }
    }
}

/// What to do with a source's new registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Publish it.
    Follow,
    /// Publish it: it is a drop, but one the source has kept saying for `confirm_after`.
    Confirmed { lost: usize, of: usize },
    /// Keep the registry in use; it lost `lost` of `of` instances, first seen `since` ago.
    Hold {
        lost: usize,
        of: usize,
        since: Duration,
    },
}

/// Tracks a held drop between reads of one source.
#[derive(Debug)]
pub struct DropGuard {
    config: DropGuardConfig,
    /// When the drop being held was first seen.
    held_since: Option<Instant>,
}

impl DropGuard {
    pub fn new(config: DropGuardConfig) -> DropGuard {
        DropGuard {
            config,
            held_since: None,
        }
    }

    /// Judges `next`, a good read of the source at `now`, against `in_use`.
    pub fn check(&mut self, in_use: &Registry, next: &Registry, now: Instant) -> Verdict {
        self.check_counts(in_use.len(), next.len(), MIN_INSTANCES, now)
    }

    /// [`DropGuard::check`] of a source of anything counted: `next` items read at `now`
    /// against `in_use`, where a drop from fewer than `min` is always followed.
    pub fn check_counts(
        &mut self,
        in_use: usize,
        next: usize,
        min: usize,
        now: Instant,
    ) -> Verdict {
        let of = in_use;
        let lost = of.saturating_sub(next);
        let is_drop = self.config.max_drop < 1.0
            && of >= min
            && lost as f64 > self.config.max_drop * of as f64;
        if !is_drop {
            self.held_since = None;
            return Verdict::Follow;
        }
        let since = now.saturating_duration_since(*self.held_since.get_or_insert(now));
        if since >= self.config.confirm_after {
            self.held_since = None;
            Verdict::Confirmed { lost, of }
        } else {
            Verdict::Hold { lost, of, since }
        }
    }

    /// Whether a drop is being held.
    pub fn is_holding(&self) -> bool {
        self.held_since.is_some()
    }

    /// Times the next drop afresh: the source said something else meanwhile (it failed to
    /// read, say), so an earlier sight of the drop no longer counts towards confirming it.
    pub fn restart(&mut self) {
        self.held_since = None;
    }
}

/// Publishes a source's new registry `next` on `tx` (see [`crate::publish`]) unless `guard`
/// holds it; a held drop shows in `health` and the metrics `registry_drop_held` and
/// `registry_drops_held_total`. Returns whether a new registry was published.
pub fn publish_guarded(
    guard: &mut DropGuard,
    tx: &watch::Sender<Arc<Registry>>,
    next: Registry,
    health: &SourceHealth,
    metrics: &RegistryMetrics,
) -> bool {
    let was_holding = guard.is_holding();
    let verdict = guard.check(&tx.borrow(), &next, Instant::now());
    let text = verdict.describe(&guard.config);
    match verdict {
        Verdict::Hold { .. } => {
            if !was_holding {
                inc(&metrics.registry_drops_held_total);
                tracing::warn!(
                    "registry drop held: {}",
                    text.as_deref().unwrap_or_default()
                );
            }
            set(&metrics.registry_drop_held, 1);
            // The source's read was recorded as it came; what is in use is the older one.
            health.set_holding(text, tx.borrow().len(), metrics);
            false
        }
        Verdict::Confirmed { .. } | Verdict::Follow => {
            if let Some(text) = &text {
                tracing::warn!("registry drop confirmed: {text}");
            } else if was_holding {
                tracing::info!("the source recovered before its drop was confirmed; following it");
            }
            set(&metrics.registry_drop_held, 0);
            health.set_holding(None, next.len(), metrics);
            crate::publish(tx, next)
        }
    }
}

impl Verdict {
    /// The text the admin and the log show for a held or confirmed drop.
    pub fn describe(&self, config: &DropGuardConfig) -> Option<String> {
        match *self {
            Verdict::Follow => None,
            Verdict::Hold { lost, of, since } => Some(format!(
                "the source lost {lost} of {of} instances at once; the registry in use stays until the source still says so {:?} after it first did ({:.1} s so far)",
                config.confirm_after,
                since.as_secs_f64()
            )),
            Verdict::Confirmed { lost, of } => Some(format!(
                "the source kept saying it lost {lost} of {of} instances for {:?}: following it",
                config.confirm_after
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;

    fn registry(n: usize) -> Registry {
        (0..n)
            .map(|i| testdata::instance("hello", &format!("h{i}"), "10.0.0.1"))
            .collect()
    }

    #[test]
    fn losing_up_to_the_share_is_followed_at_once() {
        let mut guard = DropGuard::new(DropGuardConfig::default());
        let now = Instant::now();
        assert_eq!(
            guard.check(&registry(100), &registry(50), now),
            Verdict::Follow
        );
        assert_eq!(
            guard.check(&registry(100), &registry(150), now),
            Verdict::Follow
        );
    }

    #[test]
    fn losing_most_is_held_until_the_source_still_says_so_after_the_confirmation_time() {
        let mut guard = DropGuard::new(DropGuardConfig::default());
        let t0 = Instant::now();
        let (in_use, empty) = (registry(100), registry(0));
        assert!(matches!(
            guard.check(&in_use, &empty, t0),
            Verdict::Hold {
                lost: 100,
                of: 100,
                ..
            }
        ));
        assert!(guard.is_holding());
        assert!(matches!(
            guard.check(&in_use, &empty, t0 + Duration::from_secs(9)),
            Verdict::Hold { .. }
        ));
        assert_eq!(
            guard.check(&in_use, &empty, t0 + Duration::from_secs(10)),
            Verdict::Confirmed { lost: 100, of: 100 }
        );
        assert!(!guard.is_holding());
    }

    #[test]
    fn a_source_that_recovers_is_followed_and_a_later_drop_is_timed_afresh() {
        let mut guard = DropGuard::new(DropGuardConfig::default());
        let t0 = Instant::now();
        let in_use = registry(100);
        assert!(matches!(
            guard.check(&in_use, &registry(3), t0),
            Verdict::Hold { .. }
        ));
        assert_eq!(
            guard.check(&in_use, &registry(99), t0 + Duration::from_secs(5)),
            Verdict::Follow
        );
        assert!(
            matches!(
                guard.check(&in_use, &registry(3), t0 + Duration::from_secs(12)),
                Verdict::Hold { .. }
            ),
            "timed from its own first sight, not the earlier drop's"
        );
    }

    #[test]
    fn a_small_registry_or_a_guard_turned_off_follows_everything() {
        let mut guard = DropGuard::new(DropGuardConfig::default());
        let now = Instant::now();
        assert_eq!(
            guard.check(&registry(9), &registry(0), now),
            Verdict::Follow
        );
        let mut off = DropGuard::new(DropGuardConfig {
            max_drop: 1.0,
            ..DropGuardConfig::default()
        });
        assert_eq!(
            off.check(&registry(100), &registry(0), now),
            Verdict::Follow
        );
    }

    #[test]
    fn a_held_drop_is_described_for_the_admin() {
        let config = DropGuardConfig::default();
        let text = Verdict::Hold {
            lost: 90,
            of: 100,
            since: Duration::from_secs(2),
        }
        .describe(&config)
        .unwrap();
        assert!(text.contains("lost 90 of 100"), "{text}");
        assert_eq!(Verdict::Follow.describe(&config), None);
    }
}
