//! Human-readable output: times as RFC 3339 with a relative hint, durations in units a person
//! reads, and aligned `key: value` lines.

use std::time::{SystemTime, UNIX_EPOCH};

const SECOND_MS: u64 = 1_000;
const MINUTE_MS: u64 = 60 * SECOND_MS;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;

/// This machine's wall clock in unix ms; the relative hints are only hints, so a skew with the
/// server's clock shows as a skewed hint, nothing worse.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `2026-11-23T12:10:00Z (in 4m 10s)`, `... (3s ago)`, `... (now)`.
pub fn time(at_ms: u64, now_ms: u64) -> String {
    let hint = if at_ms > now_ms {
        format!("in {}", duration(at_ms - now_ms))
    } else if now_ms - at_ms < SECOND_MS {
        "now".to_owned()
    } else {
        format!("{} ago", duration(now_ms - at_ms))
    };
    format!("{} ({hint})", rfc3339(at_ms))
}

/// A duration in its two largest units: `250ms`, `4s`, `4m 10s`, `2h 5m`, `3d 4h`.
pub fn duration(ms: u64) -> String {
    if ms < SECOND_MS {
        return format!("{ms}ms");
    }
    if ms < MINUTE_MS {
        let tenths = (ms % SECOND_MS) / 100;
        return if tenths == 0 || ms >= 10 * SECOND_MS {
            format!("{}s", ms / SECOND_MS)
        } else {
            format!("{}.{tenths}s", ms / SECOND_MS)
        };
    }
    let units = [
        (DAY_MS, "d"),
        (HOUR_MS, "h"),
        (MINUTE_MS, "m"),
        (SECOND_MS, "s"),
    ];
    let first = units.iter().position(|(size, _)| ms >= *size).unwrap_or(3);
    let (big, big_name) = units[first];
    let (small, small_name) = units[(first + 1).min(3)];
    let rest = (ms % big) / small;
    if rest == 0 {
        format!("{}{big_name}", ms / big)
    } else {
        format!("{}{big_name} {rest}{small_name}", ms / big)
    }
}

/// Unix milliseconds as RFC 3339 in UTC; milliseconds shown only when there are some.
pub fn rfc3339(ms: u64) -> String {
    match i64::try_from(ms).map(jiff::Timestamp::from_millisecond) {
        Ok(Ok(at)) if ms % SECOND_MS == 0 => format!("{at:.0}"),
        Ok(Ok(at)) => format!("{at:.3}"),
        // Past the year 9999: no RFC 3339 form, so the number itself.
        _ => format!("{ms} ms since 1970"),
    }
}

/// A late policy for a person: `deliver however late`, `skip past 10m late`, `dead letter past
/// 1h late`; empty when the server gave none.
pub fn late_policy(policy: Option<&str>, after_ms: Option<u64>) -> String {
    let past = |what: &str| match after_ms {
        Some(ms) => format!("{what} past {} late", duration(ms)),
        None => what.to_owned(),
    };
    match policy {
        None => String::new(),
        Some("fire") => "deliver however late".to_owned(),
        Some("skip") => past("skip"),
        Some("dead") => past("dead letter"),
        Some(other) => past(other),
    }
}

/// `key: value` lines with the values aligned; empty values are left out.
pub fn fields(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(key, _)| key.len()).max().unwrap_or(0) + 1;
    rows.iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| format!("{:width$} {value}", format!("{key}:")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Columns padded to their widest cell; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        let padded: Vec<String> = cells
            .into_iter()
            .enumerate()
            .map(|(i, cell)| {
                if i == last {
                    cell
                } else {
                    format!("{cell:width$}", width = widths[i])
                }
            })
            .collect();
        padded.join("  ")
    };
    let mut lines = vec![line(header.iter().map(|h| (*h).to_owned()).collect())];
    lines.extend(rows.iter().map(|row| line(row.clone())));
    lines.join("\n")
}

/// At most `max` characters, with `…` when cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The line a bulk answer's summary ends its refused lines with when the server listed only
/// some of them (empty when it listed all).
pub fn more_refused(refused: u64, listed: usize) -> String {
    let listed = listed as u64;
    if refused > listed {
        format!(
            "\n... and {} more refused (the server lists the first {listed})",
            refused - listed
        )
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_rfc3339() {
        let check = |ms: u64, text: &str| assert_eq!(rfc3339(ms), text, "{ms}");
        check(0, "1970-01-01T00:00:00Z");
        check(1_767_225_600_000, "2026-01-01T00:00:00Z");
        check(1_767_225_610_250, "2026-01-01T00:00:10.250Z");
        check(951_782_400_000, "2000-02-29T00:00:00Z");
        check(951_868_799_999, "2000-02-29T23:59:59.999Z");
        check(4_107_542_400_000, "2100-03-01T00:00:00Z");
        check(1_795_435_800_000, "2026-11-23T12:10:00Z");
        check(u64::MAX, &format!("{} ms since 1970", u64::MAX));
    }

    #[test]
    fn late_policies_read_as_what_happens() {
        assert_eq!(late_policy(Some("fire"), None), "deliver however late");
        assert_eq!(
            late_policy(Some("skip"), Some(600_000)),
            "skip past 10m late"
        );
        assert_eq!(
            late_policy(Some("dead"), Some(3_600_000)),
            "dead letter past 1h late"
        );
        assert_eq!(late_policy(None, None), "");
    }

    #[test]
    fn check_durations() {
        let check = |ms: u64, text: &str| assert_eq!(duration(ms), text, "{ms}");
        check(0, "0ms");
        check(250, "250ms");
        check(1_500, "1.5s");
        check(4_000, "4s");
        check(59_999, "59s");
        check(60_000, "1m");
        check(250_000, "4m 10s");
        check(2 * HOUR_MS + 5 * MINUTE_MS + 7_000, "2h 5m");
        check(3 * DAY_MS + 4 * HOUR_MS, "3d 4h");
    }

    #[test]
    fn check_relative_times() {
        let now = 1_795_435_550_000;
        assert_eq!(
            time(1_795_435_800_000, now),
            "2026-11-23T12:10:00Z (in 4m 10s)"
        );
        assert_eq!(time(now - 3_000, now), "2026-11-23T12:05:47Z (3s ago)");
        assert_eq!(time(now, now), "2026-11-23T12:05:50Z (now)");
    }

    #[test]
    fn fields_align_and_skip_empty_values() {
        let text = fields(&[
            ("id", "7".into()),
            ("lease", String::new()),
            ("state", "done".into()),
        ]);
        assert_eq!(text, "id:    7\nstate: done");
    }

    #[test]
    fn tables_pad_all_but_the_last_column() {
        let text = table(&["ID", "NOTE"], &[vec!["1234".into(), "x".into()]]);
        assert_eq!(text, "ID    NOTE\n1234  x");
    }
}
