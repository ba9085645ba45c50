//! A mocked API server for the reconcile steps' unit tests, the way kube-rs's controller example tests its
//! reconciler: kube's client over `tower_test`'s mock service, and a scenario of the requests a step must send,
//! in order, each with its canned answer. A request the scenario does not expect is answered 500 and recorded,
//! so a step that writes when it should not fails its test instead of hanging it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// How the API server answers an expected request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// This HTTP code and JSON body.
    Json(u16, Value),
    /// 201 with the request's own body (an Event created).
    Echo,
    /// An API error with this HTTP code and reason, as the API server writes it.
    Error(u16, &'static str),
}

/// One request a step must send.
#[derive(Debug, Clone)]
pub struct Expected {
    method: Method,
    path: String,
    answer: Answer,
}

/// Expects `method` on `path` (without the query), answered with `answer`.
pub fn expect(method: Method, path: &str, answer: Answer) -> Expected {
    Expected {
        method,
        path: path.to_owned(),
        answer,
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `METHOD path?query`.
    pub line: String,
    /// The JSON body, if any.
    pub body: Value,
    /// Whether the scenario expected it.
    pub expected: bool,
}

/// The server's side of a scenario.
#[derive(Debug, Default)]
struct Script {
    expected: VecDeque<Expected>,
    received: Vec<Received>,
}

/// A running scenario.
#[derive(Debug, Clone)]
pub struct ApiScenario {
    script: Arc<Mutex<Script>>,
}

impl ApiScenario {
    /// Starts a server that expects `expected`, in order; returns it and a client of it.
    pub fn start(expected: Vec<Expected>) -> (Self, Client) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let scenario = Self {
            script: Arc::new(Mutex::new(Script {
                expected: expected.into(),
                received: Vec::new(),
            })),
        };
        let server = scenario.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let answer = server.receive(request).await;
                respond.send_response(answer);
            }
        });
        (scenario, Client::new(service, "default"))
    }

    /// Expects more requests, after those still expected.
    pub fn then(&self, expected: Vec<Expected>) {
        self.lock().expected.extend(expected);
    }

    /// Every request received since the last call; panics when one was unexpected or an expected one is missing.
    pub fn finish(&self) -> Vec<Received> {
        let mut script = self.lock();
        let received = std::mem::take(&mut script.received);
        let unexpected: Vec<&str> = received
            .iter()
            .filter(|request| !request.expected)
            .map(|request| request.line.as_str())
            .collect();
        assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
        let missing: Vec<String> = script
            .expected
            .iter()
            .map(|expected| format!("{} {}", expected.method, expected.path))
            .collect();
        assert!(missing.is_empty(), "requests not sent: {missing:?}");
        received
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().expect("the scenario")
    }

    async fn receive(&self, request: Request<Body>) -> Response<Body> {
        let (head, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let line = format!("{} {}", head.method, head.uri);
        let mut script = self.lock();
        let matches = script
            .expected
            .front()
            .is_some_and(|next| next.method == head.method && next.path == head.uri.path());
        let answer = if matches {
            script.expected.pop_front().map(|next| next.answer)
        } else {
            None
        };
        script.received.push(Received {
            line: line.clone(),
            body: body.clone(),
            expected: answer.is_some(),
        });
        let (code, json) = match answer {
            Some(Answer::Json(code, json)) => (code, json),
            Some(Answer::Echo) => (201, body),
            Some(Answer::Error(code, reason)) => (code, api_error(code, reason, &line)),
            None => (
                500,
                api_error(500, "InternalError", &format!("unexpected {line}")),
            ),
        };
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(json.to_string().into_bytes()))
            .expect("a response")
    }
}

/// An API error body (`Status`), as the API server answers a refused request.
fn api_error(code: u16, reason: &str, line: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": format!("{line}: {reason}"), "reason": reason, "code": code,
    })
}
