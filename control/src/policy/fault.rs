//! A fault entry of the policy file: delay or abort requests to one VIP, for one caller or
//! all, for chaos experiments (README, "Fault injection"). What Envoy's fault filter does with
//! it is [`crate::xds::route`]'s business; here it is read and checked.
//!
//! ```yaml
//! fault:
//!   delay: {fixed: 500ms, percent: 100}   # percent: default 100
//!   abort: {status: 503, percent: 50}     # or grpc_status: 14
//!   header: x-chaos                       # only requests carrying this header
//!   until: 2026-12-05T10:00:00Z           # then the entry is ignored
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Bounded, HeaderName, Positive};

/// Faults for one VIP and one caller (or all callers): at least a delay or an abort.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields, try_from = "RawFault")]
pub struct Fault {
    pub delay: Option<Delay>,
    pub abort: Option<Abort>,
    /// Only requests carrying this header (whatever its value) are touched.
    pub header: Option<HeaderName>,
    /// When the entry stops applying, if the operator bounded the experiment.
    pub until: Option<Until>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    delay: Option<Delay>,
    abort: Option<Abort>,
    header: Option<HeaderName>,
    until: Option<Until>,
}

impl TryFrom<RawFault> for Fault {
    type Error = &'static str;
    fn try_from(raw: RawFault) -> Result<Fault, &'static str> {
        if raw.delay.is_none() && raw.abort.is_none() {
            return Err("a fault needs a delay or an abort (or both)");
        }
        Ok(Fault {
            delay: raw.delay,
            abort: raw.abort,
            header: raw.header,
            until: raw.until,
        })
    }
}

impl Fault {
    /// Whether the entry applies at `now`: not past its `until`.
    pub fn applies_at(&self, now: SystemTime) -> bool {
        self.until.as_ref().is_none_or(|u| now < u.at())
    }
}

/// Hold a request this long before it goes on, for `percent` of the requests.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Delay {
    pub fixed: Positive,
    #[serde(default)]
    pub percent: Percent,
}

/// Answer a request at once with an error, for `percent` of the requests.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields, try_from = "RawAbort")]
pub struct Abort {
    pub with: AbortWith,
    pub percent: Percent,
}

/// What an aborted request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AbortWith {
    /// An HTTP status, 200 to 599.
    Status(u32),
    /// A gRPC status, 1 to 16 (HTTP 200 with `grpc-status`).
    GrpcStatus(u32),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAbort {
    status: Option<Bounded<200, 599>>,
    grpc_status: Option<Bounded<1, 16>>,
    #[serde(default)]
    percent: Percent,
}

impl TryFrom<RawAbort> for Abort {
    type Error = &'static str;
    fn try_from(raw: RawAbort) -> Result<Abort, &'static str> {
        let with = match (raw.status, raw.grpc_status) {
            (Some(s), None) => AbortWith::Status(s.0),
            (None, Some(g)) => AbortWith::GrpcStatus(g.0),
            _ => return Err("an abort needs either `status` or `grpc_status`"),
        };
        Ok(Abort {
            with,
            percent: raw.percent,
        })
    }
}

/// A share of requests from 0 to 100 percent, kept in millionths (Envoy's finest step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Percent {
    pub per_million: u32,
}

impl Default for Percent {
    /// Every request.
    fn default() -> Percent {
        Percent {
            per_million: 1_000_000,
        }
    }
}

impl<'de> Deserialize<'de> for Percent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Percent, D::Error> {
        let p = f64::deserialize(d)?;
        if !(0.0..=100.0).contains(&p) {
            return Err(serde::de::Error::custom(format!(
                "{p} is not a percentage from 0 to 100"
            )));
        }
        // In range, so the cast cannot overflow.
        Ok(Percent {
            per_million: (p * 10_000.0).round() as u32,
        })
    }
}

impl Serialize for Percent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(f64::from(self.per_million) / 10_000.0)
    }
}

/// A moment written in RFC 3339, UTC or with an offset: `2026-12-05T10:00:00Z`,
/// `2026-12-05T11:00:00+01:00`. Kept as seconds since the epoch and as written.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Until {
    pub unix_secs: u64,
    pub text: String,
}

impl Until {
    pub fn at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.unix_secs)
    }
}

impl<'de> Deserialize<'de> for Until {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Until, D::Error> {
        let text = String::deserialize(d)?;
        let unix_secs = parse_rfc3339(text.trim()).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{:?} is not a time like 2026-12-05T10:00:00Z",
                odmesh_base::logs::clip(&text)
            ))
        })?;
        Ok(Until { unix_secs, text })
    }
}

impl Serialize for Until {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Seconds since the epoch of `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (`t` or a space may
/// stand for `T`, `z` for `Z`; the fraction is dropped); `None` if it is not one, or before
/// 1970.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(range)?;
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| (digits.iter()).fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let sep = |i: usize, allowed: &[u8]| b.get(i).is_some_and(|c| allowed.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let month_ok = (1..=12).contains(&month);
    if !month_ok || day < 1 || day > days_in_month[(month - 1) as usize] {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &b[19..];
    if rest.first() == Some(&b'.') {
        let digits = rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        rest = &rest[1 + digits..];
    }
    let offset = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hm = [*h1, *h2, *m1, *m2];
            if !hm.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let h = i64::from(hm[0] - b'0') * 10 + i64::from(hm[1] - b'0');
            let m = i64::from(hm[2] - b'0') * 10 + i64::from(hm[3] - b'0');
            if h > 23 || m > 59 {
                return None;
            }
            let secs = h * 3600 + m * 60;
            if *sign == b'+' { secs } else { -secs }
        }
        _ => return None,
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(secs - offset).ok()
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_are_read_in_utc_with_their_offset() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800));
        // `date -u -d 2026-12-05T10:00:00Z +%s`
        assert_eq!(parse_rfc3339("2026-12-05T10:00:00Z"), Some(1_796_464_800));
        assert_eq!(
            parse_rfc3339("2026-12-05T11:00:00+01:00"),
            Some(1_796_464_800)
        );
        assert_eq!(
            parse_rfc3339("2026-12-05t09:30:00.250-00:30"),
            Some(1_796_464_800)
        );
        assert_eq!(parse_rfc3339("2024-02-29T00:00:00Z"), Some(1_709_164_800));
        for bad in [
            "",
            "2026-12-05",
            "2026-12-05T10:00:00",
            "2026-13-05T10:00:00Z",
            "2026-02-29T10:00:00Z",
            "2026-12-05T24:00:00Z",
            "2026-12-05T10:00:00+1:00",
            "2026-12-05T10:00:00.Z",
            "1969-12-31T23:59:59Z",
            "２026-12-05T10:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_fault_applies_until_its_time_and_always_without_one() {
        let until = |unix_secs| Until {
            unix_secs,
            text: String::new(),
        };
        let fault = |u| Fault {
            delay: None,
            abort: Some(Abort {
                with: AbortWith::Status(503),
                percent: Percent::default(),
            }),
            header: None,
            until: u,
        };
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        assert!(fault(None).applies_at(t(u64::from(u32::MAX))));
        assert!(fault(Some(until(100))).applies_at(t(99)));
        assert!(!fault(Some(until(100))).applies_at(t(100)));
    }
}
