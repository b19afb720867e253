//! Timestamps from `odmesh-control`'s log (tracing's default format: an RFC 3339 UTC time with
//! microseconds first on each line, perhaps wrapped in ANSI colour codes).

/// Strips ANSI escape sequences (`ESC [ ... letter`).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Seconds since the Unix epoch of a line starting `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
pub fn line_time(line: &str) -> Option<f64> {
    let line = strip_ansi(line);
    let ts = line.split_whitespace().next()?;
    let (date, time) = ts.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let h: f64 = t.next()?.parse().ok()?;
    let min: f64 = t.next()?.parse().ok()?;
    let s: f64 = t.next()?.parse().ok()?;
    let days = days_from_civil(y, m, day) as f64;
    Some(days * 86400.0 + h * 3600.0 + min * 60.0 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The times of the lines of `log` that contain `needle`, in order.
pub fn times_of(log: &str, needle: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains(needle))
        .filter_map(line_time)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coloured_tracing_line_gives_its_unix_time() {
        let line = "\u{1b}[2m2026-12-02T00:43:00.250000Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m registry loaded";
        let t = line_time(line).unwrap();
        assert!((t - 1_796_172_180.25).abs() < 1e-6, "{t}");
        assert_eq!(times_of(line, "registry loaded").len(), 1);
    }
}
