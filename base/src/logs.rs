//! Logging what clients send without letting them flood the log: [`clip`] bounds a string a
//! client chose (an app name, a node id, an error message), and [`RateLimit`] bounds how often
//! a line that clients can trigger at will is written.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this many characters of a client string go to the log.
pub const CLIP_CHARS: usize = 96;

/// `s` for a log line: escaped like `{:?}` (control characters and quotes cannot forge or
/// break a line), cut after [`CLIP_CHARS`] characters with a note of how much was cut.
pub fn clip(s: &str) -> Clipped<'_> {
    Clipped(s, CLIP_CHARS)
}

/// [`clip`] with room for `max` characters, for longer messages (an Envoy error).
pub fn clip_at(s: &str, max: usize) -> Clipped<'_> {
    Clipped(s, max)
}

/// `s` cut to at most `max` bytes, on a character boundary: for a client string that is
/// stored (and shown by the admin), not only logged.
pub fn truncated(s: &str, max: usize) -> String {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// See [`clip`].
#[derive(Clone, Copy)]
pub struct Clipped<'a>(&'a str, usize);

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.0.char_indices();
        f.write_str("\"")?;
        for (_, c) in chars.by_ref().take(self.1) {
            for e in c.escape_debug() {
                fmt::Write::write_char(f, e)?;
            }
        }
        f.write_str("\"")?;
        if let Some((at, _)) = chars.next() {
            write!(f, "...(+{} bytes)", self.0.len() - at)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A bound on how often one kind of log line is written: at most `burst` lines per `window`;
/// the rest are counted, and the next line written says how many were left out.
///
/// ```
/// use odmesh_base::logs::RateLimit;
/// static REFUSED: RateLimit = RateLimit::new(10, std::time::Duration::from_secs(1));
/// if let Some(suppressed) = REFUSED.check() {
///     tracing::warn!(suppressed, "registration refused");
/// }
/// ```
#[derive(Debug)]
pub struct RateLimit {
    burst: u32,
    window: Duration,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Option<Instant>,
    written: u32,
    suppressed: u64,
}

impl RateLimit {
    /// At most `burst` lines per `window`.
    pub const fn new(burst: u32, window: Duration) -> RateLimit {
        RateLimit {
            burst,
            window,
            state: Mutex::new(Window {
                started: None,
                written: 0,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were left out since the
    /// last one written; `None` when this one must be left out (it is counted).
    pub fn check(&self) -> Option<u64> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if w.started
            .is_none_or(|t| now.saturating_duration_since(t) >= self.window)
        {
            w.started = Some(now);
            w.written = 0;
        }
        if w.written < self.burst {
            w.written += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

/// The limit for lines clients can trigger at will: 20 a second per kind.
pub const fn per_second() -> RateLimit {
    RateLimit::new(20, Duration::from_secs(1))
}

/// Logs like `tracing::$level!` (`info`, `warn`, ...), at most 20 lines a second from this
/// call site ([`per_second`]); the next line written carries `suppressed`, how many were left
/// out. For every line a client can make the control plane write at will.
#[macro_export]
macro_rules! limited {
    ($level:ident, $($arg:tt)+) => {{
        static LIMIT: $crate::logs::RateLimit = $crate::logs::per_second();
        if let Some(suppressed) = LIMIT.check() {
            ::tracing::$level!(suppressed, $($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_string_is_cut_with_a_note_of_what_was_cut() {
        let long = "a".repeat(CLIP_CHARS + 10);
        let shown = clip(&long).to_string();
        assert_eq!(
            shown,
            format!("\"{}\"...(+10 bytes)", "a".repeat(CLIP_CHARS))
        );
        assert_eq!(clip("short").to_string(), "\"short\"");
    }

    #[test]
    fn control_characters_and_quotes_are_escaped_so_no_line_can_be_forged() {
        let shown = clip("x\n2026-01-01 INFO fake line\u{1b}[31m\"").to_string();
        assert!(
            !shown.contains('\n') && !shown.contains('\u{1b}'),
            "{shown}"
        );
        assert!(shown.contains("\\n") && shown.contains("\\u{1b}") && shown.contains("\\\""));
    }

    #[test]
    fn a_multibyte_string_is_cut_on_a_character_boundary() {
        let long = "é".repeat(CLIP_CHARS + 1);
        assert!(clip(&long).to_string().ends_with("...(+2 bytes)"));
    }

    #[test]
    fn truncated_keeps_at_most_the_bytes_asked_for_on_a_character_boundary() {
        assert_eq!(truncated("héllo", 2), "h");
        assert_eq!(truncated("héllo", 3), "hé");
        assert_eq!(truncated("hi", 10), "hi");
    }

    #[test]
    fn lines_over_the_burst_are_left_out_and_counted_until_the_next_window() {
        let limit = RateLimit::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(limit.check_at(t0), Some(0));
        assert_eq!(limit.check_at(t0), Some(0));
        assert_eq!(limit.check_at(t0), None);
        assert_eq!(limit.check_at(t0 + Duration::from_millis(500)), None);
        assert_eq!(
            limit.check_at(t0 + Duration::from_secs(1)),
            Some(2),
            "the first line of a new window says how many were left out"
        );
        assert_eq!(limit.check_at(t0 + Duration::from_secs(1)), Some(0));
    }
}
