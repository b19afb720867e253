//! One rule for the errors of every odmesh crate: an error's `Display` says what its own layer
//! knows and never repeats its cause, which it keeps as its `source()`. Whoever shows an error
//! to a person (a log line, `/readyz`, an HTTP answer) shows the whole chain with [`Chain`],
//! each cause once: `registry file r.yaml (YAML): unknown field `vipp` at line 8, column 5`.
//! `anyhow`'s `{:#}` prints the same chain.

use std::error::Error;
use std::fmt;

/// An error and its causes, `: `-separated, for logs and messages: `error = %Chain(&e)`.
///
/// A cause whose text the message before it already ends with is left out: some libraries
/// write their cause into their own message.
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !shown.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            shown = text;
            cause = error.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whether `error` writes its cause's message into its own, against the rule (for the
/// tests of each crate's errors; a library's error further down is not ours to judge).
pub fn repeats_its_cause(error: &(dyn Error + 'static)) -> bool {
    error.source().is_some_and(|cause| {
        let text = cause.to_string();
        !text.is_empty() && error.to_string().contains(&text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read r.yaml")]
    struct Outer(#[source] std::io::Error);

    /// A library's error that writes its cause into its message.
    #[derive(Debug, thiserror::Error)]
    #[error("connect failed: {0}")]
    struct Repeating(#[source] std::io::Error);

    #[test]
    fn a_chain_shows_each_cause_once_after_its_error() {
        let e = Outer(std::io::Error::other("permission denied"));
        assert_eq!(
            Chain(&e).to_string(),
            "cannot read r.yaml: permission denied"
        );
        assert!(!repeats_its_cause(&e));
        let leaf = std::io::Error::other("no such file");
        assert_eq!(Chain(&leaf).to_string(), "no such file");
    }

    #[test]
    fn a_cause_already_in_its_errors_message_is_not_shown_again() {
        let e = Repeating(std::io::Error::other("refused"));
        assert!(repeats_its_cause(&e));
        assert_eq!(Chain(&e).to_string(), "connect failed: refused");
    }
}
