//! The API server as the MIG manager sees it, for unit tests: kube's client over `tower_test`'s mock service,
//! answered by a task that holds one Node, its GPUNode status, the pods on it and the Events, and records every
//! request. Tests say which request fails (`fail_next`) and check what was asked (`requests`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Node;
use kube::client::Body;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// One request the client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// `GET`, `PATCH`, `POST`, ...
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The JSON body, if any.
    pub body: Option<Value>,
}

impl Sent {
    /// `METHOD path`, as the tests list them.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// What the fake server holds.
#[derive(Debug, Default)]
struct Cluster {
    node: Node,
    /// Pods on the node, in every namespace.
    pods: Vec<Value>,
    /// The GPUNode status the MIG manager applied last.
    status: Option<Value>,
    sent: Vec<Sent>,
    /// Requests to refuse, each once.
    failures: Vec<Failure>,
}

/// A request to refuse: the method, how its path ends, a text its body holds, the HTTP code to answer.
#[derive(Debug)]
struct Failure {
    method: Method,
    path: String,
    body: String,
    code: u16,
}

impl Failure {
    fn matches(&self, method: &Method, path: &str, body: Option<&Value>) -> bool {
        let text = body.map(Value::to_string).unwrap_or_default();
        self.method == *method && path.ends_with(&self.path) && text.contains(&self.body)
    }
}

/// The fake API server.
#[derive(Debug, Clone)]
pub struct FakeApi {
    cluster: Arc<Mutex<Cluster>>,
}

impl FakeApi {
    /// A server holding `node`, and a client talking to it.
    pub fn start(node: Node) -> (Self, Client) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = Self {
            cluster: Arc::new(Mutex::new(Cluster {
                node,
                ..Cluster::default()
            })),
        };
        let server = api.clone();
        tokio::spawn(async move {
            // Watches are never answered: they stay open until the client gives up, as on a quiet cluster.
            let mut open_watches = Vec::new();
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let body = body.collect_bytes().await.expect("a request body");
                let body = serde_json::from_slice(&body).ok();
                if parts
                    .uri
                    .query()
                    .is_some_and(|query| query.contains("watch=true"))
                {
                    open_watches.push(respond);
                    continue;
                }
                let (code, answer) = server.answer(parts.method, parts.uri.path(), body);
                let response = Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).expect("JSON")))
                    .expect("a response");
                respond.send_response(response);
            }
        });
        (api, Client::new(service, "default"))
    }

    /// Adds a pod on the node.
    pub fn add_pod(&self, pod: Value) {
        self.lock().pods.push(pod);
    }

    /// The next `method` request whose path ends with `path` and whose JSON body holds `body` is answered with
    /// HTTP `code`.
    pub fn fail_next(&self, method: Method, path: &str, body: &str, code: u16) {
        self.lock().failures.push(Failure {
            method,
            path: path.to_owned(),
            body: body.to_owned(),
            code,
        });
    }

    /// The Node as stored now.
    pub fn node(&self) -> Node {
        self.lock().node.clone()
    }

    /// Replaces the Node (as `kubectl label` would).
    pub fn replace_node(&self, node: Node) {
        self.lock().node = node;
    }

    /// A label of the Node.
    pub fn label(&self, key: &str) -> Option<String> {
        self.lock().node.labels().get(key).cloned()
    }

    /// The GPUNode status last applied.
    pub fn status(&self) -> Value {
        self.lock().status.clone().unwrap_or(Value::Null)
    }

    /// Every request sent so far, and forgets them.
    pub fn take_sent(&self) -> Vec<Sent> {
        std::mem::take(&mut self.lock().sent)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.cluster.lock().expect("the fake API server's state")
    }

    /// The answer to one request: its HTTP status and JSON body.
    fn answer(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut cluster = self.lock();
        cluster.sent.push(Sent {
            method: method.clone(),
            path: path.to_owned(),
            body: body.clone(),
        });
        if let Some(index) = cluster
            .failures
            .iter()
            .position(|failure| failure.matches(&method, path, body.as_ref()))
        {
            let code = cluster.failures.remove(index).code;
            return refusal(code, &format!("{method} {path} refused by the test"));
        }
        let node = cluster.node.name_any();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, segments.as_slice()) {
            (Method::GET, ["api", "v1", "nodes", name]) if *name == node => ok(&cluster.node),
            (Method::PATCH, ["api", "v1", "nodes", name]) if *name == node => {
                merge_metadata(&mut cluster.node, body.as_ref());
                ok(&cluster.node)
            }
            (Method::PATCH, ["apis", "nvidia.com", "v1alpha1", "gpunodes", name, "status"])
                if *name == node =>
            {
                let status = body.unwrap_or_default()["status"].clone();
                cluster.status = Some(status.clone());
                let stored = json!({
                    "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUNode",
                    "metadata": {"name": node}, "spec": {}, "status": status,
                });
                (StatusCode::OK, stored)
            }
            (Method::GET, ["api", "v1", "pods"]) => pod_list(cluster.pods.iter()),
            (Method::GET, ["api", "v1", "namespaces", namespace, "pods"]) => pod_list(
                cluster
                    .pods
                    .iter()
                    .filter(|pod| pod["metadata"]["namespace"] == *namespace),
            ),
            (
                Method::POST,
                [
                    "api",
                    "v1",
                    "namespaces",
                    namespace,
                    "pods",
                    name,
                    "eviction",
                ],
            ) => {
                let evicted = |pod: &Value| {
                    pod["metadata"]["namespace"] == *namespace && pod["metadata"]["name"] == *name
                };
                cluster.pods.retain(|pod| !evicted(pod));
                let done =
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201});
                (StatusCode::CREATED, done)
            }
            (
                Method::POST | Method::PATCH,
                ["apis", "events.k8s.io", "v1", "namespaces", _, "events", ..],
            ) => (StatusCode::CREATED, body.unwrap_or_default()),
            (method, _) => refusal(404, &format!("the fake API server has no {method} {path}")),
        }
    }
}

/// A list of pods, as one page.
fn pod_list<'p>(pods: impl Iterator<Item = &'p Value>) -> (StatusCode, Value) {
    let items: Vec<&Value> = pods.collect();
    let list = json!({
        "apiVersion": "v1", "kind": "PodList",
        "metadata": {"resourceVersion": "1"},
        "items": items,
    });
    (StatusCode::OK, list)
}

fn ok(object: &impl serde::Serialize) -> (StatusCode, Value) {
    (StatusCode::OK, serde_json::to_value(object).expect("JSON"))
}

/// An API error, as the API server answers it.
fn refusal(code: u16, message: &str) -> (StatusCode, Value) {
    let status = StatusCode::from_u16(code).expect("an HTTP code");
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": status.canonical_reason(), "code": code,
    });
    (status, body)
}

/// Applies a JSON merge patch of labels and annotations (`null` removes a key).
fn merge_metadata(node: &mut Node, patch: Option<&Value>) {
    let Some(metadata) = patch.and_then(|patch| patch.get("metadata")) else {
        return;
    };
    merge(node.labels_mut(), metadata.get("labels"));
    merge(node.annotations_mut(), metadata.get("annotations"));
}

fn merge(map: &mut BTreeMap<String, String>, changes: Option<&Value>) {
    for (key, value) in changes.and_then(Value::as_object).into_iter().flatten() {
        match value.as_str() {
            Some(value) => map.insert(key.clone(), value.to_owned()),
            None => map.remove(key),
        };
    }
}
