//! The pure parts of `cargo xtask bench`: reading `/proc`, counting the audit log, and the table.

use serde::{Deserialize, Serialize};

/// The operator's ServiceAccount, as the API server's audit log names it.
pub const OPERATOR_USER: &str = "system:serviceaccount:gpu-operator:gpu-operator";

/// What one run with N simulated GPU nodes measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub nodes: u32,
    /// From starting the operator to `status.state == ready`.
    pub ready_s: f64,
    /// From `kubectl patch` to the dcgm-exporter DaemonSet carrying the new image.
    pub patch_to_daemonset_s: f64,
    /// From `kubectl patch` to the policy being ready at the patched generation.
    pub patch_to_ready_s: f64,
    /// VmRSS after 30 s at rest.
    pub rss_mib: f64,
    /// utime + stime since start, read after 30 s at rest.
    pub cpu_s: f64,
    /// utime + stime during the 60 s audit window at rest.
    pub cpu_rest_s: f64,
    /// Write requests other than to Leases during 60 s at rest.
    pub writes_at_rest: u64,
    /// Writes to Leases (leader election renewals) during 60 s at rest.
    pub lease_writes_at_rest: u64,
}

/// Allocate latency of the device plugin, as the `allocate_latency` example prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocate {
    pub calls: u64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// Everything `bench.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub rows: Vec<Row>,
    pub allocate: Option<Allocate>,
}

/// Write requests by one user in an audit log excerpt: (Leases, everything else).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Writes {
    pub leases: u64,
    pub other: u64,
}

/// Counts the completed requests of `user` in audit log lines (JSON, one event a line). Lines that are not JSON
/// (a partly written last line) and events of other stages than `ResponseComplete` are skipped.
pub fn count_writes(log: &str, user: &str) -> Writes {
    let mut writes = Writes::default();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user {
            continue;
        }
        if event
            .get("stage")
            .is_some_and(|stage| stage != "ResponseComplete")
        {
            continue;
        }
        if event["objectRef"]["resource"] == "leases" {
            writes.leases += 1;
        } else {
            writes.other += 1;
        }
    }
    writes
}

/// VmRSS in KiB from `/proc/<pid>/status`.
pub fn vm_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime in clock ticks from `/proc/<pid>/stat`.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    // Fields after the command name (which is in parentheses and may contain spaces): state is field 3, utime 14,
    // stime 15; after ") " the state is index 0, so utime is index 11 and stime index 12.
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The Markdown table, one row per node count, with a note on what the audit log can and cannot tell.
pub fn render_table(results: &Results) -> String {
    let mut text = String::from(
        "| nodes | ready s | patch→DaemonSet s | patch→ready s | RSS MiB | CPU s | CPU s/60 s at rest | writes/60 s at rest | lease renewals/60 s |\n\
         |------:|--------:|------------------:|--------------:|--------:|------:|-------------------:|--------------------:|--------------------:|\n",
    );
    for row in &results.rows {
        text.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} | {} | {} |\n",
            row.nodes,
            row.ready_s,
            row.patch_to_daemonset_s,
            row.patch_to_ready_s,
            row.rss_mib,
            row.cpu_s,
            row.cpu_rest_s,
            row.writes_at_rest,
            row.lease_writes_at_rest,
        ));
    }
    text.push_str(
        "\nready: operator start to ClusterPolicy `status.state == ready`; patch: `dcgmExporter.version` to the \
         dcgm-exporter DaemonSet's image, and to ready at the new generation (polled every 100 ms). RSS and CPU \
         (utime+stime since start) after 30 s at rest. Writes: the operator ServiceAccount's write requests in the \
         API server's audit log over 60 s at rest, Leases (leader election) apart. The audit log records writes \
         only, so total API requests per minute (reads and watches included) are not measured.\n",
    );
    if let Some(allocate) = &results.allocate {
        text.push_str(&format!(
            "\nDevice plugin Allocate latency (in process, unix socket, release build, {} calls): p50 {} µs, p99 {} µs\n",
            allocate.calls, allocate.p50_us, allocate.p99_us
        ));
    }
    text
}

/// Parses `--nodes 10,100`.
pub fn parse_node_counts(text: &str) -> anyhow::Result<Vec<u32>> {
    let counts =
        text.split(',')
            .map(|part| {
                let count: u32 = part.trim().parse().map_err(|_| {
                    anyhow::anyhow!("--nodes takes counts like 10,100; got {part:?}")
                })?;
                anyhow::ensure!(
                    count >= 2,
                    "--nodes: each count must be at least 2 (two OS pools)"
                );
                Ok(count)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_completed_writes_of_the_operator_with_leases_apart() {
        let log = format!(
            "{}\n{}\n{}\n{}\n{}\n{{\"truncated",
            r#"{"stage":"ResponseComplete","verb":"update","user":{"username":"system:serviceaccount:gpu-operator:gpu-operator"},"objectRef":{"resource":"leases"}}"#,
            r#"{"stage":"ResponseComplete","verb":"patch","user":{"username":"system:serviceaccount:gpu-operator:gpu-operator"},"objectRef":{"resource":"nodes"}}"#,
            r#"{"stage":"ResponseStarted","verb":"patch","user":{"username":"system:serviceaccount:gpu-operator:gpu-operator"},"objectRef":{"resource":"nodes"}}"#,
            r#"{"stage":"ResponseComplete","verb":"update","user":{"username":"system:kube-scheduler"},"objectRef":{"resource":"leases"}}"#,
            r#"{"verb":"patch","user":{"username":"system:serviceaccount:gpu-operator:gpu-operator"},"objectRef":{"resource":"clusterpolicies","subresource":"status"}}"#,
        );
        assert_eq!(
            count_writes(&log, OPERATOR_USER),
            Writes {
                leases: 1,
                other: 2
            }
        );
        assert_eq!(count_writes("", OPERATOR_USER), Writes::default());
    }

    #[test]
    fn reads_rss_and_cpu_from_proc() {
        let status = "Name:\tgpu-operator\nVmPeak:\t  100 kB\nVmRSS:\t   24576 kB\nThreads:\t5\n";
        assert_eq!(vm_rss_kib(status), Some(24576));
        assert_eq!(vm_rss_kib("Name:\tx\n"), None);
        let stat = "4242 (gpu operator) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 5 0";
        assert_eq!(cpu_ticks(stat), Some(175));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn renders_one_row_per_node_count_and_the_allocate_line() {
        let row = |nodes, ready_s| Row {
            nodes,
            ready_s,
            patch_to_daemonset_s: 0.456,
            patch_to_ready_s: 0.789,
            rss_mib: 21.04,
            cpu_s: 1.5,
            cpu_rest_s: 0.02,
            writes_at_rest: 0,
            lease_writes_at_rest: 12,
        };
        let table = render_table(&Results {
            rows: vec![row(10, 1.234), row(100, 5.0)],
            allocate: Some(Allocate {
                calls: 1000,
                p50_us: 80,
                p99_us: 150,
            }),
        });
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("| nodes | ready s |"));
        assert_eq!(
            lines[2],
            "| 10 | 1.23 | 0.46 | 0.79 | 21.0 | 1.50 | 0.02 | 0 | 12 |"
        );
        assert!(lines[3].starts_with("| 100 | 5.00 |"));
        assert!(table.contains("total API requests per minute"));
        assert!(table.contains("p50 80 µs, p99 150 µs"));
        let without = render_table(&Results {
            rows: vec![],
            allocate: None,
        });
        assert!(!without.contains("Allocate"));
    }

    #[test]
    fn parses_node_counts() {
        assert_eq!(parse_node_counts("10,100").unwrap(), vec![10, 100]);
        assert_eq!(parse_node_counts(" 50 ").unwrap(), vec![50]);
        assert!(parse_node_counts("10,x").is_err());
        assert!(parse_node_counts("1").is_err());
    }

    #[test]
    fn allocate_json_parses() {
        let allocate: Allocate =
            serde_json::from_str(r#"{"calls": 1000, "p50_us": 81, "p99_us": 140}"#).unwrap();
        assert_eq!(allocate.p99_us, 140);
    }
}
