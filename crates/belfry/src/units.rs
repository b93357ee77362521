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

/// A duration with its unit, in milliseconds: one part ("90s", "1.5 m") or several, largest
/// first or not ("1m 30s", "1h30m", the form the CLI prints durations in). A number without a
/// unit is refused (except 0): "30" reads as seconds to some and as milliseconds to others,
/// and either guess is off by a factor of 1,000 for the rest. (A TOML integer,
/// `HumanDuration::Millis`, is milliseconds.)
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let mut rest = trimmed;
    let mut ms = 0.0;
    while !rest.is_empty() {
        let (part, after) = next_part(rest);
        // "6M" could be meant as months: an upper-case M (in M, MS, MIN) is refused rather than
        // read as minutes. Other units take any case ("30S").
        if part.contains('M') {
            return Err(format!(
                "{trimmed:?}: write minutes as \"m\" and milliseconds as \"ms\", in lower \
                 case (units: ms, s, m, h, d, w, y): \"M\" could mean months"
            ));
        }
        let (number, unit) = split_number(part).map_err(|e| {
            if rest.len() == trimmed.len() {
                e
            } else {
                format!("{trimmed:?}: expected a number and a unit at {rest:?}")
            }
        })?;
        let factor: f64 = match unit.as_str() {
            "" if number == 0.0 && part.len() == trimmed.len() => 0.0,
            "" if part.len() == trimmed.len() => {
                return Err(format!(
                    "{trimmed:?} has no unit: write \"{trimmed}ms\" or \"{trimmed}s\" (units: ms, s, \
                     m, h, d, w, y)"
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
                    "unknown duration unit in {text:?}; use ms, s, m, h, d, w or y, one number \
                     each (e.g. \"30s\", \"1m 30s\")"
                ))
            }
        };
        ms += number * factor;
        rest = after.trim_start();
    }
    if trimmed.is_empty() {
        return Err("an empty duration: write one such as \"30s\"".into());
    }
    if !ms.is_finite() || ms > u64::MAX as f64 / 2.0 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(ms.round() as u64)
}

/// The first part of a duration ("1m" of "1m 30s", "1h" of "1h30m", "1.5 m" of "1.5 m"): a
/// number, spaces, and the letters after it; and what follows.
fn next_part(text: &str) -> (&str, &str) {
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let unit_start =
        number_end + (text[number_end..].len() - text[number_end..].trim_start().len());
    let unit_end = text[unit_start..]
        .find(|c: char| !c.is_alphabetic())
        .map_or(text.len(), |at| unit_start + at);
    text.split_at(unit_end)
}

/// A rate per second on the command line: a finite number, 0 or more. (JSON has no NaN or
/// infinity: they would go out as `null`, which the server reads as "not given".)
pub fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a rate: give a number of 0 or more, such as 50 or 0.5"
        )),
    }
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
        check("", None);
        check("1m 30s", Some(90_000));
        check("1h30m", Some(5_400_000));
        check("1 h 30 m", Some(5_400_000));
        check("2d 3h 4m 5s 6ms", Some(183_845_006));
        check("1m 30", None);
        check("1m x", None);
        check("1m -5s", None);
        check("6M", None);
        check("30S", Some(30_000));
        check("2H", Some(7_200_000));
        check("1MS", None);
        check("5 Min", None);
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
