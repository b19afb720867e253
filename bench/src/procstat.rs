//! Readings from `/proc` for a process: CPU seconds (user + system) and resident memory.

use std::fs;

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU seconds `pid` has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), which ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SECOND)
}

/// `(VmRSS, VmHWM)` of `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Option<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// `(VmRSS, VmHWM)` of this process, in bytes.
pub fn own_rss_bytes() -> Option<(u64, u64)> {
    rss_bytes(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        assert!(cpu_seconds(pid).is_some());
        let (rss, hwm) = rss_bytes(pid).unwrap();
        assert!(rss > 0 && hwm >= rss);
    }
}
