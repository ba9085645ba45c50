//! What a writer logged, for the writers whose report of a refusal is a log line: an Event is never worth
//! failing the work it tells of, so a refused Event is logged, and the test checks that the line names what it
//! was about.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing_subscriber::fmt::MakeWriter;

/// The log lines (warnings and errors) written while `work` runs on this thread; the test must run on one
/// thread (`#[tokio::test]`'s default runtime).
pub async fn warnings<T>(work: impl Future<Output = T>) -> (T, String) {
    let lines = Lines::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(lines.clone())
        .finish();
    let result = {
        let _guard = tracing::subscriber::set_default(subscriber);
        work.await
    };
    let text = String::from_utf8_lossy(&lines.0.lock().expect("the log")).into_owned();
    (result, text)
}

/// The lines written, shared with the subscriber.
#[derive(Debug, Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
