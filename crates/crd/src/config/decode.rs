//! Text to typed value: YAML (a superset of JSON) into `serde_json::Value`, version check, then typed
//! deserialization that records the path of the field that failed.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ConfigError;

/// Whether a format insists on `version: v1`. mig-parted refuses a file without it; the device plugin reads a
/// missing version as `v1`, and we must accept the files it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionField {
    /// A missing `version` is an error.
    Required,
    /// A missing `version` means `v1`.
    Optional,
}

/// Parses `text` into `T`, with the version checked first so that a file of another version gets one clear error
/// rather than a list of unknown fields.
pub(crate) fn decode<T: DeserializeOwned>(
    text: &str,
    version: VersionField,
) -> Result<T, ConfigError> {
    typed(document(text, version)?)
}

/// The document of `text` with its version checked, before typed deserialization.
pub(crate) fn document(text: &str, version: VersionField) -> Result<Value, ConfigError> {
    let value: Value = serde_saphyr::from_str(text)
        .map_err(|error| ConfigError::Syntax(error.without_snippet().to_string()))?;
    let Value::Object(fields) = &value else {
        return Err(ConfigError::invalid(
            "",
            format!(
                "expected a mapping with \"version: v1\" at the top level, found {}",
                describe(&value)
            ),
        ));
    };
    match fields.get("version") {
        Some(Value::String(found)) if found == "v1" => {}
        Some(found) => {
            return Err(ConfigError::invalid(
                "version",
                format!("unsupported version {found}, expected \"v1\""),
            ));
        }
        None if version == VersionField::Required => {
            return Err(ConfigError::invalid("", "missing field \"version\""));
        }
        None => {}
    }
    Ok(value)
}

/// Typed deserialization of a document, the error naming the path of the field that failed.
pub(crate) fn typed<T: DeserializeOwned>(value: Value) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|error| path_error(&error))
}

/// A deserialization error as a [`ConfigError`] with the field's path.
pub(crate) fn path_error(error: &serde_path_to_error::Error<serde_json::Error>) -> ConfigError {
    let path = error.path().to_string();
    // serde quotes names with backticks; the rest of our messages use double quotes, as YAML does.
    let message = error.inner().to_string().replace('`', "\"");
    ConfigError::invalid(if path == "." { String::new() } else { path }, message)
}

/// What kind of YAML value this is, for messages.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "an empty document",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;
    use crate::config::ConfigVersion;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        #[allow(dead_code)]
        version: ConfigVersion,
        #[allow(dead_code)]
        items: BTreeMap<String, Vec<u32>>,
    }

    fn error(text: &str) -> String {
        decode::<Doc>(text, VersionField::Required)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn yaml_and_json_both_parse() {
        decode::<Doc>("version: v1\nitems: {a: [1]}\n", VersionField::Required).unwrap();
        decode::<Doc>(
            r#"{"version": "v1", "items": {"a": [1]}}"#,
            VersionField::Required,
        )
        .unwrap();
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        assert_eq!(
            error("version: v1\nitems:\n  a: [1\n  b: 2\n"),
            "invalid YAML: illegal placement of ':' indicator at line 4, column 4"
        );
    }

    #[test]
    fn document_shape_and_version_come_first() {
        assert_eq!(
            error(""),
            "expected a mapping with \"version: v1\" at the top level, found an empty document"
        );
        assert_eq!(
            error("- a\n"),
            "expected a mapping with \"version: v1\" at the top level, found a list"
        );
        assert_eq!(error("items: {}\n"), "missing field \"version\"");
        assert_eq!(
            error("version: v2\nbogus: 1\n"),
            "version: unsupported version \"v2\", expected \"v1\""
        );
        assert_eq!(
            error("version: 1\n"),
            "version: unsupported version 1, expected \"v1\""
        );
    }

    #[test]
    fn serde_errors_carry_the_path_and_double_quotes() {
        assert_eq!(
            error("version: v1\nitems: {a: [1, x]}\n"),
            "items.a[1]: invalid type: string \"x\", expected u32"
        );
        assert_eq!(
            error("version: v1\nitems: {}\nextra: 1\n"),
            "extra: unknown field \"extra\", expected \"version\" or \"items\""
        );
        assert_eq!(error("version: v1\n"), "missing field \"items\"");
    }

    /// Input that would exhaust the stack or memory of a recursive reader is refused by the YAML reader's budget:
    /// flow and block nesting past its depth, and aliases that expand to more nodes than it allows.
    #[test]
    fn nesting_and_alias_bombs_are_refused() {
        let deep_flow = format!(
            "version: v1\nx: {}{}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(matches!(
            document(&deep_flow, VersionField::Required),
            Err(ConfigError::Syntax(message)) if message.contains("recursion limit")
        ));
        let deep_block: String = (0..5000)
            .map(|depth| format!("{}- \n", "  ".repeat(depth)))
            .collect();
        assert!(matches!(
            document(&format!("version: v1\nx:\n{deep_block}"), VersionField::Required),
            Err(ConfigError::Syntax(message)) if message.contains("budget breached: Depth")
        ));
        let mut bomb = String::from("version: v1\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..10 {
            let previous = format!("*a{}", level - 1);
            let list = [previous.as_str(); 10].join(", ");
            bomb.push_str(&format!("a{level}: &a{level} [{list}]\n"));
        }
        assert!(matches!(
            document(&bomb, VersionField::Required),
            Err(ConfigError::Syntax(message)) if message.contains("budget breached: Nodes")
        ));
    }
}
