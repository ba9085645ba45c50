//! Kubernetes quantities of bytes, as the API server writes them back (`40Gi`, `3145728k`) and users write them.

/// A value that is not a quantity of bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a quantity of bytes; write one such as 8Gi, 8192Mi or 8589934592")]
pub struct QuantityError {
    /// The value.
    pub value: String,
}

/// Decimal places of a fraction that are read; see [`parse_bytes`].
const FRACTION_DIGITS: usize = 20;

/// A Kubernetes quantity of bytes: a whole or decimal number with an optional suffix (`Ki`, `Mi`, `Gi`, `Ti`,
/// `Pi`, `Ei`, or `k`, `M`, `G`, `T`, `P`, `E`).
///
/// # Errors
/// When the value is not such a quantity.
pub fn parse_bytes(value: &str) -> Result<u64, QuantityError> {
    let error = || QuantityError {
        value: value.to_owned(),
    };
    let text = value.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return Err(error()),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(error());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| error())?
    };
    let mut bytes = whole.checked_mul(multiplier).ok_or_else(error)?;
    if !fraction.is_empty() {
        // Checked in full, as only a prefix of the fraction is read below (`1.000000000000000000000.5` is no number).
        if !fraction.bytes().all(|byte| byte.is_ascii_digit()) {
            return Err(error());
        }
        // The largest multiplier is below 2^61, so 20 digits times it fits 128 bits; the digits past the 20th are
        // worth less than a hundredth of a byte, and the result is whole bytes rounded down.
        let kept = &fraction[..fraction.len().min(FRACTION_DIGITS)];
        let digits = u32::try_from(kept.len()).map_err(|_| error())?;
        let part: u128 = kept.parse().map_err(|_| error())?;
        let extra = part * u128::from(multiplier) / 10_u128.pow(digits);
        bytes = bytes
            .checked_add(u64::try_from(extra).map_err(|_| error())?)
            .ok_or_else(error)?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_decimal_and_fractional_quantities() {
        assert_eq!(parse_bytes("8Gi"), Ok(8 << 30));
        assert_eq!(parse_bytes("3145728k"), Ok(3000 << 20));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes(" 1048576 "), Ok(1 << 20));
        for bad in [
            "",
            "Gi",
            "8 GB",
            "-1",
            "1e3",
            "1.2.3",
            "1.000000000000000000000.5",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    /// Found by the property tests: a fraction of 38 digits times the `Ei` multiplier overflowed 128 bits, which
    /// panicked in debug builds and wrapped in release ones.
    #[test]
    fn a_long_fraction_neither_overflows_nor_changes_the_whole_bytes() {
        let nines = "9".repeat(38);
        assert_eq!(parse_bytes(&format!("0.{nines}Ei")), Ok((1 << 60) - 1));
        assert_eq!(parse_bytes(&format!("1.{nines}")), Ok(1));
        // The case the property test shrank the overflow to.
        assert_eq!(
            parse_bytes("0.340283000000000000000000000000000000Ki"),
            Ok(348)
        );
        assert_eq!(parse_bytes(&format!("0.5{}Ki", "0".repeat(400))), Ok(512));
        assert!(parse_bytes(&format!("15.{nines}Ei")).is_ok());
        assert!(parse_bytes(&format!("16.{nines}Ei")).is_err());
    }
}

/// Property tests: any text is a quantity or an error, never a panic, and a quantity is the exact value its digits
/// and suffix say, rounded down to whole bytes, or an error when that does not fit 64 bits.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use proptest::sample::select;

    use super::{FRACTION_DIGITS, parse_bytes};

    /// Cases per property, a few milliseconds each.
    const CASES: u32 = 1024;

    /// The suffixes and what they multiply by.
    const SUFFIXES: [(&str, u64); 13] = [
        ("", 1),
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];

    /// The value of `whole.fraction` times `multiplier`, rounded down, summed in 128 bits, which hold both parts:
    /// the whole part is below 2^64 times a multiplier below 2^61, and at most 20 fraction digits are significant
    /// (see [`FRACTION_DIGITS`]), below 2^67 times the multiplier.
    fn expected(whole: u64, fraction: &str, multiplier: u64) -> Option<u64> {
        let kept = &fraction[..fraction.len().min(FRACTION_DIGITS)];
        let part: u128 = kept.parse().unwrap_or(0);
        let scale = 10_u128.pow(u32::try_from(kept.len()).unwrap_or(0));
        let multiplier = u128::from(multiplier);
        u64::try_from(u128::from(whole) * multiplier + part * multiplier / scale).ok()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(CASES))]

        /// Any text: a value or an error, no panic.
        #[test]
        fn any_text_is_a_quantity_or_an_error(text in "\\PC{0,40}") {
            let _ = parse_bytes(&text);
        }

        /// Digits, an optional fraction and a suffix: exactly the value they say, or an error when it overflows.
        #[test]
        fn quantities_are_exact_or_refused_when_they_overflow(
            whole in prop_oneof![0_u64..100_000, any::<u64>()],
            fraction in prop::option::of("[0-9]{1,60}"),
            (suffix, multiplier) in select(SUFFIXES.to_vec()),
        ) {
            let text = match &fraction {
                Some(fraction) => format!("{whole}.{fraction}{suffix}"),
                None => format!("{whole}{suffix}"),
            };
            let expected = expected(whole, fraction.as_deref().unwrap_or(""), multiplier);
            prop_assert_eq!(parse_bytes(&text).ok(), expected, "{}", text);
        }

        /// A whole number of bytes written plainly reads back as itself.
        #[test]
        fn plain_byte_counts_round_trip(bytes in any::<u64>()) {
            prop_assert_eq!(parse_bytes(&bytes.to_string()), Ok(bytes));
        }
    }
}
