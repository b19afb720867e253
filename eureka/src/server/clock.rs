//! Where the embedded registry takes the time from: the one [`Clock`] it holds. Leases run
//! on tokio's clock, which a test pauses and advances; the documents' timestamps come from
//! the wall clock, or, in tests, from one that moves with tokio's, so that they are exact.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::ledger::Now;

/// The registry's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    /// `None`: the wall clock. `Some((at, ms))`: a wall clock that read `ms` at `at` and
    /// has moved with tokio's clock since.
    wall: Option<(Instant, u64)>,
}

impl Clock {
    /// A wall clock that reads `ms` now and moves only with tokio's clock: with tokio's
    /// time paused, every timestamp a test sees is exact.
    #[cfg(test)]
    pub fn following_tokio(ms: u64) -> Clock {
        Clock {
            wall: Some((Instant::now(), ms)),
        }
    }

    /// Now, on tokio's clock (leases, the warm-up, eviction rounds, cached answers).
    pub fn instant(&self) -> Instant {
        Instant::now()
    }

    /// Now, on both clocks, as the ledger is told it.
    pub fn now(&self) -> Now {
        let at = self.instant();
        let ms = match self.wall {
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| millis(d.as_millis())),
            Some((origin, ms)) => ms.saturating_add(millis((at - origin).as_millis())),
        };
        Now { at, ms }
    }
}

fn millis(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}
