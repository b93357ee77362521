//! Cron expressions: parsing, and matching civil (wall-clock) date-times.
//!
//! Grammar, one field per position, separated by whitespace:
//!
//! ```text
//! [second] minute hour day-of-month month day-of-week      (5 fields, or 6 with seconds first)
//! field    = item ("," item)*
//! item     = base ["/" step] | day-form
//! base     = "*" | "?" | value | value "-" value
//! value    = number | name           (month names JAN-DEC, weekday names SUN-SAT, any case)
//! day-form = "L" | "L-" n | n "W" | "LW"     (day of month only)
//!          | weekday "L" | weekday "#" n     (day of week only; weekday = 0-7 or SUN-SAT)
//! ```
//!
//! - `a/step` means `a-max/step`, where the day of week's max is 6 (Saturday): `MON/2` is MON,
//!   WED, FRI, as in Quartz, Kubernetes' CronJobs and croniter. `?` means the same as `*` and is
//!   only allowed in the two day fields (Quartz users write it there).
//! - Day of week: 0 and 7 are both Sunday. A range ending in Sunday (`FRI-SUN`, `5-0`) is read
//!   as ending in 7, so it does not run backwards.
//! - Day rule (as in Vixie cron): when **both** day-of-month and day-of-week are restricted
//!   (neither is exactly `*` or `?`), a day matches if **either** matches: `0 0 13 * FRI` fires
//!   on every 13th and on every Friday. When one of them is `*` or `?`, only the other decides.
//!   Unlike Vixie cron, `*/2` counts as restricted: only the bare `*`/`?` mean "any day".
//! - Day forms (Quartz's, `cron_days.rs` has their exact meaning): day of month `L`, `L-N`,
//!   `NW`, `LW`; day of week `DL` (`FRIL`) and `D#N` (`TUE#2`). Each is one item of a list
//!   (`1,L`), never part of a range or a step, and makes its field restricted for the day rule.
//! - Aliases: `@yearly` = `@annually` = `0 0 1 1 *`, `@monthly` = `0 0 1 * *`, `@weekly` =
//!   `0 0 * * 0`, `@daily` = `@midnight` = `0 0 * * *`, `@hourly` = `0 * * * *`.
//!   `@every` is not cron: fixed intervals are a separate kind of trigger.
//!
//! This module knows nothing about time zones: it answers "which civil date-time at or after
//! this one matches?". `zoned.rs` maps civil date-times to instants.

use std::fmt;

use super::cron_days::{self, DayForms};

/// Longest accepted expression, so an error message or a stored schedule stays small.
pub const CRON_EXPRESSION_LEN_MAX: usize = 256;

/// How many years ahead a search for the next matching date goes before giving up. Every
/// expression that passes validation matches within 40 years: 29 February (or `L-28` or `29W`
/// in February) can be 8 years apart, across a non-leap century year, and a February with a
/// 5th Monday (`* 2 MON#5`, a leap year whose February starts on a Monday) 40 years apart,
/// around 2100. The search moves a month at a time past months without a matching day, so
/// this bounds the work to a few hundred steps.
const SEARCH_YEARS_MAX: i32 = 41;

/// Largest year a civil date-time may have (the limit of the time zone library).
const YEAR_MAX: i32 = 9999;

/// Longest piece of bad input quoted back in an error.
const ERROR_TEXT_LEN_MAX: usize = 64;

/// The six fields, in the order of a 6-field expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CronField {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
}

impl CronField {
    /// Smallest and largest value accepted in the text (day of week accepts 7 for Sunday).
    fn bounds(self) -> (u8, u8) {
        match self {
            CronField::Second | CronField::Minute => (0, 59),
            CronField::Hour => (0, 23),
            CronField::DayOfMonth => (1, 31),
            CronField::Month => (1, 12),
            CronField::DayOfWeek => (0, 7),
        }
    }

    /// Where `*` and `a/n` run to: the largest value, but Saturday (6) for the day of week,
    /// where 7 is only another name for Sunday (0): `MON/2` is MON, WED, FRI, as in Quartz,
    /// Kubernetes' CronJobs and croniter, not also SUN.
    fn walk_max(self) -> u8 {
        match self {
            CronField::DayOfWeek => 6,
            other => other.bounds().1,
        }
    }

    fn names(self) -> &'static [&'static str] {
        const MONTHS: [&str; 12] = [
            "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
        ];
        const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
        match self {
            CronField::Month => &MONTHS,
            CronField::DayOfWeek => &WEEKDAYS,
            _ => &[],
        }
    }

    /// The value of the first name in `names()`.
    fn first_name_value(self) -> u8 {
        match self {
            CronField::Month => 1,
            _ => 0,
        }
    }
}

impl fmt::Display for CronField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CronField::Second => "second",
            CronField::Minute => "minute",
            CronField::Hour => "hour",
            CronField::DayOfMonth => "day of month",
            CronField::Month => "month",
            CronField::DayOfWeek => "day of week",
        })
    }
}

/// What is wrong with one item of one field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldProblem {
    #[error("value out of range {min}-{max}")]
    OutOfRange { min: u8, max: u8 },
    #[error("not a number{names}")]
    NotAValue { names: &'static str },
    #[error("empty item")]
    EmptyItem,
    #[error("range start {start} is after its end {end}")]
    ReversedRange { start: u8, end: u8 },
    #[error("step out of range 1-{max}")]
    BadStep { max: u8 },
    #[error("'?' is only allowed in the day-of-month and day-of-week fields")]
    QuestionMarkNotAllowed,
    #[error("L, W and # are only allowed in the day-of-month field (L, L-N, NW, LW) and the day-of-week field (DL, D#N)")]
    DayFormNotAllowed,
    #[error(
        "L, W and # forms stand alone: not in a range or with a step (a list such as 1,L is fine)"
    )]
    DayFormNotSingle,
    #[error("not a day-of-month form: the forms are L, L-N (N 0-30), NW (N 1-31) and LW")]
    NotADayOfMonthForm,
    #[error("L-N takes N from 0 to 30 (days before the last day of the month)")]
    BeforeLastOutOfRange,
    #[error("NW takes a day N from 1 to 31 (W alone names no day)")]
    NearestWeekdayOutOfRange,
    #[error("not a day-of-week form: the forms are DL (the last weekday D of the month) and D#N (the Nth, N 1-5)")]
    NotADayOfWeekForm,
    #[error("DL and D#N take a weekday D from 0 to 7 or SUN-SAT")]
    FormWeekday,
    #[error("D#N takes N from 1 to 5")]
    NthOutOfRange,
}

/// Why an expression was refused. The `Field` variant points at the bad field by its position
/// in the expression as written (1-based) and its name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("the cron expression is empty")]
    Empty,
    #[error("the cron expression is longer than {CRON_EXPRESSION_LEN_MAX} characters")]
    TooLong,
    #[error("a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), got {got}")]
    FieldCount { got: usize },
    #[error("unknown alias {alias:?}: known are @yearly, @annually, @monthly, @weekly, @daily, @midnight and @hourly")]
    UnknownAlias { alias: String },
    #[error("@every is an interval, not a cron expression: use every_ms")]
    EveryIsNotCron,
    #[error("field {position} ({field}) {text:?}: {problem}")]
    Field {
        position: usize,
        field: CronField,
        text: String,
        problem: FieldProblem,
    },
    #[error("the expression never fires: no allowed month has the allowed days of month")]
    NeverFires,
}

/// A parsed cron expression. Each field is a bit set: bit `v` set means value `v` matches.
#[derive(Clone, PartialEq, Eq)]
pub struct CronExpr {
    seconds: u64,
    minutes: u64,
    hours: u64,
    pub(super) days_of_month: u64,
    months: u64,
    /// Bits 0 (Sunday) to 6 (Saturday); 7 is folded into 0 when parsing.
    pub(super) days_of_week: u64,
    /// The day fields' L, W and # forms.
    pub(super) forms: DayForms,
    /// Both day fields restricted: a day matches when either matches (see the module docs).
    pub(super) days_either: bool,
    source: String,
}

impl fmt::Debug for CronExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CronExpr({:?})", self.source)
    }
}

impl fmt::Display for CronExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for CronExpr {
    type Err = CronError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CronExpr::parse(s)
    }
}

const ALL_HOURS: u64 = (1 << 24) - 1;
const ALL_WEEKDAYS: u64 = (1 << 7) - 1;

impl CronExpr {
    pub fn parse(text: &str) -> Result<CronExpr, CronError> {
        if text.len() > CRON_EXPRESSION_LEN_MAX {
            return Err(CronError::TooLong);
        }
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(CronError::Empty);
        }
        let expanded = if trimmed.starts_with('@') {
            expand_alias(trimmed)?
        } else {
            trimmed
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let order: &[CronField] = match fields.len() {
            5 => &[
                CronField::Minute,
                CronField::Hour,
                CronField::DayOfMonth,
                CronField::Month,
                CronField::DayOfWeek,
            ],
            6 => &[
                CronField::Second,
                CronField::Minute,
                CronField::Hour,
                CronField::DayOfMonth,
                CronField::Month,
                CronField::DayOfWeek,
            ],
            got => return Err(CronError::FieldCount { got }),
        };
        let mut sets = [0u64; 6];
        // A 5-field expression fires at second 0.
        sets[0] = 1;
        let mut restricted = [true; 6];
        let mut forms = DayForms::default();
        for (index, (&field, text)) in order.iter().zip(&fields).enumerate() {
            let position = index + 1;
            sets[field as usize] =
                parse_field(field, text, &mut forms).map_err(|(bad, problem)| {
                    CronError::Field {
                        position,
                        field,
                        text: bad.chars().take(ERROR_TEXT_LEN_MAX).collect(),
                        problem,
                    }
                })?;
            restricted[field as usize] = !matches!(*text, "*" | "?");
        }
        let mut days_of_week = sets[CronField::DayOfWeek as usize];
        if days_of_week & (1 << 7) != 0 {
            days_of_week = (days_of_week & !(1 << 7)) | 1;
        }
        let expr = CronExpr {
            seconds: sets[CronField::Second as usize],
            minutes: sets[CronField::Minute as usize],
            hours: sets[CronField::Hour as usize],
            days_of_month: sets[CronField::DayOfMonth as usize],
            months: sets[CronField::Month as usize],
            days_of_week,
            forms,
            days_either: restricted[CronField::DayOfMonth as usize]
                && restricted[CronField::DayOfWeek as usize],
            source: trimmed.to_string(),
        };
        if !expr.can_fire() {
            return Err(CronError::NeverFires);
        }
        Ok(expr)
    }

    /// The expression as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// True when every hour of the day matches: such a schedule follows the wall clock through
    /// a repeated (fall-back) hour, firing at both occurrences (see `zoned.rs`).
    pub fn every_hour(&self) -> bool {
        self.hours == ALL_HOURS
    }

    /// Whether some day exists that the day fields allow (e.g. not `30 2` = 30 February, nor
    /// `L-29 2` or `30W 2`). A day of week, or a day-of-week form, names some day of every
    /// allowed month in some year (a February with a 5th Monday is a leap year's whose 1st is
    /// a Monday), so only the days of month can make an expression fire never.
    fn can_fire(&self) -> bool {
        if self.days_either {
            return true;
        }
        let days = self.days_of_month | self.forms.days_needed();
        (1..=12u8).any(|month| {
            // 29 February exists in leap years, so February counts 29 days here.
            self.months & (1 << month) != 0
                && days & cron_days::in_month(days_in_month(2000, month)) != 0
        })
    }

    /// The days (bit n = day n) of `month` in `year` that the day fields allow, by the day
    /// rule (see the module docs).
    fn month_days(&self, year: i32, month: u8) -> u64 {
        let len = days_in_month(year, month);
        // The common case (`* * *`, `1 * *`): only the days of month decide, no weekday to
        // work out.
        if !self.days_either
            && self.days_of_week == ALL_WEEKDAYS
            && self.forms == DayForms::default()
        {
            return self.days_of_month & cron_days::in_month(len);
        }
        let first = weekday(year, month, 1);
        let of_month =
            (self.days_of_month | self.forms.days_of_month(len, first)) & cron_days::in_month(len);
        let of_week = cron_days::days_on_weekdays(self.days_of_week, len, first)
            | self.forms.days_of_week(len, first);
        if self.days_either {
            of_month | of_week
        } else {
            of_month & of_week
        }
    }

    /// Whether the civil date-time matches every field.
    pub fn matches(&self, c: Civil) -> bool {
        self.months & (1 << c.month) != 0
            && self.month_days(c.year, c.month) & (1 << c.day) != 0
            && self.hours & (1 << c.hour) != 0
            && self.minutes & (1 << c.minute) != 0
            && self.seconds & (1 << c.second) != 0
    }

    /// The earliest civil date-time at or after `from` that matches, or `None` if there is none
    /// within the search bound (or before year 9999).
    pub fn next_match(&self, from: Civil) -> Option<Civil> {
        let mut t = from;
        let year_limit = from.year.saturating_add(SEARCH_YEARS_MAX).min(YEAR_MAX);
        loop {
            if t.year > year_limit {
                return None;
            }
            match next_bit(self.months, t.month) {
                None => {
                    t = Civil::midnight(t.year + 1, 1, 1);
                    continue;
                }
                Some(month) if month != t.month => {
                    t = Civil::midnight(t.year, month, 1);
                }
                Some(_) => {}
            }
            // A month without a matching day is passed in one step, so rare days (`29W` in
            // February, `MON#5`) cost a step a month, not one a day.
            match next_bit(self.month_days(t.year, t.month), t.day) {
                None => {
                    t = t.next_month();
                    continue;
                }
                Some(day) if day != t.day => t = Civil::midnight(t.year, t.month, day),
                Some(_) => {}
            }
            match next_bit(self.hours, t.hour) {
                None => {
                    t = t.next_day();
                    continue;
                }
                Some(hour) if hour != t.hour => {
                    t.hour = hour;
                    t.minute = 0;
                    t.second = 0;
                }
                Some(_) => {}
            }
            match next_bit(self.minutes, t.minute) {
                None => {
                    t = t.next_hour();
                    continue;
                }
                Some(minute) if minute != t.minute => {
                    t.minute = minute;
                    t.second = 0;
                }
                Some(_) => {}
            }
            match next_bit(self.seconds, t.second) {
                None => {
                    t = t.next_minute();
                    continue;
                }
                Some(second) => {
                    t.second = second;
                    return Some(t);
                }
            }
        }
    }
}

fn expand_alias(alias: &str) -> Result<&'static str, CronError> {
    let lower = alias.to_ascii_lowercase();
    let first = lower.split_whitespace().next().unwrap_or("");
    if first == "@every" {
        return Err(CronError::EveryIsNotCron);
    }
    Ok(match lower.as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => {
            return Err(CronError::UnknownAlias {
                alias: alias.chars().take(ERROR_TEXT_LEN_MAX).collect(),
            })
        }
    })
}

/// Parses one field into a bit set, adding its day forms to `forms`, or returns the offending
/// item and what is wrong with it.
fn parse_field(
    field: CronField,
    text: &str,
    forms: &mut DayForms,
) -> Result<u64, (String, FieldProblem)> {
    let mut set = 0u64;
    for item in text.split(',') {
        set |= parse_item(field, item, forms).map_err(|problem| {
            let shown = if item.is_empty() { text } else { item };
            (shown.to_string(), problem)
        })?;
    }
    Ok(set)
}

fn parse_item(field: CronField, item: &str, forms: &mut DayForms) -> Result<u64, FieldProblem> {
    let (min, max) = (field.bounds().0, field.walk_max());
    if item.is_empty() {
        return Err(FieldProblem::EmptyItem);
    }
    // A form with a step (`L/2`) goes on, to be refused as a range end or a step's start.
    if !item.contains('/') && cron_days::is_day_form(item) {
        match field {
            CronField::DayOfMonth => cron_days::parse_day_of_month(item, forms)?,
            CronField::DayOfWeek => cron_days::parse_day_of_week(item, forms)?,
            _ => return Err(FieldProblem::DayFormNotAllowed),
        }
        return Ok(0);
    }
    let (base, step) = match item.split_once('/') {
        Some((base, step)) => {
            let span = max - min + 1;
            let step: u8 = match step.parse::<u8>() {
                Ok(step) if (1..=span).contains(&step) => step,
                _ => return Err(FieldProblem::BadStep { max: span }),
            };
            (base, Some(step))
        }
        None => (item, None),
    };
    let (start, end) = match base {
        "*" => (min, max),
        "?" => {
            if !matches!(field, CronField::DayOfMonth | CronField::DayOfWeek) {
                return Err(FieldProblem::QuestionMarkNotAllowed);
            }
            if step.is_some() {
                return Err(FieldProblem::NotAValue { names: "" });
            }
            (min, max)
        }
        _ => match base.split_once('-') {
            Some((a, b)) => {
                let start = parse_value(field, a)?;
                let mut end = parse_value(field, b)?;
                if field == CronField::DayOfWeek && end == 0 && start > 0 {
                    end = 7;
                }
                if start > end {
                    return Err(FieldProblem::ReversedRange { start, end });
                }
                (start, end)
            }
            // `a/step` runs from a to the field's maximum.
            None if step.is_some() => (parse_value(field, base)?, max),
            None => {
                let value = parse_value(field, base)?;
                (value, value)
            }
        },
    };
    let step = step.unwrap_or(1);
    let mut set = 0u64;
    let mut value = start;
    while value <= end {
        set |= 1 << value;
        match value.checked_add(step) {
            Some(next) => value = next,
            None => break,
        }
    }
    Ok(set)
}

fn parse_value(field: CronField, text: &str) -> Result<u8, FieldProblem> {
    let (min, max) = field.bounds();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        // Anything too long for u8 is out of range too.
        return match text.parse::<u8>() {
            Ok(value) if (min..=max).contains(&value) => Ok(value),
            _ => Err(FieldProblem::OutOfRange { min, max }),
        };
    }
    let names = field.names();
    if let Some(index) = names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
        return Ok(field.first_name_value() + index as u8);
    }
    if cron_days::is_day_form(text) {
        return Err(match field {
            CronField::DayOfMonth | CronField::DayOfWeek => FieldProblem::DayFormNotSingle,
            _ => FieldProblem::DayFormNotAllowed,
        });
    }
    Err(FieldProblem::NotAValue {
        names: match field {
            CronField::Month => " or a month name (JAN-DEC)",
            CronField::DayOfWeek => " or a weekday name (SUN-SAT)",
            _ => "",
        },
    })
}

/// The smallest set bit at or after `from`, if any.
fn next_bit(set: u64, from: u8) -> Option<u8> {
    if from >= 64 {
        return None;
    }
    let masked = set & (u64::MAX << from);
    (masked != 0).then(|| masked.trailing_zeros() as u8)
}

/// A civil (wall-clock, zone-less) date-time with one-second resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Civil {
    pub year: i32,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
}

impl Civil {
    pub fn midnight(year: i32, month: u8, day: u8) -> Civil {
        Civil {
            year,
            month,
            day,
            hour: 0,
            minute: 0,
            second: 0,
        }
    }

    fn next_day(self) -> Civil {
        if self.day < days_in_month(self.year, self.month) {
            Civil::midnight(self.year, self.month, self.day + 1)
        } else if self.month < 12 {
            Civil::midnight(self.year, self.month + 1, 1)
        } else {
            Civil::midnight(self.year + 1, 1, 1)
        }
    }

    fn next_month(self) -> Civil {
        if self.month < 12 {
            Civil::midnight(self.year, self.month + 1, 1)
        } else {
            Civil::midnight(self.year + 1, 1, 1)
        }
    }

    fn next_hour(self) -> Civil {
        if self.hour < 23 {
            Civil {
                hour: self.hour + 1,
                minute: 0,
                second: 0,
                ..self
            }
        } else {
            self.next_day()
        }
    }

    fn next_minute(self) -> Civil {
        if self.minute < 59 {
            Civil {
                minute: self.minute + 1,
                second: 0,
                ..self
            }
        } else {
            self.next_hour()
        }
    }

    /// Seconds since 1970-01-01T00:00:00 of this civil time read as if it were UTC.
    pub fn as_epoch_seconds(self) -> i64 {
        days_from_civil(self.year, self.month, self.day) * 86_400
            + i64::from(self.hour) * 3_600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
    }

    /// The inverse of [`Civil::as_epoch_seconds`].
    pub fn from_epoch_seconds(seconds: i64) -> Civil {
        let days = seconds.div_euclid(86_400);
        let rest = seconds.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Civil {
            year,
            month,
            day,
            hour: (rest / 3_600) as u8,
            minute: (rest % 3_600 / 60) as u8,
            second: (rest % 60) as u8,
        }
    }
}

impl fmt::Display for Civil {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

fn is_leap(year: i32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

pub(crate) fn days_in_month(year: i32, month: u8) -> u8 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the well-known era-based algorithm).
fn days_from_civil(year: i32, month: u8, day: u8) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month, day)
}

/// 0 = Sunday … 6 = Saturday. 1970-01-01 was a Thursday.
pub(super) fn weekday(year: i32, month: u8, day: u8) -> u8 {
    (days_from_civil(year, month, day) + 4).rem_euclid(7) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(values: &[u8]) -> u64 {
        values.iter().fold(0, |s, v| s | 1 << v)
    }

    #[test]
    fn good_expressions() {
        // (expression, seconds, minutes, hours, days of month, months, days of week, either)
        let all = |min: u8, max: u8| (min..=max).fold(0u64, |s, v| s | 1 << v);
        let check = |text: &str, expected: [u64; 6], either: bool| {
            let expr = CronExpr::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let got = [
                expr.seconds,
                expr.minutes,
                expr.hours,
                expr.days_of_month,
                expr.months,
                expr.days_of_week,
            ];
            assert_eq!(got, expected, "{text:?}");
            assert_eq!(expr.days_either, either, "{text:?}");
        };
        let (s, mi, h, d, mo, w) = (
            all(0, 59),
            all(0, 59),
            all(0, 23),
            all(1, 31),
            all(1, 12),
            all(0, 6),
        );
        check("* * * * *", [1, mi, h, d, mo, w], false);
        check("* * * * * *", [s, mi, h, d, mo, w], false);
        check(
            "*/15 * * * *",
            [1, set(&[0, 15, 30, 45]), h, d, mo, w],
            false,
        );
        check(
            "10-50/20 0 * * *",
            [1, set(&[10, 30, 50]), 1, d, mo, w],
            false,
        );
        check("5/20 * * * *", [1, set(&[5, 25, 45]), h, d, mo, w], false);
        check(
            "30 1,2,3 1 JAN,jul *",
            [1, set(&[30]), set(&[1, 2, 3]), 2, set(&[1, 7]), w],
            false,
        );
        check(
            "0 0 9 ? * MON-FRI",
            [1, 1, set(&[9]), d, mo, set(&[1, 2, 3, 4, 5])],
            false,
        );
        check("0 0 * * 7", [1, 1, 1, d, mo, 1], false);
        check("0 0 * * FRI-SUN", [1, 1, 1, d, mo, set(&[0, 5, 6])], false);
        check("0 0 * * 5-0", [1, 1, 1, d, mo, set(&[0, 5, 6])], false);
        // A step from a weekday runs to Saturday: no Sunday after Friday.
        check("0 0 * * MON/2", [1, 1, 1, d, mo, set(&[1, 3, 5])], false);
        check("0 0 * * 1/2", [1, 1, 1, d, mo, set(&[1, 3, 5])], false);
        check("0 0 * * */2", [1, 1, 1, d, mo, set(&[0, 2, 4, 6])], false);
        check("0 0 13 * FRI", [1, 1, 1, set(&[13]), mo, set(&[5])], true);
        check(
            "0 0 */2 * 1",
            [1, 1, 1, all(1, 31) & 0xAAAA_AAAA, mo, 2],
            true,
        );
        check("0 0 1 feb-apr/2 *", [1, 1, 1, 2, set(&[2, 4]), w], false);
        check("@hourly", [1, 1, h, d, mo, w], false);
        check("@DAILY", [1, 1, 1, d, mo, w], false);
        check("@midnight", [1, 1, 1, d, mo, w], false);
        check("@weekly", [1, 1, 1, d, mo, 1], false);
        check("@monthly", [1, 1, 1, 2, mo, w], false);
        check("@yearly", [1, 1, 1, 2, 2, w], false);
        check("@annually", [1, 1, 1, 2, 2, w], false);
        check("  0 0 29 2 *  ", [1, 1, 1, 1 << 29, 4, w], false);
    }

    #[test]
    fn bad_expressions_point_at_the_field() {
        let check = |text: &str, message: &str| match CronExpr::parse(text) {
            Ok(expr) => panic!("{text:?} parsed as {expr:?}"),
            Err(error) => assert_eq!(error.to_string(), message, "{text:?}"),
        };
        check("", "the cron expression is empty");
        check("   ", "the cron expression is empty");
        check(
            "* * * *",
            "a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), got 4",
        );
        check(
            "* * * * * * *",
            "a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 (second first), got 7",
        );
        check(
            "0 0 32 * *",
            r#"field 3 (day of month) "32": value out of range 1-31"#,
        );
        check(
            "0 0 0 32 * *",
            r#"field 4 (day of month) "32": value out of range 1-31"#,
        );
        check(
            "60 * * * *",
            r#"field 1 (minute) "60": value out of range 0-59"#,
        );
        check(
            "* 24 * * *",
            r#"field 2 (hour) "24": value out of range 0-23"#,
        );
        check(
            "* * 0 * *",
            r#"field 3 (day of month) "0": value out of range 1-31"#,
        );
        check(
            "* * * 13 *",
            r#"field 4 (month) "13": value out of range 1-12"#,
        );
        check(
            "* * * * 8",
            r#"field 5 (day of week) "8": value out of range 0-7"#,
        );
        check(
            "* * * * 99999999999",
            r#"field 5 (day of week) "99999999999": value out of range 0-7"#,
        );
        check(
            "* * * FOO *",
            r#"field 4 (month) "FOO": not a number or a month name (JAN-DEC)"#,
        );
        check(
            "* * * * MONDAY",
            r#"field 5 (day of week) "MONDAY": not a number or a weekday name (SUN-SAT)"#,
        );
        check("x * * * *", r#"field 1 (minute) "x": not a number"#);
        check("-1 * * * *", r#"field 1 (minute) "-1": not a number"#);
        check("1,,2 * * * *", r#"field 1 (minute) "1,,2": empty item"#);
        check(
            "1,99 * * * *",
            r#"field 1 (minute) "99": value out of range 0-59"#,
        );
        check(
            "50-10 * * * *",
            r#"field 1 (minute) "50-10": range start 50 is after its end 10"#,
        );
        check(
            "*/0 * * * *",
            r#"field 1 (minute) "*/0": step out of range 1-60"#,
        );
        check(
            "*/61 * * * *",
            r#"field 1 (minute) "*/61": step out of range 1-60"#,
        );
        check(
            "* */x * * *",
            r#"field 2 (hour) "*/x": step out of range 1-24"#,
        );
        check(
            "? * * * *",
            r#"field 1 (minute) "?": '?' is only allowed in the day-of-month and day-of-week fields"#,
        );
        // The L, W and # forms are tested in cron_days.rs; words that hold an L or a W are
        // words, not forms.
        check(
            "0 0 * July *",
            r#"field 4 (month) "July": not a number or a month name (JAN-DEC)"#,
        );
        check(
            "0 0 * * Wednesday",
            r#"field 5 (day of week) "Wednesday": not a number or a weekday name (SUN-SAT)"#,
        );
        check(
            "0 0 30 2 *",
            "the expression never fires: no allowed month has the allowed days of month",
        );
        check(
            "0 0 31 4,6,9,11 *",
            "the expression never fires: no allowed month has the allowed days of month",
        );
        check(
            "@every 5m",
            "@every is an interval, not a cron expression: use every_ms",
        );
        check(
            "@reboot",
            r#"unknown alias "@reboot": known are @yearly, @annually, @monthly, @weekly, @daily, @midnight and @hourly"#,
        );
        check(
            &"1,".repeat(200),
            "the cron expression is longer than 256 characters",
        );
    }

    #[test]
    fn next_match_walks_the_calendar() {
        let check = |text: &str, from: Civil, expected: Option<Civil>| {
            let expr = CronExpr::parse(text).unwrap();
            assert_eq!(expr.next_match(from), expected, "{text:?} from {from}");
        };
        let at = |y, mo, d, h, mi, s| Civil {
            year: y,
            month: mo,
            day: d,
            hour: h,
            minute: mi,
            second: s,
        };
        check(
            "*/15 * * * *",
            at(2026, 1, 1, 0, 1, 0),
            Some(at(2026, 1, 1, 0, 15, 0)),
        );
        check(
            "*/15 * * * *",
            at(2026, 1, 1, 0, 15, 0),
            Some(at(2026, 1, 1, 0, 15, 0)),
        );
        check(
            "0 0 29 2 *",
            at(2097, 3, 1, 0, 0, 0),
            Some(at(2104, 2, 29, 0, 0, 0)),
        );
        check(
            "59 59 23 31 12 *",
            at(2026, 12, 31, 23, 59, 59),
            Some(at(2026, 12, 31, 23, 59, 59)),
        );
        check(
            "0 0 13 * FRI",
            at(2026, 2, 1, 0, 0, 0),
            Some(at(2026, 2, 6, 0, 0, 0)),
        );
        check(
            "0 0 13 * FRI",
            at(2026, 2, 7, 0, 0, 0),
            Some(at(2026, 2, 13, 0, 0, 0)),
        );
        check("0 0 1 1 *", at(9999, 6, 1, 0, 0, 0), None);
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics_and_errors_quote_little(text in "[0-9*/?,LW# a-zA-Z@-]{0,40}") {
            match CronExpr::parse(&text) {
                Ok(expr) => {
                    // Whatever parses can be searched without panicking.
                    let _ = expr.next_match(Civil::midnight(2026, 1, 1));
                }
                Err(error) => proptest::prop_assert!(error.to_string().len() < 300),
            }
        }

        #[test]
        fn epoch_seconds_round_trip(seconds in -62_135_596_800i64..253_402_300_800) {
            let civil = Civil::from_epoch_seconds(seconds);
            proptest::prop_assert_eq!(civil.as_epoch_seconds(), seconds);
        }
    }

    #[test]
    fn epoch_conversion_round_trips() {
        for seconds in [
            0i64,
            1,
            86_399,
            86_400,
            951_782_400,
            4_107_542_399,
            -1,
            253_402_300_799,
        ] {
            let civil = Civil::from_epoch_seconds(seconds);
            assert_eq!(civil.as_epoch_seconds(), seconds, "{civil}");
        }
        assert_eq!(
            Civil::from_epoch_seconds(0).to_string(),
            "1970-01-01T00:00:00"
        );
        assert_eq!(
            Civil::from_epoch_seconds(951_782_400).to_string(),
            "2000-02-29T00:00:00"
        );
        assert_eq!(weekday(2026, 11, 22), 0);
    }
}
