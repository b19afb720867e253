//! Command-line values as types: each parser takes a flag's text and gives a checked value, or
//! the reason it is not one, which clap prints beside the flag's name. Used as
//! `#[arg(long, value_parser = flags::duration, default_value = "30s")] interval: Duration`.

use std::time::Duration;

/// The longest duration any flag takes: past it, adding it to a time could overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A positive duration of at most a year: a number with a unit (`300ms`, `2s`, `1.5m`, `2h`,
/// `7d`) or a bare number of seconds (`0.5`).
pub fn duration(text: &str) -> Result<Duration, String> {
    match duration_or_zero(text)? {
        Duration::ZERO => Err("must be more than 0".to_owned()),
        d => Ok(d),
    }
}

/// `d` as the flags and the policy file write it: `0s`, `300ms`, `2s`, `5m`, `2h` (the largest
/// unit that divides it; `1500ms`), or seconds with their fraction below a millisecond
/// (`0.0000015`). [`duration_or_zero`] reads it back.
pub fn duration_text(d: Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    if nanos == 0 {
        for (unit, size) in [("h", 3600), ("m", 60)] {
            if secs > 0 && secs % size == 0 {
                return format!("{}{unit}", secs / size);
            }
        }
        return format!("{secs}s");
    }
    if nanos % 1_000_000 == 0 {
        return format!("{}ms", d.as_millis());
    }
    let fraction = format!("{nanos:09}");
    format!("{secs}.{}", fraction.trim_end_matches('0'))
}

/// As [`duration`], 0 allowed (it turns a timer off where the flag says so).
pub fn duration_or_zero(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let not_a_duration = || format!("{text:?} is not a duration: write e.g. 300ms, 2s or 5m");
    if number.trim().is_empty() {
        return Err(not_a_duration());
    }
    let seconds_per_unit = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(format!("unknown unit {unit:?}: use ms, s, m, h or d")),
    };
    let value: f64 = number.trim().parse().map_err(|_| not_a_duration())?;
    Duration::try_from_secs_f64(value * seconds_per_unit)
        .ok()
        .filter(|d| *d <= MAX_DURATION)
        .ok_or_else(|| format!("{text:?}: not a duration from 0 to a year"))
}

/// A share from 0 to 1 (`0.85`).
pub fn share(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{value} is not a share from 0 to 1"))
    }
}

/// A count of at least one, for any unsigned integer type.
pub fn at_least_one<N: std::str::FromStr + PartialEq + From<u8>>(text: &str) -> Result<N, String> {
    let value: N = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if value == N::from(0) {
        Err("must be at least 1".to_owned())
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_is_written_as_flags_take_it_and_reads_back_the_same() {
        let ms = Duration::from_millis;
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (ms(300), "300ms"),
            (ms(1500), "1500ms"),
            (ms(2000), "2s"),
            (ms(90_000), "90s"),
            (ms(300_000), "5m"),
            (ms(7_200_000), "2h"),
            (Duration::from_nanos(1_500), "0.0000015"),
            (Duration::new(3, 1), "3.000000001"),
        ] {
            assert_eq!(duration_text(d), text);
            assert_eq!(duration_or_zero(text), Ok(d), "{text}");
        }
    }

    #[test]
    fn durations_are_taken_with_a_unit_or_as_seconds() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("300ms", ms(300)),
            ("2s", ms(2_000)),
            ("1.5s", ms(1_500)),
            ("0.5", ms(500)),
            ("30", ms(30_000)),
            ("5m", ms(300_000)),
            ("2h", ms(7_200_000)),
            ("7d", ms(604_800_000)),
            (" 10s ", ms(10_000)),
        ] {
            assert_eq!(duration(text), Ok(want), "{text:?}");
        }
        assert_eq!(duration_or_zero("0"), Ok(Duration::ZERO));
        assert_eq!(duration_or_zero("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_bad_duration_says_why() {
        for (text, says) in [
            ("0", "more than 0"),
            ("0ms", "more than 0"),
            ("-1", "from 0 to a year"),
            ("2y", "unknown unit \"y\""),
            ("2 sec", "unknown unit \"sec\""),
            ("fast", "is not a duration"),
            ("", "is not a duration"),
            ("s", "is not a duration"),
            ("NaN", "is not a duration"),
            ("inf", "is not a duration"),
            ("1e30", "unknown unit"),
            ("40000000", "from 0 to a year"),
            ("366d", "from 0 to a year"),
        ] {
            let error = duration(text).expect_err(text);
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    #[test]
    fn shares_and_counts_are_checked() {
        assert_eq!(share("0.85"), Ok(0.85));
        assert_eq!(share("0"), Ok(0.0));
        assert_eq!(share("1"), Ok(1.0));
        assert!(share("1.5").unwrap_err().contains("not a share"));
        assert!(share("-0.1").unwrap_err().contains("not a share"));
        assert!(share("half").unwrap_err().contains("not a number"));
        assert_eq!(at_least_one::<usize>("10"), Ok(10));
        assert_eq!(at_least_one::<u64>("1"), Ok(1));
        assert!(
            at_least_one::<usize>("0")
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(
            at_least_one::<u32>("-1")
                .unwrap_err()
                .contains("whole number")
        );
    }
}
