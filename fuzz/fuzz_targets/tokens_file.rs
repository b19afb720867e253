//! The embedded registry's tokens file (`--eureka-auth`, YAML), parsed as at start. Checks:
//! - it is read or refused without a panic;
//! - a refusal never shows a token: no `token:` value of the input (8 characters or more,
//!   letters, digits, `-` and `_`) is in its message, since the message goes to the log,
//!   unless it stays there once that value is another of the same length (the text is also
//!   a key, say);
//! - a file that is read lets in nobody without credentials, nor with a token not in it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use odmesh_eureka::server::auth::Authenticator;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Authenticator::parse("tokens.yaml", data) {
        Err(e) => {
            let message = e.to_string();
            for (line, token) in token_values(&text) {
                // The message may hold the same text for another reason (a key, a field's
                // path): it shows the token only if it no longer holds it once this one
                // value is another text of the same length.
                // Only a token of letters, digits, `-` and `_` (as tokens are): another such
                // text in its place leaves the file's structure as it was.
                let plain = token
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
                if token.len() < 8 || !plain || !message.contains(token) {
                    continue;
                }
                let replaced = with_value_replaced(&text, line, token);
                let shown = match Authenticator::parse("tokens.yaml", replaced.as_bytes()) {
                    Ok(_) => true,
                    Err(e) => !e.to_string().contains(token),
                };
                assert!(!shown, "the refusal shows the token {token:?}: {message}");
            }
        }
        Ok(auth) => {
            let stranger = "odmesh-fuzz-no-such-token-0123456789";
            if !text.contains(stranger) {
                let header = format!("Bearer {stranger}")
                    .parse()
                    .expect("a header value");
                assert!(
                    auth.authenticate(Some(&header)).is_err(),
                    "a stranger got in"
                );
            }
            assert!(auth.authenticate(None).is_err(), "nobody got in");
        }
    }
});

/// The values after `token:` on each line (with the line's number), without quotes.
fn token_values(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(n, line)| {
        let (_, value) = line.split_once("token:")?;
        Some((n, value.trim().trim_matches(|c| c == '"' || c == '\'')))
    })
}

/// `text` with the `token` after `token:` on line `line` replaced by as many `Z`s.
fn with_value_replaced(text: &str, line: usize, token: &str) -> String {
    let lines: Vec<String> = (text.lines().enumerate())
        .map(|(n, l)| match l.split_once("token:") {
            Some((key, value)) if n == line => {
                format!(
                    "{key}token:{}",
                    value.replacen(token, &"Z".repeat(token.len()), 1)
                )
            }
            _ => l.to_owned(),
        })
        .collect();
    lines.join("\n")
}
