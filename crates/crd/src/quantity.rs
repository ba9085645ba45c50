//! Kubernetes quantities of bytes, as the API server writes them back (`40Gi`, `3145728k`) and users write them.

/// A value that is not a quantity of bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a quantity of bytes; write one such as 8Gi, 8192Mi or 8589934592")]
pub struct QuantityError {
    /// The value.
    pub value: String,
}

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
        let digits = u32::try_from(fraction.len()).map_err(|_| error())?;
        let scale = 10_u128.checked_pow(digits).ok_or_else(error)?;
        let part: u128 = fraction.parse().map_err(|_| error())?;
        let extra = part * u128::from(multiplier) / scale;
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
        for bad in ["", "Gi", "8 GB", "-1", "1e3"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
