//! The one error type of both config formats.

/// A config file that cannot be used, and why. `Display` is the text users see: `<path>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The text is not YAML (or JSON); the parser's message, with line and column.
    #[error("invalid YAML: {0}")]
    Syntax(String),
    /// The document breaks the format at `path` (dotted fields and `[index]`, e.g.
    /// `mig-configs.all-balanced[0].mig-devices`; empty for the document as a whole).
    #[error("{}", located(path, message))]
    Invalid {
        /// Where in the document.
        path: String,
        /// What is wrong, and the fix where there is one.
        message: String,
    },
}

impl ConfigError {
    /// An error at `path`.
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Where in the document the problem is; empty for syntax errors and for the document as a whole.
    #[must_use]
    pub fn path(&self) -> &str {
        match self {
            Self::Syntax(_) => "",
            Self::Invalid { path, .. } => path,
        }
    }
}

/// `path: message`, or the message alone when the problem is the whole document.
fn located(path: &str, message: &str) -> String {
    if path.is_empty() {
        message.to_owned()
    } else {
        format!("{path}: {message}")
    }
}

/// An error in one config of a ConfigMap that holds several, named by its key: `<key>: <path>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {error}")]
pub struct NamedConfigError {
    /// The ConfigMap key (the config name nodes select by label).
    pub key: String,
    /// What is wrong with that config.
    pub error: ConfigError,
}
