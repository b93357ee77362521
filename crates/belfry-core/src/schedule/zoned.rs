//! A cron expression in an IANA time zone: from civil matches to instants.
//!
//! The DST rule (also in docs/schedules.md):
//!
//! - **Skipped local time** (spring forward): a matching local time that does not exist fires
//!   once, at the first valid instant after the gap, which is the transition instant itself
//!   (New York, 2026-03-08: a daily `30 2 * * *` fires at 03:00 EDT). Several skipped matches
//!   collapse into that one firing, and into a regular match at the same instant (an
//!   every-minute schedule fires once at 03:00, not 61 times).
//! - **Repeated local time** (fall back): a matching local time that occurs twice fires once,
//!   at its **first** occurrence — unless the expression matches every hour of the day (its
//!   hour field is `*` or an equivalent like `0-23`). Those schedules (`* * * * *`,
//!   `*/5 * * * *`, `30 * * * *`) mean "at these minutes of every hour", and the wall clock
//!   really does show the repeated hour twice; firing only the first occurrence would leave
//!   an every-minute schedule silent for a whole real hour. So they fire at both occurrences,
//!   keeping their real-time rhythm, while a fixed-hour schedule such as a daily
//!   `30 1 * * *` never runs twice in one day.
//!
//! The result of `next_after` is strictly greater than its argument, so repeated calls
//! enumerate the firings in increasing order.

use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::Timestamp;

use super::cron::{Civil, CronExpr};
use crate::clock::UnixMs;

/// Longest IANA zone name accepted (the longest real one is about 32 characters).
pub const TIME_ZONE_NAME_LEN_MAX: usize = 64;

/// How far around an instant to look for offset changes. Every offset change in the tz
/// database is under 26 hours, so two days covers any gap or fold next to the instant.
const OFFSET_WINDOW_SECONDS: i64 = 2 * 86_400;

/// 9999-12-30T22:00:00Z, the last instant the time zone library represents
/// (`jiff::Timestamp::MAX`: its civil range is year 9999 in every offset). Firings stop there;
/// one after it could not be written as a time (it was answered as `"at": ""`).
const LAST_SECOND: i64 = 253_402_207_200;

/// A bound on the candidates one `next_after` call examines. Reaching it means a bug or a
/// pathological zone; the call then answers "no further firing" rather than spinning.
const CANDIDATES_MAX: u32 = 1_000_000;

/// Names within this many edits of a known zone get it suggested ("Asia/Tokio").
const SUGGEST_EDITS_MAX: usize = 2;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown time zone {name:?}: expected an IANA name such as \"Europe/Berlin\" or \"UTC\"{}",
    .suggestion.as_ref().map(|s| format!(" (did you mean {s:?}?)")).unwrap_or_default()
)]
pub struct UnknownTimeZone {
    pub name: String,
    /// The known zone closest to `name`, when one is a typo away.
    pub suggestion: Option<String>,
}

/// Looks up an IANA time zone by name.
pub fn time_zone(name: &str) -> Result<TimeZone, UnknownTimeZone> {
    let error = |suggestion| UnknownTimeZone {
        name: name.chars().take(TIME_ZONE_NAME_LEN_MAX).collect(),
        suggestion,
    };
    if name.is_empty() || name.len() > TIME_ZONE_NAME_LEN_MAX {
        return Err(error(None));
    }
    // Files of the zone directory that are not zones: `localtime` is the host's own zone
    // (/etc/localtime), `posixrules` a default for POSIX TZ strings, `Factory` a placeholder.
    // A schedule in one would fire by the host's settings, differently on each node.
    if ["localtime", "posixrules", "Factory"]
        .iter()
        .any(|host| host.eq_ignore_ascii_case(name))
    {
        return Err(error(None));
    }
    TimeZone::get(name).map_err(|_| error(closest_zone(name)))
}

/// The database's own spelling of a zone name given in any case (`asia/tokyo` →
/// `Asia/Tokyo`), or `name` as given when it names no zone (its lookup reports that, with a
/// suggestion). Schedules and reminders store this, so they show the name their local
/// times are labelled with.
pub fn canonical_zone_name(name: &str) -> String {
    time_zone(name)
        .ok()
        .and_then(|zone| zone.iana_name().map(str::to_owned))
        .unwrap_or_else(|| name.to_owned())
}

/// The known zone name closest to `name`, ignoring case, if it is at most
/// [`SUGGEST_EDITS_MAX`] edits away (the earliest in the database's order on a tie). The
/// names are listed once per process (the database copies them all on every listing), so a
/// stream of bad names costs little more than the lookups that failed.
fn closest_zone(name: &str) -> Option<String> {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        jiff::tz::db()
            .available()
            .map(|n| n.as_str().to_owned())
            .collect()
    });
    let wanted: Vec<char> = name.to_lowercase().chars().collect();
    let mut best: Option<(usize, String)> = None;
    for known in names {
        // A length that differs by more than the allowance cannot be close enough.
        if known.chars().count().abs_diff(wanted.len()) > SUGGEST_EDITS_MAX {
            continue;
        }
        let candidate: Vec<char> = known.to_lowercase().chars().collect();
        let edits = edit_distance(&wanted, &candidate);
        if edits <= SUGGEST_EDITS_MAX && best.as_ref().is_none_or(|(b, _)| edits < *b) {
            best = Some((edits, known.clone()));
        }
    }
    best.map(|(_, known)| known)
}

/// Levenshtein distance: insertions, deletions and substitutions.
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        current[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// A cron expression bound to a time zone.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    expr: CronExpr,
    zone: TimeZone,
    zone_name: String,
}

impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.expr == other.expr && self.zone_name == other.zone_name
    }
}
impl Eq for CronSchedule {}

impl CronSchedule {
    pub fn new(expr: CronExpr, zone_name: &str) -> Result<CronSchedule, UnknownTimeZone> {
        let zone = time_zone(zone_name)?;
        Ok(CronSchedule {
            expr,
            zone,
            zone_name: zone_name.to_string(),
        })
    }

    pub fn expr(&self) -> &CronExpr {
        &self.expr
    }

    pub fn zone(&self) -> &TimeZone {
        &self.zone
    }

    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The first firing strictly after `after_ms`, or `None` when there is none (the
    /// expression cannot match again before year 9999).
    pub fn next_after(&self, after_ms: UnixMs) -> Option<UnixMs> {
        // Firings are whole seconds: a firing at second x is after `after_ms` iff x > a.
        let a = i64::try_from(after_ms / 1000).ok()?;
        if a >= LAST_SECOND {
            return None;
        }
        let (offset_min, _) = self.offset_bounds(a);
        // A civil time c fires at c - offset for an offset in force near a, so only c above
        // a + offset_min can give an instant above a.
        let mut civil = Civil::from_epoch_seconds(a.checked_add(i64::from(offset_min))? + 1);
        let mut best: Option<i64> = None;
        let mut stop_before: i64 = i64::MAX;
        for _ in 0..CANDIDATES_MAX {
            let Some(found) = self.expr.next_match(civil) else {
                break;
            };
            let c = found.as_epoch_seconds();
            // Instants from civil c are at least c - offset_max; past `stop_before` no later
            // civil time can beat the best instant found.
            if c >= stop_before {
                break;
            }
            for instant in self.instants(found, c).into_iter().flatten() {
                if instant > a && best.is_none_or(|b| instant < b) {
                    best = Some(instant);
                    let (_, offset_max) = self.offset_bounds(instant);
                    stop_before = instant.saturating_add(i64::from(offset_max));
                }
            }
            civil = Civil::from_epoch_seconds(c + 1);
        }
        let best = best.filter(|b| *b <= LAST_SECOND)?;
        u64::try_from(best).ok()?.checked_mul(1000)
    }

    /// The instants (epoch seconds) at which the matching civil time `found` (= `c` seconds
    /// read as UTC) fires, per the DST rule in the module docs.
    fn instants(&self, found: Civil, c: i64) -> [Option<i64>; 2] {
        let Ok(datetime) = jiff::civil::DateTime::new(
            found.year as i16,
            found.month as i8,
            found.day as i8,
            found.hour as i8,
            found.minute as i8,
            found.second as i8,
            0,
        ) else {
            return [None, None];
        };
        match self.zone.to_ambiguous_timestamp(datetime).offset() {
            AmbiguousOffset::Unambiguous { offset } => {
                [Some(c - i64::from(offset.seconds())), None]
            }
            AmbiguousOffset::Gap { before, after } => {
                // The gap's civil range is [T + before, T + after) for the transition T, so
                // T lies in (c - after, c - before]: the first transition after c - after.
                let low = c - i64::from(after.seconds());
                let fallback = c - i64::from(before.seconds());
                let transition = Timestamp::from_second(low)
                    .ok()
                    .and_then(|ts| self.zone.following(ts).next())
                    .map(|t| t.timestamp().as_second())
                    .filter(|&t| t > low && t <= fallback)
                    .unwrap_or(fallback);
                [Some(transition), None]
            }
            AmbiguousOffset::Fold { before, after } => {
                let first = c - i64::from(before.seconds());
                let second = c - i64::from(after.seconds());
                [Some(first), self.expr.every_hour().then_some(second)]
            }
        }
    }

    /// The smallest and largest UTC offsets (seconds) in force within the window around the
    /// instant `at` (epoch seconds).
    fn offset_bounds(&self, at: i64) -> (i32, i32) {
        let start = Timestamp::from_second(at.saturating_sub(OFFSET_WINDOW_SECONDS))
            .unwrap_or(Timestamp::MIN);
        let end = at.saturating_add(OFFSET_WINDOW_SECONDS);
        let first = self.zone.to_offset(start).seconds();
        let (mut low, mut high) = (first, first);
        for transition in self.zone.following(start) {
            if transition.timestamp().as_second() > end {
                break;
            }
            let offset = transition.offset().seconds();
            low = low.min(offset);
            high = high.max(offset);
        }
        (low, high)
    }

    /// The civil time in this zone at the instant `at_ms`.
    pub fn local(&self, at_ms: UnixMs) -> Option<Civil> {
        let seconds = i64::try_from(at_ms / 1000).ok()?;
        let offset = self.zone.to_offset(Timestamp::from_second(seconds).ok()?);
        Some(Civil::from_epoch_seconds(
            seconds + i64::from(offset.seconds()),
        ))
    }

    /// The instant `at_ms` written in this zone, RFC 9557 style:
    /// `2026-03-08T03:00:00-04:00[America/New_York]`.
    pub fn format_local(&self, at_ms: UnixMs) -> Option<String> {
        format_in_zone(&self.zone, at_ms)
    }
}

/// The instant `at_ms` written in `zone`, e.g. `2026-03-08T03:00:00-04:00[America/New_York]`.
pub fn format_in_zone(zone: &TimeZone, at_ms: UnixMs) -> Option<String> {
    let ms = i64::try_from(at_ms).ok()?;
    let zoned = Timestamp::from_millisecond(ms).ok()?.to_zoned(zone.clone());
    Some(zoned.to_string())
}

/// The instant `at_ms` in UTC, RFC 3339: `2026-03-08T07:00:00Z`.
pub fn format_utc(at_ms: UnixMs) -> Option<String> {
    let ms = i64::try_from(at_ms).ok()?;
    Some(Timestamp::from_millisecond(ms).ok()?.to_string())
}
