//! Go-style durations (`60s`, `1m30s`, `500ms`), the form NVIDIA's config takes for `gfd.sleepInterval`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A non-negative duration written as Go's `time.ParseDuration` reads it, or as a number of nanoseconds (which
/// NVIDIA's parser also accepts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

/// Nanoseconds per unit suffix.
fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses `<number>[.<fraction>]<unit>` repeated, or `0`.
fn parse(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let is_number = |c: char| c.is_ascii_digit() || c == '.';
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (number, tail) =
            rest.split_at(rest.find(|c: char| !is_number(c)).unwrap_or(rest.len()));
        let (unit, tail) = tail.split_at(tail.find(is_number).unwrap_or(tail.len()));
        let nanos = unit_nanos(unit)?;
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty()
            || !fraction.bytes().all(|byte| byte.is_ascii_digit())
        {
            return None;
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        total = total.checked_add(whole.checked_mul(nanos)?)?;
        if !fraction.is_empty() {
            let scale = 10_u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
            total =
                total.checked_add(fraction.parse::<u128>().ok()?.checked_mul(nanos)? / scale)?;
        }
        rest = tail;
    }
    Some(Duration::from_nanos(u64::try_from(total).ok()?))
}

impl fmt::Display for GoDuration {
    /// Whole seconds as `<n>s`, anything finer as `<n>ns`: both read back exactly.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.subsec_nanos() == 0 {
            write!(f, "{}s", self.0.as_secs())
        } else {
            write!(f, "{}ns", self.0.as_nanos())
        }
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(GoDurationVisitor)
    }
}

/// Reads a duration string or a number of nanoseconds.
struct GoDurationVisitor;

impl Visitor<'_> for GoDurationVisitor {
    type Value = GoDuration;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a duration such as \"60s\"")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        parse(value).map(GoDuration).ok_or_else(|| {
            E::custom(format!(
                "\"{value}\" is not a duration (use a number and a unit of h, m, s, ms, us or ns, e.g. 60s or 1m30s)"
            ))
        })
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        Ok(GoDuration(Duration::from_nanos(value)))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        Err(E::custom(format!(
            "{value} is not a duration (it must not be negative)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_forms_parse() {
        assert_eq!(parse("60s"), Some(Duration::from_secs(60)));
        assert_eq!(parse("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse("2us"), Some(Duration::from_micros(2)));
        assert_eq!(parse("0"), Some(Duration::ZERO));
        for bad in ["", "60", "s", "1x", "-1s", "1..5s", ".s", "1 s"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn display_reads_back() {
        for text in ["60s", "1m30s", "1.25s", "7ns"] {
            let duration = GoDuration(parse(text).unwrap());
            assert_eq!(parse(&duration.to_string()), Some(duration.0));
        }
    }
}
