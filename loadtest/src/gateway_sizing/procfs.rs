//! CPU time and memory of a process, from Linux `/proc`.
//!
//! Invariants: CPU time is the process's own `utime + stime` (every thread, live or exited, not
//! its children) in clock ticks of [`TICKS_PER_S`]; memory is `VmRSS` and `VmHWM` of
//! `/proc/PID/status` in KiB. Both only read; a process that is gone is an error.

use std::io;

/// Linux reports `/proc/PID/stat` times in `USER_HZ`, 100 on every mainstream architecture.
pub const TICKS_PER_S: f64 = 100.0;

/// `utime + stime` of `pid`, clock ticks.
pub fn cpu_ticks(pid: u32) -> io::Result<u64> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat"))?)
}

/// Sum of [`cpu_ticks`] over several processes.
pub fn cpu_ticks_of(pids: &[u32]) -> io::Result<u64> {
    pids.iter().map(|&p| cpu_ticks(p)).sum()
}

/// `utime + stime` from the text of a `/proc/PID/stat` (fields 14 and 15; the command name in
/// field 2 may hold spaces and parentheses, so fields count from its last `)`).
pub fn parse_stat(stat: &str) -> io::Result<u64> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/PID/stat");
    let rest = stat.rfind(')').map(|i| &stat[i + 1..]).ok_or_else(bad)?;
    // After ')': field 3 (state) is the first; utime is field 14, stime 15.
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let stime: u64 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    Ok(utime + stime)
}

/// Resident memory now and at its peak, KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Memory {
    /// `VmRSS`.
    pub rss_kib: u64,
    /// `VmHWM`.
    pub hwm_kib: u64,
}

/// [`Memory`] of `pid`.
pub fn memory(pid: u32) -> io::Result<Memory> {
    Ok(parse_status(&std::fs::read_to_string(format!(
        "/proc/{pid}/status"
    ))?))
}

/// [`Memory`] from the text of a `/proc/PID/status` (absent fields read 0).
pub fn parse_status(status: &str) -> Memory {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let s = "4242 (kv gate) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 3 0";
        assert_eq!(parse_stat(s).unwrap(), 1234 + 567);
        assert!(parse_stat("garbage").is_err());
    }

    #[test]
    fn status_memory_fields() {
        let s = "Name:\tkvgate\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(
            parse_status(s),
            Memory {
                rss_kib: 102_400,
                hwm_kib: 204_800
            }
        );
    }

    #[test]
    fn reads_its_own_process() {
        let me = std::process::id();
        cpu_ticks(me).unwrap();
        assert!(memory(me).unwrap().rss_kib > 0);
    }
}
