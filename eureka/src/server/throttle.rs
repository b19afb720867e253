//! Failed authentications per source address: an address that sent `max` requests without
//! valid credentials within one window is answered 429 for the rest of it, its credentials
//! not even looked at, so that nobody guesses tokens at the speed of the network. Plain
//! state, fed with the time.
//!
//! Every request from a throttled address is refused, valid credentials or not: checking
//! them would tell a guesser which guess was right at full speed. Clients behind one address
//! (a NAT) share its allowance; a well-configured client sends no invalid credentials.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// The window failures are counted over.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Addresses tracked at most: beyond, an address not yet tracked is not throttled (the
/// memory stays bounded; the expired ones are dropped first).
const MAX_TRACKED: usize = 65_536;

/// Failed authentications per address, within the current window of each.
#[derive(Debug)]
pub struct AuthThrottle {
    max: u32,
    failures: HashMap<IpAddr, (Instant, u32)>,
}

impl AuthThrottle {
    /// At most `max` failures per address and [`WINDOW`]; 0 throttles nothing.
    pub fn new(max: u32) -> AuthThrottle {
        AuthThrottle {
            max,
            failures: HashMap::new(),
        }
    }

    /// How long `ip` is still throttled at `now`, if it is.
    pub fn throttled(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let (since, n) = self.failures.get(&ip)?;
        let left = WINDOW.checked_sub(now.saturating_duration_since(*since))?;
        (self.max > 0 && *n >= self.max && !left.is_zero()).then_some(left)
    }

    /// Counts a failed authentication from `ip` at `now`.
    pub fn failed(&mut self, ip: IpAddr, now: Instant) {
        if self.max == 0 {
            return;
        }
        if self.failures.len() >= MAX_TRACKED && !self.failures.contains_key(&ip) {
            self.failures
                .retain(|_, (since, _)| now.saturating_duration_since(*since) < WINDOW);
            if self.failures.len() >= MAX_TRACKED {
                return;
            }
        }
        let entry = self.failures.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_throttled_after_max_failures_until_its_window_ends() {
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut throttle = AuthThrottle::new(3);
        for i in 0..3 {
            assert_eq!(throttle.throttled(a, t0), None, "after {i} failures");
            throttle.failed(a, t0 + Duration::from_secs(i));
        }
        let at = t0 + Duration::from_secs(4);
        assert_eq!(
            throttle.throttled(a, at),
            Some(WINDOW - Duration::from_secs(4))
        );
        assert_eq!(throttle.throttled(b, at), None, "another address is not");
        assert_eq!(throttle.throttled(a, t0 + WINDOW), None, "the window ended");
        // A new window counts from zero.
        throttle.failed(a, t0 + WINDOW);
        assert_eq!(throttle.throttled(a, t0 + WINDOW), None);
        assert_eq!(AuthThrottle::new(0).throttled(a, at), None);
    }

    #[test]
    fn the_addresses_tracked_are_bounded() {
        let t0 = Instant::now();
        let mut throttle = AuthThrottle::new(1);
        for i in 0..MAX_TRACKED as u32 + 10 {
            throttle.failed(IpAddr::from(i.to_be_bytes()), t0);
        }
        assert_eq!(throttle.failures.len(), MAX_TRACKED);
        // Once their windows end, the old ones make room.
        let later = t0 + WINDOW;
        let new: IpAddr = "192.0.2.1".parse().unwrap();
        throttle.failed(new, later);
        assert_eq!(throttle.throttled(new, later), Some(WINDOW));
        assert_eq!(throttle.failures.len(), 1);
    }
}
