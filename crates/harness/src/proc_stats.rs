//! A process's memory and CPU time, from `/proc/<pid>/status` and `/proc/<pid>/stat`.

use anyhow::Context as _;

/// What `/proc` tells of one process at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    pub rss_mib: f64,
    /// The peak RSS since the process started (VmHWM).
    pub peak_rss_mib: f64,
    /// utime + stime since the process started.
    pub cpu_s: f64,
}

pub fn read(pid: u32) -> anyhow::Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is not running"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is not running"))?;
    let kib = |field| status_kib(&status, field).with_context(|| format!("no {field} for {pid}"));
    Ok(Usage {
        rss_mib: kib("VmRSS")? as f64 / 1024.0,
        peak_rss_mib: kib("VmHWM")? as f64 / 1024.0,
        cpu_s: cpu_ticks(&stat).context("cannot parse /proc/<pid>/stat")? as f64
            / clock_ticks_per_second(),
    })
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status
        .lines()
        .find(|line| line.split(':').next() == Some(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime in clock ticks from `/proc/<pid>/stat`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // Fields after the command name (which is in parentheses and may contain spaces): state is field 3, utime 14,
    // stime 15; after ") " the state is index 0, so utime is index 11 and stime index 12.
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CLK_TCK from `getconf`; 100 (Linux's value everywhere in practice) when that fails.
fn clock_ticks_per_second() -> f64 {
    crate::command::output(&[], "getconf", &["CLK_TCK"])
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_peak_and_cpu_from_proc() {
        let status =
            "Name:\tgpu-operator\nVmPeak:\t  100 kB\nVmHWM:\t   30000 kB\nVmRSS:\t   24576 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(24576));
        assert_eq!(status_kib(status, "VmHWM"), Some(30000));
        assert_eq!(status_kib("Name:\tx\n", "VmRSS"), None);
        let stat = "4242 (gpu operator) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 5 0";
        assert_eq!(cpu_ticks(stat), Some(175));
        assert_eq!(cpu_ticks("garbage"), None);
        let own = read(std::process::id()).unwrap();
        assert!(own.rss_mib > 0.0 && own.peak_rss_mib >= own.rss_mib);
    }
}
