//! Counting an operator's (or a node role's) API requests in the API server's audit log (JSON, one event a line,
//! Metadata level; the cluster's audit policy records every request of the operator's namespace's
//! ServiceAccounts).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

/// The operators' ServiceAccount (both charts name it so), as the audit log names it.
pub const OPERATOR_USER: &str = "system:serviceaccount:gpu-operator:gpu-operator";

const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// One user's requests in a window of the audit log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    /// By `<verb> <resource>[/<subresource>]`.
    pub by_kind: BTreeMap<String, u64>,
    /// The user agents the requests came with (how the two operators' clients name themselves).
    pub user_agents: BTreeSet<String>,
}

impl Requests {
    /// Adds the requests of another part of the window.
    pub fn add(&mut self, other: Self) {
        for (kind, count) in other.by_kind {
            *self.by_kind.entry(kind).or_insert(0) += count;
        }
        self.user_agents.extend(other.user_agents);
    }

    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    /// Writes other than to Leases (leader election renewals are counted apart).
    pub fn writes(&self) -> u64 {
        self.sum(|verb, resource| WRITE_VERBS.contains(&verb) && resource != "leases")
    }

    /// Writes to Leases: leader election.
    pub fn lease_writes(&self) -> u64 {
        self.sum(|verb, resource| WRITE_VERBS.contains(&verb) && resource == "leases")
    }

    fn sum(&self, select: impl Fn(&str, &str) -> bool) -> u64 {
        self.by_kind
            .iter()
            .filter(|(kind, _)| {
                let (verb, resource) = kind.split_once(' ').unwrap_or((kind, ""));
                let resource = resource.split('/').next().unwrap_or_default();
                select(verb, resource)
            })
            .map(|(_, count)| count)
            .sum()
    }
}

/// The requests of `user` in audit log lines. A request is counted once: at `ResponseComplete`, except watches,
/// which are counted when they start (`ResponseStarted`), since a watch completes only when it is closed. Lines
/// that are not JSON (a line cut at the window's edge) are skipped.
pub fn count(log: &str, user: &str) -> Requests {
    let mut requests = Requests::default();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user {
            continue;
        }
        let verb = event["verb"].as_str().unwrap_or_default();
        let counted_stage = if verb == "watch" {
            "ResponseStarted"
        } else {
            "ResponseComplete"
        };
        if event["stage"] != counted_stage {
            continue;
        }
        let resource = event["objectRef"]["resource"]
            .as_str()
            .unwrap_or("(non-resource)");
        let kind = match event["objectRef"]["subresource"].as_str() {
            Some(subresource) => format!("{verb} {resource}/{subresource}"),
            None => format!("{verb} {resource}"),
        };
        *requests.by_kind.entry(kind).or_insert(0) += 1;
        if let Some(agent) = event["userAgent"].as_str() {
            requests.user_agents.insert(agent.to_owned());
        }
    }
    requests
}

/// A point in the audit log to count requests from. The API server rotates its log at 100 MB (lumberjack's
/// default, as the cluster sets no `--audit-log-maxsize`): it renames the file to `audit-<time>.log` beside it and
/// starts a new one, which a 1000-node rollout does several times. A rename keeps the inode, so a window is the
/// marked file from the offset on, plus every file made since.
#[derive(Debug)]
pub struct Mark {
    log: PathBuf,
    inode: u64,
    offset: u64,
    /// The rotated files that existed at the mark: before the window.
    earlier: BTreeSet<PathBuf>,
}

impl Mark {
    pub fn now(log: &Path) -> anyhow::Result<Self> {
        let metadata =
            std::fs::metadata(log).with_context(|| format!("cannot read {}", log.display()))?;
        let mut earlier = audit_files(log)?;
        earlier.remove(log);
        Ok(Self {
            log: log.to_owned(),
            inode: metadata.ino(),
            offset: metadata.len(),
            earlier,
        })
    }

    /// `user`'s requests from the mark to now (a line cut at the offset is skipped by the counting).
    pub fn requests(&self, user: &str) -> anyhow::Result<Requests> {
        Ok(count(&self.text()?, user))
    }

    /// The log from the mark to now, oldest first (the rotated files sort before the live one: `-` before `.`).
    pub fn text(&self) -> anyhow::Result<String> {
        let mut text = String::new();
        for file in audit_files(&self.log)?.difference(&self.earlier) {
            let bytes =
                std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
            let from = if std::fs::metadata(file)?.ino() == self.inode {
                self.offset as usize
            } else {
                0
            };
            text.push_str(&String::from_utf8_lossy(
                bytes.get(from..).unwrap_or_default(),
            ));
            text.push('\n');
        }
        Ok(text)
    }
}

/// An object as the audit log names it: resource (plural) and name.
pub type Object<'a> = (&'a str, &'a str);

/// From the API server receiving the first write of `cause` in `log` to it completing the last write of `effect`
/// that completed by `until` (the write that left what was then seen; `cause`'s own write where both are one
/// object): how long a writer took to carry a user's change into another object, on the API server's clock, so
/// that neither the client's start nor a poll's period is in it. Writes of subresources (a DaemonSet's status)
/// do not count. `None` when the log has no such pair.
pub fn reaction(
    log: &str,
    cause: Object,
    effect: Object,
    until: Timestamp,
) -> Option<SignedDuration> {
    let mut asked: Option<Timestamp> = None;
    let mut done: Option<Timestamp> = None;
    for event in log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
    {
        let Some((object, received, completed)) = write_of(&event) else {
            continue;
        };
        if asked.is_none() && object == cause {
            asked = Some(received);
        }
        if let Some(asked) = asked
            && object == effect
            && received >= asked
            && completed <= until
        {
            done = Some(completed);
        }
    }
    Some(done?.duration_since(asked?))
}

/// A completed write of an object (not of a subresource) in an audit event: the object, and when the API server
/// received the write and completed it.
fn write_of(event: &serde_json::Value) -> Option<(Object<'_>, Timestamp, Timestamp)> {
    let write = event["stage"] == "ResponseComplete"
        && WRITE_VERBS.contains(&event["verb"].as_str()?)
        && event["objectRef"]["subresource"].is_null();
    if !write {
        return None;
    }
    let object = (
        event["objectRef"]["resource"].as_str()?,
        event["objectRef"]["name"].as_str()?,
    );
    let received = event["requestReceivedTimestamp"].as_str()?.parse().ok()?;
    let completed = event["stageTimestamp"].as_str()?.parse().ok()?;
    Some((object, received, completed))
}

/// The audit log and the rotated files beside it.
fn audit_files(log: &Path) -> anyhow::Result<BTreeSet<PathBuf>> {
    let dir = log.parent().context("the audit log has no folder")?;
    let stem = log
        .file_stem()
        .and_then(|stem| stem.to_str())
        .context("the audit log has no name")?;
    let rotated = format!("{stem}-");
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default();
        if path == log || (name.starts_with(&rotated) && name.ends_with(".log")) {
            files.insert(path);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(stage: &str, verb: &str, user: &str, resource: &str) -> String {
        format!(
            r#"{{"stage":"{stage}","verb":"{verb}","user":{{"username":"{user}"}},"userAgent":"agent/1","objectRef":{{"resource":"{resource}"}}}}"#
        )
    }

    #[test]
    fn counts_each_request_of_the_user_once() {
        let log = [
            event("ResponseComplete", "update", OPERATOR_USER, "leases"),
            event("ResponseComplete", "patch", OPERATOR_USER, "nodes"),
            event("ResponseStarted", "watch", OPERATOR_USER, "nodes"),
            event("ResponseComplete", "watch", OPERATOR_USER, "nodes"),
            event("ResponseComplete", "list", OPERATOR_USER, "nodes"),
            event("ResponseComplete", "update", "system:kube-scheduler", "leases"),
            r#"{"stage":"ResponseComplete","verb":"update","user":{"username":"system:serviceaccount:gpu-operator:gpu-operator"},"objectRef":{"resource":"clusterpolicies","subresource":"status"}}"#.to_owned(),
            r#"{"truncated"#.to_owned(),
        ]
        .join("\n");
        let requests = count(&log, OPERATOR_USER);
        assert_eq!(
            requests.by_kind,
            BTreeMap::from([
                ("list nodes".to_owned(), 1),
                ("patch nodes".to_owned(), 1),
                ("update clusterpolicies/status".to_owned(), 1),
                ("update leases".to_owned(), 1),
                ("watch nodes".to_owned(), 1),
            ])
        );
        assert_eq!(requests.total(), 5);
        assert_eq!(requests.writes(), 2);
        assert_eq!(requests.lease_writes(), 1);
        assert_eq!(requests.user_agents, BTreeSet::from(["agent/1".to_owned()]));
        assert_eq!(count("", OPERATOR_USER), Requests::default());
        let mut sum = requests.clone();
        sum.add(requests);
        assert_eq!(sum.total(), 10);
        assert_eq!(sum.by_kind["patch nodes"], 2);
        assert_eq!(sum.user_agents.len(), 1);
    }

    /// A completed write as the audit log has it, received and completed at seconds past a minute.
    fn write(verb: &str, object: Object, subresource: Option<&str>, seconds: (f64, f64)) -> String {
        let at = |seconds: f64| format!("2026-11-29T02:09:{seconds:09.6}Z");
        serde_json::json!({
            "stage": "ResponseComplete",
            "verb": verb,
            "user": {"username": "anyone"},
            "objectRef": {"resource": object.0, "name": object.1, "subresource": subresource},
            "requestReceivedTimestamp": at(seconds.0),
            "stageTimestamp": at(seconds.1),
        })
        .to_string()
    }

    #[test]
    fn a_reaction_runs_from_the_change_received_to_the_last_write_seen() {
        let policy = ("clusterpolicies", "cluster-policy");
        let toolkit = ("daemonsets", "nvidia-container-toolkit-daemonset");
        let log = [
            // Before the user's change: not the reaction.
            write("patch", toolkit, None, (10.0, 10.1)),
            write("patch", policy, None, (21.5, 21.6)),
            write("update", toolkit, Some("status"), (21.65, 21.66)),
            write("patch", toolkit, None, (21.7, 21.75)),
            write(
                "patch",
                ("daemonsets", "nvidia-dcgm-exporter"),
                None,
                (21.8, 21.9),
            ),
            // After what was seen: not what left it.
            write("patch", toolkit, None, (30.0, 30.2)),
        ]
        .join("\n");
        let seen: Timestamp = "2026-11-29T02:09:25Z".parse().unwrap();
        let reaction = reaction(&log, policy, toolkit, seen).unwrap();
        assert_eq!(
            reaction.as_millis(),
            250,
            "21.5 received to 21.75 completed"
        );
        assert_eq!(
            super::reaction(
                &log,
                toolkit,
                toolkit,
                "2026-11-29T02:09:11Z".parse().unwrap()
            )
            .unwrap()
            .as_millis(),
            100,
            "one object: its own write, received to completed"
        );
        assert!(super::reaction(&log, ("clusterpolicies", "other"), toolkit, seen).is_none());
        assert!(
            super::reaction(
                &log,
                policy,
                toolkit,
                "2026-11-29T02:09:21.7Z".parse().unwrap()
            )
            .is_none(),
            "nothing written by then"
        );
    }

    fn rotated_line(verb: &str) -> String {
        event("ResponseComplete", verb, OPERATOR_USER, "nodes") + "\n"
    }

    #[test]
    fn a_window_spans_the_rotated_files() {
        let dir = std::env::temp_dir().join(format!("harness-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        std::fs::write(
            dir.join("audit-2026-11-27T09-00-00.000.log"),
            rotated_line("list"),
        )
        .unwrap();
        std::fs::write(dir.join("kube-apiserver.log"), rotated_line("list")).unwrap();
        std::fs::write(&log, rotated_line("get")).unwrap();
        let mark = Mark::now(&log).unwrap();
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut file, rotated_line("patch").as_bytes()).unwrap();
        std::fs::rename(&log, dir.join("audit-2026-11-27T10-00-00.000.log")).unwrap();
        std::fs::write(&log, rotated_line("delete")).unwrap();
        let requests = mark.requests(OPERATOR_USER).unwrap();
        assert_eq!(
            requests.by_kind.keys().collect::<Vec<_>>(),
            ["delete nodes", "patch nodes"]
        );
        assert_eq!(requests.total(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
