//! Human-readable durations ("250ms", "30s", "10y") and sizes ("1 MiB") in the config file.

use serde::Deserialize;

/// A duration in the config: a number of milliseconds or a string with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a duration such as \"30s\" or \"250ms\", or a whole number of milliseconds"
)]
pub enum HumanDuration {
    Millis(u64),
    Text(String),
}

impl HumanDuration {
    pub fn to_ms(&self) -> Result<u64, String> {
        match self {
            HumanDuration::Millis(ms) => Ok(*ms),
            HumanDuration::Text(text) => parse_duration_ms(text),
        }
    }
}

/// A size in the config: a number of bytes or a string with a unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a size such as \"1 MiB\" or \"64KiB\", or a whole number of bytes"
)]
pub enum HumanSize {
    Bytes(u64),
    Text(String),
}

impl HumanSize {
    pub fn to_bytes(&self) -> Result<u64, String> {
        match self {
            HumanSize::Bytes(n) => Ok(*n),
            HumanSize::Text(text) => parse_size_bytes(text),
        }
    }
}

fn split_number(text: &str) -> Result<(f64, String), String> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    Ok((number, unit.trim().to_ascii_lowercase()))
}

/// A duration with its unit, in milliseconds. A number without a unit is refused (except 0):
/// "30" reads as seconds to some and as milliseconds to others, and either guess is off by a
/// factor of 1,000 for the rest. (A TOML integer, `HumanDuration::Millis`, is milliseconds.)
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let (number, unit) = split_number(text)?;
    let factor: f64 = match unit.as_str() {
        "" if number == 0.0 => 0.0,
        "" => {
            let n = text.trim();
            return Err(format!(
                "{n:?} has no unit: write \"{n}ms\" or \"{n}s\" (units: ms, s, m, h, d, w, y)"
            ));
        }
        "ms" => 1.0,
        "s" | "sec" => 1_000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        "w" => 7.0 * 86_400_000.0,
        "y" => 365.0 * 86_400_000.0,
        _ => {
            return Err(format!(
                "unknown duration unit in {text:?}; use ms, s, m, h, d, w or y (e.g. \"30s\")"
            ))
        }
    };
    let ms = number * factor;
    if !ms.is_finite() || ms > u64::MAX as f64 / 2.0 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(ms.round() as u64)
}

pub fn parse_size_bytes(text: &str) -> Result<u64, String> {
    let (number, unit) = split_number(text)?;
    let factor: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "unknown size unit in {text:?}; use B, KiB, MiB, GiB, kB, MB or GB (e.g. \"1 MiB\")"
            ))
        }
    };
    let bytes = number * factor;
    if !bytes.is_finite() || bytes > u64::MAX as f64 / 2.0 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_durations() {
        let check =
            |text: &str, ms: Option<u64>| assert_eq!(parse_duration_ms(text).ok(), ms, "{text}");
        check("250ms", Some(250));
        check("30s", Some(30_000));
        check("30", None);
        check("0", Some(0));
        check("1.5 m", Some(90_000));
        check("2h", Some(7_200_000));
        check("10y", Some(315_360_000_000));
        check("5 fortnights", None);
        check("s", None);
        let no_unit = parse_duration_ms(" 1000 ").unwrap_err();
        assert!(no_unit.contains("\"1000ms\" or \"1000s\""), "{no_unit}");
    }

    #[test]
    fn check_sizes() {
        let check =
            |text: &str, n: Option<u64>| assert_eq!(parse_size_bytes(text).ok(), n, "{text}");
        check("1 MiB", Some(1_048_576));
        check("512KiB", Some(524_288));
        check("1MB", Some(1_000_000));
        check("42", Some(42));
        check("1 parsec", None);
        check("", None);
    }
}
