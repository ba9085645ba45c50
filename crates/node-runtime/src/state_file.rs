//! Files a node binary writes to survive itself: the DRA driver's checkpoint (read back after a restart), and the
//! files other programs read (CDI specs for the container runtime, validation ready files for the operands).
//!
//! [`write`] replaces a file atomically: a temporary file in the same directory (a rename is atomic only within one
//! file system), renamed over the file. A [`Lifetime::Durable`] file is also flushed to disk before the rename, and
//! its directory after it, so that the rename itself is on disk. Without the flushes a power loss or kernel crash
//! soon after the rename can leave an empty or truncated file, because the rename may reach the disk before the data
//! does. A [`Lifetime::ThisBoot`] file skips both flushes (they are most of a write's time, and of its tail): what
//! it describes is gone after a reboot anyway, and its reader knows the boot it was written in ([`boot_id`]).
//!
//! [`read_json`] is for files a binary reads back. One that exists but does not parse is moved aside (kept for a
//! post-mortem) and reads as no state: the binary starts and rebuilds what it needs instead of crash-looping on it.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::warn;

/// Why a state file cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// A file system operation failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// The value cannot be serialized.
    #[error("cannot serialize {path}: {source}")]
    Serialize {
        /// The file it was for.
        path: PathBuf,
        /// Why it failed.
        source: serde_json::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StateFileError {
    let path = path.to_owned();
    move |source| StateFileError::Io {
        action,
        path,
        source,
    }
}

/// How long a state file's contents must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Across a power loss or a kernel crash: flushed to disk before and after the rename.
    Durable,
    /// Until the node reboots: what the file describes (a claim's CDI spec, MPS daemon or MIG instance) does not
    /// outlive the boot, and its reader checks the boot it was written in. A crash of the writing process loses
    /// nothing (the page cache holds the file), and a crash of the kernel reboots the node.
    ThisBoot,
}

/// The identity of the running boot of this node's kernel (`/proc/sys/kernel/random/boot_id`, the same inside a
/// container): files of [`Lifetime::ThisBoot`] record it, and their readers drop what an earlier boot wrote.
///
/// # Errors
/// When the kernel's file cannot be read.
pub fn boot_id() -> Result<String, StateFileError> {
    let path = Path::new("/proc/sys/kernel/random/boot_id");
    fs::read_to_string(path)
        .map(|id| id.trim().to_owned())
        .map_err(io_error("read", path))
}

/// Replaces `path` with `contents` atomically, flushed to disk as `lifetime` asks; its directory is created when
/// missing.
///
/// # Errors
/// When the directory, the temporary file or the rename cannot be written (the previous file is then intact), or
/// a durable file's directory cannot be flushed after the rename.
pub fn write(path: &Path, contents: &[u8], lifetime: Lifetime) -> Result<(), StateFileError> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io_error("create the directory", dir))?;
    // A fixed name rather than a random one: what a crash leaves behind is overwritten by the next write instead of
    // piling up. Writers of one file are serialized by their callers.
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    let temporary = dir.join(format!(".{}", name.to_string_lossy()));
    let written = File::create(&temporary)
        .and_then(|mut file| {
            file.write_all(contents)?;
            match lifetime {
                Lifetime::Durable => file.sync_all(),
                Lifetime::ThisBoot => Ok(()),
            }
        })
        .map_err(io_error("write", &temporary))
        .and_then(|()| fs::rename(&temporary, path).map_err(io_error("replace", path)));
    if written.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    written?;
    if lifetime == Lifetime::ThisBoot {
        return Ok(());
    }
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io_error("flush the directory", dir))
}

/// Moves the state file `from` to `to`, which may be on another filesystem: written at `to` as [`write`] does, then
/// removed at `from`. When `to` exists already it is the newer of the two, and `from` is only removed; when `from`
/// does not exist, nothing is done.
///
/// # Errors
/// When `from` cannot be read, `to` cannot be written (`from` is then kept) or `from` cannot be removed.
pub fn move_file(from: &Path, to: &Path, lifetime: Lifetime) -> Result<(), StateFileError> {
    if !to.exists() {
        match fs::read(from) {
            Ok(contents) => write(to, &contents, lifetime)?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(io_error("read", from)(error)),
        }
    }
    match fs::remove_file(from) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            Err(io_error("remove", from)(error))
        }
        _ => Ok(()),
    }
}

/// [`write`]s `value` as pretty JSON.
///
/// # Errors
/// When `value` cannot be serialized or the file cannot be written.
pub fn write_json<T: Serialize + ?Sized>(
    path: &Path,
    value: &T,
    lifetime: Lifetime,
) -> Result<(), StateFileError> {
    let contents =
        serde_json::to_vec_pretty(value).map_err(|source| StateFileError::Serialize {
            path: path.to_owned(),
            source,
        })?;
    write(path, &contents, lifetime)
}

/// Reads the JSON file `path`. None when there is none, or when it does not parse (empty, truncated, garbage):
/// then it is moved aside to `<path>.corrupt-<unix seconds>` with a warning, and the caller starts without it.
///
/// # Errors
/// When the file exists but cannot be read, or is corrupt and cannot be moved aside: starting without it would
/// then lose state that may be good, or meet the same file again on the next start.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StateFileError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io_error("read", path)(source)),
    };
    match serde_json::from_slice(&bytes) {
        Ok(value) => Ok(Some(value)),
        Err(error) => {
            let seconds = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_secs());
            let mut aside = path.as_os_str().to_owned();
            aside.push(format!(".corrupt-{seconds}"));
            let aside = PathBuf::from(aside);
            fs::rename(path, &aside).map_err(io_error("move aside the corrupt file", path))?;
            warn!(
                file = %path.display(),
                %error,
                moved_to = %aside.display(),
                "state file is corrupt; moved aside, starting without it"
            );
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().write(bytes)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// What `run` logs, as text.
    fn logged(run: impl FnOnce()) -> String {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, run);
        String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/checkpoint.json");
        for lifetime in [Lifetime::Durable, Lifetime::ThisBoot] {
            write_json(&path, &BTreeMap::from([("a", 1)]), lifetime).unwrap();
            write_json(&path, &BTreeMap::from([("b", 2)]), lifetime).unwrap();
            let read: Option<BTreeMap<String, u32>> = read_json(&path).unwrap();
            assert_eq!(read, Some(BTreeMap::from([("b".to_owned(), 2)])));
            assert_eq!(names(&dir.path().join("state")), ["checkpoint.json"]);
        }
    }

    #[test]
    fn a_failed_write_keeps_the_previous_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: the rename over it fails.
        let path = dir.path().join("checkpoint.json");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), "kept").unwrap();
        let error = write(&path, b"{}", Lifetime::ThisBoot)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&format!("cannot replace {}", path.display())),
            "{error}"
        );
        assert_eq!(names(dir.path()), ["checkpoint.json"]);
        assert_eq!(fs::read_to_string(path.join("inside")).unwrap(), "kept");
    }

    #[test]
    fn the_boot_id_is_the_kernels_uuid_and_stays_the_same() {
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id:?}");
        assert_eq!(id.matches('-').count(), 4, "{id:?}");
        assert_eq!(boot_id().unwrap(), id);
    }

    #[test]
    fn no_file_reads_as_no_state_and_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let read: Option<BTreeMap<String, u32>> =
            read_json(&dir.path().join("checkpoint.json")).unwrap();
        assert_eq!(read, None);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn a_corrupt_file_is_moved_aside_with_a_warning_and_reads_as_no_state() {
        for (case, contents) in [
            ("empty", &b""[..]),
            ("truncated", &br#"{"a": 1, "b"#[..]),
            ("garbage", &[0xff, 0x00, 0x13, 0x37][..]),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("checkpoint.json");
            fs::write(&path, contents).unwrap();
            let mut read = Some(BTreeMap::new());
            let log = logged(|| read = read_json::<BTreeMap<String, u32>>(&path).unwrap());
            assert_eq!(read, None, "{case}");
            let files = names(dir.path());
            assert_eq!(files.len(), 1, "{case}: {files:?}");
            assert!(
                files[0].starts_with("checkpoint.json.corrupt-"),
                "{case}: {files:?}"
            );
            assert_eq!(
                fs::read(dir.path().join(&files[0])).unwrap(),
                contents,
                "{case}: the corrupt file is kept as it was"
            );
            assert!(log.contains("WARN"), "{case}: {log}");
            assert!(
                log.contains(&format!("file={}", path.display())),
                "{case}: {log}"
            );
            assert!(
                log.contains(&format!(
                    "moved_to={}",
                    dir.path().join(&files[0]).display()
                )),
                "{case}: {log}"
            );
            let parse_error =
                serde_json::from_slice::<BTreeMap<String, u32>>(contents).unwrap_err();
            assert!(
                log.contains(&format!("error={parse_error}")),
                "{case}: the parse error is logged: {log}"
            );
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_is_an_error_and_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        fs::create_dir(&path).unwrap();
        let error = read_json::<BTreeMap<String, u32>>(&path)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&format!("cannot read {}", path.display())),
            "{error}"
        );
        assert_eq!(names(dir.path()), ["checkpoint.json"]);
    }
}
