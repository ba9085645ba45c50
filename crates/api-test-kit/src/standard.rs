//! The four standard tests every writer to the API server passes, written once: a writer's test gives the fake
//! server in the state the check needs and `pass`, a closure that runs the writer once (one call, or one pass of
//! its loop) and returns its own report of a failure as text. The checks stand for what an operator on call
//! relies on: nothing is written at rest, what is missing is made, a conflict costs one retry and loses nothing,
//! and a refusal is reported with the object and the reason instead of being swallowed.

use http::Method;
use serde_json::Value;

use crate::{FakeApi, Request};

/// Who retries a write the API server answered with 409 Conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The writer, within the same call: the pass succeeds.
    Itself,
    /// The writer's loop: the pass fails (so the loop runs again instead of taking the work as done) and the
    /// next pass succeeds.
    NextPass,
}

/// (a) Unchanged → no write: after a pass that made the cluster as the writer wants it, a second pass over the
/// same state sends no write request at all (it may read). Returns the first pass's requests.
///
/// # Panics
/// When a pass fails or the second pass writes.
pub async fn unchanged_is_not_written(
    api: &FakeApi,
    mut pass: impl AsyncFnMut() -> Result<(), String>,
) -> Vec<Request> {
    pass()
        .await
        .unwrap_or_else(|error| panic!("the first pass failed: {error}"));
    let first = api.take_requests();
    pass()
        .await
        .unwrap_or_else(|error| panic!("the second pass failed: {error}"));
    let writes: Vec<String> = api
        .take_requests()
        .iter()
        .filter(|request| request.is_write())
        .map(Request::line)
        .collect();
    assert!(
        writes.is_empty(),
        "nothing changed, yet the writer wrote: {writes:?}"
    );
    first
}

/// (b) Missing → created: the object at `path` does not exist; one pass creates it. Returns it, for the test's
/// checks of its content.
///
/// # Panics
/// When the object exists before the pass, the pass fails or the object is not there after it.
pub async fn missing_is_created(
    api: &FakeApi,
    path: &str,
    mut pass: impl AsyncFnMut() -> Result<(), String>,
) -> Value {
    assert!(api.object(path).is_none(), "{path} exists before the pass");
    pass()
        .await
        .unwrap_or_else(|error| panic!("the pass failed: {error}"));
    api.object(path)
        .unwrap_or_else(|| panic!("{path} was not created"))
}

/// (c) Conflict → retried: the writer's next `method` request whose path ends with `path_end` is answered 409
/// Conflict; the write is retried by whoever `retry` says, and then succeeds. Returns the requests of the passes,
/// for the test's checks that nothing was lost (the object as the writer wants it).
///
/// # Panics
/// When the writer never sent that request, did not send it again, or the passes did not end as `retry` says.
pub async fn conflict_is_retried(
    api: &FakeApi,
    method: Method,
    path_end: &str,
    retry: Retry,
    mut pass: impl AsyncFnMut() -> Result<(), String>,
) -> Vec<Request> {
    api.take_requests();
    api.fail_next(method.clone(), path_end, 409);
    let first = pass().await;
    assert_eq!(
        api.failures_left(),
        0,
        "the writer never sent {method} …{path_end}"
    );
    match retry {
        Retry::Itself => {
            first.unwrap_or_else(|error| {
                panic!("the writer did not retry the conflict itself: {error}")
            });
        }
        Retry::NextPass => {
            assert!(
                first.is_err(),
                "the conflict was taken as success: the loop would not retry it"
            );
            pass()
                .await
                .unwrap_or_else(|error| panic!("the next pass failed: {error}"));
        }
    }
    let requests = api.take_requests();
    let sent = requests
        .iter()
        .filter(|request| request.method == method && request.path.ends_with(path_end))
        .count();
    assert!(
        sent >= 2,
        "the conflicting {method} …{path_end} was not sent again"
    );
    requests
}

/// (d) Refused → reported: the writer's next `method` request whose path ends with `path_end` is refused with
/// `code` (403 Forbidden, 422 Invalid); returns what the pass returned, for the test's checks of the report
/// (the error, or the Event or condition it wrote), which [`assert_names`] helps with.
///
/// # Panics
/// When the writer never sent that request.
pub async fn refusal_is_reported(
    api: &FakeApi,
    method: Method,
    path_end: &str,
    code: u16,
    mut pass: impl AsyncFnMut() -> Result<(), String>,
) -> Result<(), String> {
    api.fail_next(method.clone(), path_end, code);
    let outcome = pass().await;
    assert_eq!(
        api.failures_left(),
        0,
        "the writer never sent {method} …{path_end}"
    );
    outcome
}

/// (d) for a writer whose report is the error it returns: the next matching request is refused with 403
/// Forbidden, then with 422 Invalid, and each pass fails with an error that names `object` and the reason.
///
/// # Panics
/// When a pass succeeds, never sends the request, or its error does not name both.
pub async fn refusals_are_errors(
    api: &FakeApi,
    method: Method,
    path_end: &str,
    object: &str,
    mut pass: impl AsyncFnMut() -> Result<(), String>,
) {
    for code in [403, 422] {
        api.fail_next(method.clone(), path_end, code);
        let outcome = pass().await;
        assert_eq!(
            api.failures_left(),
            0,
            "the writer never sent {method} …{path_end}"
        );
        let error = outcome.expect_err("the refusal was swallowed: the pass succeeded");
        assert_names(&error, object, code);
    }
}

/// Asserts that a failure's report names `object` and the API server's reason for `code`.
///
/// # Panics
/// When it does not.
pub fn assert_names(report: &str, object: &str, code: u16) {
    let reason = crate::reason(code);
    assert!(
        report.contains(object) && report.contains(reason),
        "the report does not name {object} and {reason}: {report}"
    );
}
