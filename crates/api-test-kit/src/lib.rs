//! A fake Kubernetes API server behind kube's [`Client`], for the unit tests of everything that writes to the API
//! server: kube's client over `tower_test`'s mock service (the way kube-rs tests its own controllers), answered by a
//! task of this crate. One harness, two modes:
//!
//! - **stateful** ([`FakeApi::start`]): the server holds objects by path and answers GET, list, POST, PATCH (merge
//!   and server-side apply, which creates what is missing), PUT and DELETE as the API server does for what our
//!   writers need, so a test states the cluster and reads back what the writer made of it;
//! - **scripted** ([`FakeApi::scripted`]): the requests a step must send, in order, each with its canned answer, for
//!   tests whose point is the exact sequence (the operator's reconcile steps). A request the script does not expect
//!   is answered 500 and recorded, so a step that writes when it should not fails its test instead of hanging it.
//!
//! Both record every request (method, path, query, body), and in both a test can refuse the next matching request
//! with an HTTP code and a real `Status` body ([`FakeApi::fail_next`]), as the API server refuses it. The four
//! standard checks every writer passes are in [`standard`].

pub mod logs;
pub mod standard;
mod store;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use http::header::CONTENT_TYPE;
use http::{Method, Response};
use kube::client::Body;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use store::Store;

/// One request the fake API server received.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `GET`, `PATCH`, `POST`, ...
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The query as sent (still URL-encoded), empty when none.
    pub query: String,
    /// The JSON body, `null` when there is none.
    pub body: Value,
}

impl Request {
    /// `METHOD path`, the way tests list what was sent.
    #[must_use]
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// Whether the request changes something (anything but a read).
    #[must_use]
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// A query parameter, decoded.
    #[must_use]
    pub fn param(&self, name: &str) -> Option<String> {
        store::params(&self.query).find_map(|(key, value)| (key == name).then_some(value))
    }
}

/// How a scripted server answers an expected request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// This HTTP code and JSON body.
    Json(u16, Value),
    /// 201 with the request's own body (an Event created).
    Echo,
    /// An API error with this HTTP code and reason, as the API server writes it.
    Error(u16, &'static str),
}

/// One request a scripted server expects.
#[derive(Debug, Clone)]
pub struct Expected {
    method: Method,
    path: String,
    answer: Answer,
}

/// Expects `method` on `path` (without the query), answered with `answer`.
#[must_use]
pub fn expect(method: Method, path: &str, answer: Answer) -> Expected {
    Expected {
        method,
        path: path.to_owned(),
        answer,
    }
}

/// A request to refuse once: the method, how its path ends, a text its JSON body holds, the HTTP code.
#[derive(Debug)]
struct Failure {
    method: Method,
    path_end: String,
    body: String,
    code: u16,
}

impl Failure {
    fn matches(&self, request: &Request) -> bool {
        self.method == request.method
            && request.path.ends_with(&self.path_end)
            && request.body.to_string().contains(&self.body)
    }
}

/// What the server holds.
#[derive(Debug, Default)]
struct State {
    store: Store,
    /// The scripted mode's requests still expected; `None` in the stateful mode.
    script: Option<VecDeque<Expected>>,
    /// The scripted mode's requests that were not expected, since the last [`FakeApi::finish`].
    unexpected: Vec<String>,
    failures: Vec<Failure>,
    requests: Vec<Request>,
}

/// The fake API server; clones share it.
#[derive(Debug, Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

impl FakeApi {
    /// A stateful server holding nothing yet, and a client of it. Watches are held open and never answered, as
    /// on a quiet cluster, and are not recorded.
    #[must_use]
    pub fn start() -> (Self, Client) {
        Self::serve(State::default())
    }

    /// A scripted server that expects `expected`, in order, and a client of it.
    #[must_use]
    pub fn scripted(expected: Vec<Expected>) -> (Self, Client) {
        Self::serve(State {
            script: Some(expected.into()),
            ..State::default()
        })
    }

    fn serve(state: State) -> (Self, Client) {
        let (service, mut handle) = tower_test::mock::pair::<http::Request<Body>, Response<Body>>();
        let api = Self {
            state: Arc::new(Mutex::new(state)),
        };
        let server = api.clone();
        tokio::spawn(async move {
            let mut open_watches = Vec::new();
            while let Some((request, respond)) = handle.next_request().await {
                let (head, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let content_type = head
                    .headers
                    .get(CONTENT_TYPE)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let request = Request {
                    method: head.method,
                    path: head.uri.path().to_owned(),
                    query: head.uri.query().unwrap_or_default().to_owned(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                match server.answer(request, &content_type) {
                    Some((code, body)) => respond.send_response(
                        Response::builder()
                            .status(code)
                            .header(CONTENT_TYPE, "application/json")
                            .body(Body::from(body.to_string().into_bytes()))
                            .expect("a response"),
                    ),
                    None => open_watches.push(respond),
                }
            }
        });
        (api, Client::new(service, "default"))
    }

    /// The next `method` request whose path ends with `path_end` is refused with HTTP `code` and its usual
    /// reason (409 Conflict, 403 Forbidden, 422 Invalid, 500 InternalError, ...), whatever the mode.
    pub fn fail_next(&self, method: Method, path_end: &str, code: u16) {
        self.fail_next_holding(method, path_end, "", code);
    }

    /// As [`FakeApi::fail_next`], for a request whose JSON body also holds `body` (e.g. `"state":"success"`).
    pub fn fail_next_holding(&self, method: Method, path_end: &str, body: &str, code: u16) {
        self.lock().failures.push(Failure {
            method,
            path_end: path_end.to_owned(),
            body: body.to_owned(),
            code,
        });
    }

    /// How many refusals asked for are still waiting for their request.
    #[must_use]
    pub fn failures_left(&self) -> usize {
        self.lock().failures.len()
    }

    /// Every request received so far, and forgets them.
    pub fn take_requests(&self) -> Vec<Request> {
        std::mem::take(&mut self.lock().requests)
    }

    /// Stores `object` as it is (a test's starting state, or a change made behind the writer's back, as
    /// `kubectl` would make it).
    pub fn insert<K>(&self, object: &K)
    where
        K: Resource<DynamicType = ()> + Serialize,
    {
        let path = object_path::<K>(
            object.meta().namespace.as_deref(),
            &object.meta().name.clone().unwrap_or_default(),
        );
        let value = serde_json::to_value(object).expect("an object serialises");
        self.lock().store.insert(path, value);
    }

    /// The object stored at `path` (e.g. `/api/v1/nodes/gpu-0`), as JSON.
    #[must_use]
    pub fn object(&self, path: &str) -> Option<Value> {
        self.lock().store.get(path).cloned()
    }

    /// The object of type `K` called `name` (in `namespace`, when it is namespaced).
    #[must_use]
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let object = self.object(&object_path::<K>(namespace, name))?;
        Some(serde_json::from_value(object).expect("the stored object reads as its type"))
    }

    /// The objects stored under `collection` (e.g. `/apis/events.k8s.io/v1/namespaces/team/events`), by path.
    #[must_use]
    pub fn objects(&self, collection: &str) -> Vec<Value> {
        let prefix = format!("{collection}/");
        self.lock().store.under(&prefix)
    }

    /// Removes the object at `path`, as someone deleting it behind the writer's back.
    pub fn remove(&self, path: &str) {
        self.lock().store.remove(path);
    }

    /// A scripted server expects more requests, after those still expected.
    ///
    /// # Panics
    /// On a stateful server.
    pub fn then(&self, expected: Vec<Expected>) {
        self.lock()
            .script
            .as_mut()
            .expect("a scripted server")
            .extend(expected);
    }

    /// Every request received since the last call; panics when a scripted server received one it did not expect
    /// or still expects one.
    pub fn finish(&self) -> Vec<Request> {
        let mut state = self.lock();
        let unexpected = std::mem::take(&mut state.unexpected);
        assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
        let missing: Vec<String> = state
            .script
            .iter()
            .flatten()
            .map(|expected| format!("{} {}", expected.method, expected.path))
            .collect();
        assert!(missing.is_empty(), "requests not sent: {missing:?}");
        std::mem::take(&mut state.requests)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("the fake API server's state")
    }

    /// The answer to one request, its HTTP code and JSON body; `None` for a watch, which stays open.
    fn answer(&self, request: Request, content_type: &str) -> Option<(u16, Value)> {
        let mut state = self.lock();
        let state = &mut *state;
        if state.script.is_none() && request.param("watch").as_deref() == Some("true") {
            return None;
        }
        state.requests.push(request.clone());
        if let Some(index) = state
            .failures
            .iter()
            .position(|failure| failure.matches(&request))
        {
            let code = state.failures.remove(index).code;
            return Some((code, status(code, reason(code), "refused by the test")));
        }
        let Some(script) = state.script.as_mut() else {
            return Some(state.store.answer(&request, content_type));
        };
        let line = format!("{} {}?{}", request.method, request.path, request.query);
        let expected = script
            .front()
            .is_some_and(|next| next.method == request.method && next.path == request.path);
        if !expected {
            state.unexpected.push(line.clone());
            let message = format!("unexpected {line}");
            return Some((500, status(500, "InternalError", &message)));
        }
        Some(
            match script.pop_front().expect("the expected request").answer {
                Answer::Json(code, body) => (code, body),
                Answer::Echo => (201, request.body),
                Answer::Error(code, reason) => {
                    (code, status(code, reason, &format!("{line}: {reason}")))
                }
            },
        )
    }
}

/// The path of an object of type `K`.
fn object_path<K: Resource<DynamicType = ()>>(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", K::url_path(&(), namespace))
}

/// An API error body (`Status`), as the API server answers a refused request.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

/// The reason the API server gives with an HTTP code.
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Gone",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    }
}

#[cfg(test)]
mod tests;
