//! The day fields' Quartz forms, and the days of one month that the two day fields allow.
//!
//! Day of month:
//!
//! - `L`: the last day of the month; `L-N` (N 0-30): N days before it (`L-0` is `L`). A month
//!   too short for it (`L-30` in a 30-day month) has no such day.
//! - `NW` (N 1-31): the weekday (Monday to Friday) nearest to day N, within the same month: a
//!   Saturday moves to the Friday before, a Sunday to the Monday after, except that neither
//!   leaves the month (`1W` on a Saturday the 1st is Monday the 3rd, `31W` on a Sunday the 31st
//!   is Friday the 29th). A month without day N (`30W` in February) has no such day.
//! - `LW`: the last weekday (Monday to Friday) of the month.
//!
//! Day of week (D a weekday, 0-7 or SUN-SAT, 7 being Sunday as elsewhere):
//!
//! - `DL` (`5L`, `FRIL`): the last D of the month.
//! - `D#N` (N 1-5): the Nth D of the month (`TUE#2`, the second Tuesday). A month without a
//!   5th D has no such day.
//!
//! Each form is one item: a list may mix forms and ordinary items (`1,L` is the first and the
//! last day, the union of what the items name), but a form cannot be part of a range or take a
//! step (`1-LW`, `L/2`): what those would mean is not obvious. The forms make their field
//! restricted, so the module's day rule applies unchanged: with the other day field also
//! restricted, a day matches if either field matches it (`0 0 L * FRI` is the last day and
//! every Friday; the last Friday is `0 0 ? * FRIL`).

use super::cron::FieldProblem;

/// The forms one expression's day fields hold, as bit sets: each is `Copy` and small, and a
/// list of forms is the union of its items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(super) struct DayForms {
    /// Bit n: `L-n` (bit 0 is `L`).
    before_last: u32,
    /// Bit n: `nW`, n 1-31.
    nearest_weekday: u32,
    /// `LW`.
    last_weekday: bool,
    /// Bit d: `dL`, d 0 (Sunday) to 6.
    last_of_weekday: u8,
    /// Bit 7 × (n - 1) + d: `d#n`, d 0-6, n 1-5.
    nth_weekday: u64,
}

impl DayForms {
    /// Days that must exist in a month for a day-of-month form to name a day there: `L-n` needs
    /// n + 1 days, `nW` needs n. Like the plain days of month, this decides whether an
    /// expression can fire at all.
    pub(super) fn days_needed(&self) -> u64 {
        (u64::from(self.before_last) << 1)
            | u64::from(self.nearest_weekday)
            | u64::from(self.last_weekday) << 1
    }

    /// The days (bit n = day n) that the day-of-month forms name in a month of `len` days whose
    /// 1st is the weekday `first` (0 = Sunday).
    pub(super) fn days_of_month(&self, len: u8, first: u8) -> u64 {
        let mut days = 0u64;
        for n in bits(u64::from(self.before_last)) {
            if n < len {
                days |= 1 << (len - n);
            }
        }
        for n in bits(u64::from(self.nearest_weekday)) {
            if n <= len {
                days |= 1 << nearest_weekday(n, len, first);
            }
        }
        if self.last_weekday {
            // The weekday nearest the last day is the last weekday: it never moves forward.
            days |= 1 << nearest_weekday(len, len, first);
        }
        days
    }

    /// The days that the day-of-week forms name in such a month.
    pub(super) fn days_of_week(&self, len: u8, first: u8) -> u64 {
        let mut days = 0u64;
        for d in bits(u64::from(self.last_of_weekday)) {
            let last = weekday_of(len, first);
            days |= 1 << (len - (last + 7 - d) % 7);
        }
        for index in bits(self.nth_weekday) {
            let (n, d) = (index / 7 + 1, index % 7);
            let day = 1 + (d + 7 - first) % 7 + 7 * (n - 1);
            if day <= len {
                days |= 1 << day;
            }
        }
        days
    }
}

/// The days of a month of `len` days whose 1st is the weekday `first` that fall on a weekday
/// of `weekdays` (bit 0 Sunday … bit 6 Saturday).
pub(super) fn days_on_weekdays(weekdays: u64, len: u8, first: u8) -> u64 {
    // Bit i of `week`: day i + 1 (and i + 8, i + 15 …) falls on one of the weekdays.
    let week = (0..7u8)
        .filter(|i| weekdays & (1 << ((first + i) % 7)) != 0)
        .fold(0u64, |w, i| w | 1 << i);
    let month = week | week << 7 | week << 14 | week << 21 | week << 28;
    (month << 1) & in_month(len)
}

/// Bits 1 to `len`: the days a month of `len` days has.
pub(super) fn in_month(len: u8) -> u64 {
    ((1u64 << len) - 1) << 1
}

/// The weekday (0 = Sunday) of day `day` of a month whose 1st is the weekday `first`.
fn weekday_of(day: u8, first: u8) -> u8 {
    (first + (day - 1) % 7) % 7
}

/// The weekday (Monday to Friday) nearest to day `n` of a month of `len` days, within it.
fn nearest_weekday(n: u8, len: u8, first: u8) -> u8 {
    match weekday_of(n, first) {
        // Saturday: the Friday before, or the Monday after the 1st.
        6 if n == 1 => 3,
        6 => n - 1,
        // Sunday: the Monday after, or the Friday before the last day.
        0 if n == len => n - 2,
        0 => n + 1,
        _ => n,
    }
}

/// The set bits of `set`, lowest first.
fn bits(mut set: u64) -> impl Iterator<Item = u8> {
    std::iter::from_fn(move || {
        (set != 0).then(|| {
            let bit = set.trailing_zeros() as u8;
            set &= set - 1;
            bit
        })
    })
}

const WEEKDAY_NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// Whether `text` is written as one of the forms, or as a broken one (`W`, `L-31`, `8L`,
/// `3#6`), rather than as a word that happens to hold an L or a W (`July`, `Wednesday`).
pub(super) fn is_day_form(text: &str) -> bool {
    let upper = text.to_ascii_uppercase();
    if upper.contains('#') || upper.starts_with("L-") {
        return true;
    }
    let stem = upper.trim_start_matches(|c: char| c.is_ascii_digit());
    if ["L", "W", "LW"].contains(&stem) {
        return true;
    }
    upper
        .strip_suffix('L')
        .is_some_and(|name| WEEKDAY_NAMES.contains(&name))
}

/// Adds the form `item` (one for which [`is_day_form`] holds) of a day-of-month field to
/// `forms`, or says what is wrong with it.
pub(super) fn parse_day_of_month(item: &str, forms: &mut DayForms) -> Result<(), FieldProblem> {
    let upper = item.to_ascii_uppercase();
    match upper.as_str() {
        "L" => forms.before_last |= 1,
        "LW" => forms.last_weekday = true,
        _ => {
            if let Some(n) = upper.strip_prefix("L-") {
                let n = number(n, 0, 30).ok_or(FieldProblem::BeforeLastOutOfRange)?;
                forms.before_last |= 1 << n;
            } else if let Some(n) = upper.strip_suffix('W') {
                if !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(FieldProblem::NotADayOfMonthForm);
                }
                let n = number(n, 1, 31).ok_or(FieldProblem::NearestWeekdayOutOfRange)?;
                forms.nearest_weekday |= 1 << n;
            } else {
                return Err(FieldProblem::NotADayOfMonthForm);
            }
        }
    }
    Ok(())
}

/// Adds the form `item` of a day-of-week field to `forms`, or says what is wrong with it.
pub(super) fn parse_day_of_week(item: &str, forms: &mut DayForms) -> Result<(), FieldProblem> {
    let upper = item.to_ascii_uppercase();
    if let Some((d, n)) = upper.split_once('#') {
        let d = weekday(d).ok_or(FieldProblem::FormWeekday)?;
        let n = number(n, 1, 5).ok_or(FieldProblem::NthOutOfRange)?;
        forms.nth_weekday |= 1 << (7 * (n - 1) + d);
        return Ok(());
    }
    match upper.strip_suffix('L') {
        // `L` alone (Saturday in Quartz) and `LW` are refused: neither says which weekday.
        Some("") | None => Err(FieldProblem::NotADayOfWeekForm),
        Some(d) => {
            // `L-3`'s and `5W`'s letters belong to the day of month.
            if d.contains(['-', 'W']) && weekday(d).is_none() {
                return Err(FieldProblem::NotADayOfWeekForm);
            }
            let d = weekday(d).ok_or(FieldProblem::FormWeekday)?;
            forms.last_of_weekday |= 1 << d;
            Ok(())
        }
    }
}

/// A decimal number from `min` to `max`, digits only.
fn number(text: &str, min: u8, max: u8) -> Option<u8> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u8>().ok().filter(|n| (min..=max).contains(n))
}

/// A weekday, 0-7 (7 is Sunday, folded to 0) or a name SUN-SAT, any case.
fn weekday(text: &str) -> Option<u8> {
    number(text, 0, 7).map(|d| d % 7).or_else(|| {
        WEEKDAY_NAMES
            .iter()
            .position(|n| *n == text)
            .map(|d| d as u8)
    })
}

#[cfg(test)]
mod tests {
    use super::super::cron::{days_in_month, weekday, Civil, CronExpr};
    use super::*;

    fn parse(text: &str) -> CronExpr {
        CronExpr::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    /// The days of `month` in `year` that `forms` name, by the definitions in the module docs
    /// read one day at a time (the nearest weekday by distance), not by the arithmetic above.
    fn reference_days(forms: &DayForms, year: i32, month: u8, of_week: bool) -> u64 {
        let len = days_in_month(year, month);
        let wd = |day: u8| weekday(year, month, day);
        let is_weekday = |day: u8| (1..=5).contains(&wd(day));
        let mut days = 0u64;
        for day in 1..=len {
            let named = if of_week {
                let nth = (day - 1) / 7 + 1;
                (forms.last_of_weekday & (1 << wd(day)) != 0 && day + 7 > len)
                    || forms.nth_weekday & (1 << (7 * (nth - 1) + wd(day))) != 0
            } else {
                let before_last = forms.before_last & (1 << (len - day)) != 0;
                let last_weekday = forms.last_weekday
                    && is_weekday(day)
                    && (day + 1..=len).all(|d| !is_weekday(d));
                let nearest = (1..=len).any(|n| {
                    forms.nearest_weekday & (1 << n) != 0
                        && (1..=len)
                            .filter(|&d| is_weekday(d))
                            .min_by_key(|&d| d.abs_diff(n))
                            == Some(day)
                });
                before_last || last_weekday || nearest
            };
            if named {
                days |= 1 << day;
            }
        }
        days
    }

    #[test]
    fn forms_name_the_days_of_their_definitions() {
        let mut singles = vec![DayForms {
            last_weekday: true,
            ..DayForms::default()
        }];
        singles.extend((0..=30).map(|n| DayForms {
            before_last: 1 << n,
            ..DayForms::default()
        }));
        singles.extend((1..=31).map(|n| DayForms {
            nearest_weekday: 1 << n,
            ..DayForms::default()
        }));
        singles.extend((0..7).map(|d| DayForms {
            last_of_weekday: 1 << d,
            ..DayForms::default()
        }));
        singles.extend((0..35).map(|i| DayForms {
            nth_weekday: 1 << i,
            ..DayForms::default()
        }));
        // Every month length and every weekday of the 1st, with leap and century years.
        let years = [2023, 2024, 2025, 2026, 2027, 2028, 2029, 2100, 2400];
        let mut named = 0;
        for forms in &singles {
            for year in years {
                for month in 1..=12 {
                    let (len, first) = (days_in_month(year, month), weekday(year, month, 1));
                    let got = forms.days_of_month(len, first) | forms.days_of_week(len, first);
                    let want = reference_days(forms, year, month, false)
                        | reference_days(forms, year, month, true);
                    assert_eq!(got, want, "{forms:?} in {year}-{month:02}");
                    named += got.count_ones();
                }
            }
        }
        // Each single form names at most one day a month, and most name one.
        assert!(named > 9 * 12 * singles.len() as u32 * 8 / 10, "{named}");
    }

    #[test]
    fn accepted_forms() {
        let forms = |text: &str| parse(text).forms;
        let none = DayForms::default();
        let check = |text: &str, want: DayForms| assert_eq!(forms(text), want, "{text:?}");
        check(
            "0 23 L * *",
            DayForms {
                before_last: 1,
                ..none
            },
        );
        check(
            "0 23 l * *",
            DayForms {
                before_last: 1,
                ..none
            },
        );
        check(
            "0 0 L-0 * *",
            DayForms {
                before_last: 1,
                ..none
            },
        );
        check(
            "0 0 L-3 * *",
            DayForms {
                before_last: 1 << 3,
                ..none
            },
        );
        check(
            "0 0 L-30 * *",
            DayForms {
                before_last: 1 << 30,
                ..none
            },
        );
        check(
            "0 0 1W * *",
            DayForms {
                nearest_weekday: 1 << 1,
                ..none
            },
        );
        check(
            "0 0 31w * *",
            DayForms {
                nearest_weekday: 1 << 31,
                ..none
            },
        );
        check(
            "0 0 LW * *",
            DayForms {
                last_weekday: true,
                ..none
            },
        );
        check(
            "0 0 lw * *",
            DayForms {
                last_weekday: true,
                ..none
            },
        );
        check(
            "0 0 ? * 5L",
            DayForms {
                last_of_weekday: 1 << 5,
                ..none
            },
        );
        check(
            "0 0 ? * FRIL",
            DayForms {
                last_of_weekday: 1 << 5,
                ..none
            },
        );
        check(
            "0 0 ? * fril",
            DayForms {
                last_of_weekday: 1 << 5,
                ..none
            },
        );
        check(
            "0 0 ? * 7L",
            DayForms {
                last_of_weekday: 1,
                ..none
            },
        );
        check(
            "0 0 ? * 0L",
            DayForms {
                last_of_weekday: 1,
                ..none
            },
        );
        check(
            "0 0 ? * TUE#2",
            DayForms {
                nth_weekday: 1 << (7 + 2),
                ..none
            },
        );
        check(
            "0 0 ? * 2#2",
            DayForms {
                nth_weekday: 1 << (7 + 2),
                ..none
            },
        );
        check(
            "0 0 ? * 7#1",
            DayForms {
                nth_weekday: 1,
                ..none
            },
        );
        check(
            "0 0 ? * SAT#5",
            DayForms {
                nth_weekday: 1 << (28 + 6),
                ..none
            },
        );
        check(
            "0 0 0 L * ?",
            DayForms {
                before_last: 1,
                ..none
            },
        );
        // Lists are unions; plain items keep their bits.
        check(
            "0 0 1,L,L-1,15W * *",
            DayForms {
                before_last: 0b11,
                nearest_weekday: 1 << 15,
                ..none
            },
        );
        check(
            "0 0 ? * MON#1,FRIL,WEDL",
            DayForms {
                last_of_weekday: 0b10_1000,
                nth_weekday: 1 << 1,
                ..none
            },
        );
        assert_eq!(parse("0 0 1,L * *").days_of_month, 1 << 1);
        assert_eq!(parse("0 0 ? * MON,FRIL").days_of_week, 1 << 1);
        // Words holding an L or a W are still names (and still not forms).
        check("0 0 * JUL WED", none);
        check("0 0 * jul-dec SUN-SAT", none);
    }

    #[test]
    fn forms_restrict_their_field_for_the_day_rule() {
        let check =
            |text: &str, either: bool| assert_eq!(parse(text).days_either, either, "{text:?}");
        check("0 0 L * *", false);
        check("0 0 L * ?", false);
        check("0 0 ? * FRIL", false);
        check("0 0 * * FRIL", false);
        check("0 0 L * FRI", true);
        check("0 0 15W * TUE#2", true);
        check("0 0 1-7 * MONL", true);
    }

    #[test]
    fn refused_forms_say_which_field_and_what_it_takes() {
        let check = |text: &str, message: &str| match CronExpr::parse(text) {
            Ok(expr) => panic!("{text:?} parsed as {expr:?}"),
            Err(error) => assert_eq!(error.to_string(), message, "{text:?}"),
        };
        const NOT_HERE: &str = "L, W and # are only allowed in the day-of-month field (L, L-N, NW, LW) and the day-of-week field (DL, D#N)";
        const ALONE: &str =
            "L, W and # forms stand alone: not in a range or with a step (a list such as 1,L is fine)";
        const DOM: &str =
            "not a day-of-month form: the forms are L, L-N (N 0-30), NW (N 1-31) and LW";
        const DOW: &str = "not a day-of-week form: the forms are DL (the last weekday D of the month) and D#N (the Nth, N 1-5)";
        const BEFORE_LAST: &str =
            "L-N takes N from 0 to 30 (days before the last day of the month)";
        const NEAREST: &str = "NW takes a day N from 1 to 31 (W alone names no day)";
        const WEEKDAY: &str = "DL and D#N take a weekday D from 0 to 7 or SUN-SAT";
        const NTH: &str = "D#N takes N from 1 to 5";
        let table: &[(&str, &str, &str)] = &[
            (
                "0 0 L-31 * *",
                r#"field 3 (day of month) "L-31""#,
                BEFORE_LAST,
            ),
            (
                "0 0 L-99999 * *",
                r#"field 3 (day of month) "L-99999""#,
                BEFORE_LAST,
            ),
            ("0 0 L- * *", r#"field 3 (day of month) "L-""#, BEFORE_LAST),
            (
                "0 0 L-x * *",
                r#"field 3 (day of month) "L-x""#,
                BEFORE_LAST,
            ),
            (
                "0 0 L--1 * *",
                r#"field 3 (day of month) "L--1""#,
                BEFORE_LAST,
            ),
            ("0 0 0W * *", r#"field 3 (day of month) "0W""#, NEAREST),
            ("0 0 32W * *", r#"field 3 (day of month) "32W""#, NEAREST),
            ("0 0 W * *", r#"field 3 (day of month) "W""#, NEAREST),
            ("0 0 0 W * *", r#"field 4 (day of month) "W""#, NEAREST),
            ("0 0 5L * *", r#"field 3 (day of month) "5L""#, DOM),
            ("0 0 FRIL * *", r#"field 3 (day of month) "FRIL""#, DOM),
            ("0 0 3#2 * *", r#"field 3 (day of month) "3#2""#, DOM),
            ("0 0 15LW * *", r#"field 3 (day of month) "15LW""#, DOM),
            ("0 0 ? * L", r#"field 5 (day of week) "L""#, DOW),
            ("0 0 ? * LW", r#"field 5 (day of week) "LW""#, DOW),
            ("0 0 ? * W", r#"field 5 (day of week) "W""#, DOW),
            ("0 0 ? * 5W", r#"field 5 (day of week) "5W""#, DOW),
            ("0 0 ? * L-2", r#"field 5 (day of week) "L-2""#, DOW),
            ("0 0 ? * 3#6", r#"field 5 (day of week) "3#6""#, NTH),
            ("0 0 ? * 3#0", r#"field 5 (day of week) "3#0""#, NTH),
            ("0 0 ? * 3#", r#"field 5 (day of week) "3#""#, NTH),
            ("0 0 ? * 3#1#2", r#"field 5 (day of week) "3#1#2""#, NTH),
            ("0 0 ? * 8#1", r#"field 5 (day of week) "8#1""#, WEEKDAY),
            ("0 0 ? * #1", r##"field 5 (day of week) "#1""##, WEEKDAY),
            (
                "0 0 ? * FRIDAY#1",
                r#"field 5 (day of week) "FRIDAY#1""#,
                WEEKDAY,
            ),
            ("0 0 ? * 8L", r#"field 5 (day of week) "8L""#, WEEKDAY),
            ("0 0 ? * 0,99L", r#"field 5 (day of week) "99L""#, WEEKDAY),
            ("0 L * * *", r#"field 2 (hour) "L""#, NOT_HERE),
            ("0 0 L * * *", r#"field 3 (hour) "L""#, NOT_HERE),
            ("L * * * *", r#"field 1 (minute) "L""#, NOT_HERE),
            ("5W 0 0 * * *", r#"field 1 (second) "5W""#, NOT_HERE),
            ("0 0 * L *", r#"field 4 (month) "L""#, NOT_HERE),
            ("0 0 * 1#2 *", r#"field 4 (month) "1#2""#, NOT_HERE),
            ("0 1-L * * *", r#"field 2 (hour) "1-L""#, NOT_HERE),
            ("0 0 L,15 L *", r#"field 4 (month) "L""#, NOT_HERE),
            ("0 0 1-LW * *", r#"field 3 (day of month) "1-LW""#, ALONE),
            (
                "0 0 L-5-L * *",
                r#"field 3 (day of month) "L-5-L""#,
                BEFORE_LAST,
            ),
            ("0 0 L/2 * *", r#"field 3 (day of month) "L/2""#, ALONE),
            ("0 0 L-3/2 * *", r#"field 3 (day of month) "L-3/2""#, ALONE),
            (
                "0 0 15W-20 * *",
                r#"field 3 (day of month) "15W-20""#,
                ALONE,
            ),
            (
                "0 0 ? * MONL-FRI",
                r#"field 5 (day of week) "MONL-FRI""#,
                ALONE,
            ),
            ("0 0 ? * 1-5L", r#"field 5 (day of week) "1-5L""#, ALONE),
            ("0 0 ? * 5#3/2", r#"field 5 (day of week) "5#3/2""#, ALONE),
        ];
        for (text, prefix, problem) in table {
            check(text, &format!("{prefix}: {problem}"));
        }
        // A form that no allowed month has is an expression that never fires.
        let never = "the expression never fires: no allowed month has the allowed days of month";
        check("0 0 L-29 2 *", never);
        check("0 0 L-30 4,6,9,11 *", never);
        check("0 0 30W 2 *", never);
        check("0 0 31W 2,4 *", never);
        // …but one that a leap year has is fine, and so is any day-of-week form.
        parse("0 0 L-28 2 *");
        parse("0 0 29W 2 *");
        parse("0 0 * 2 SUN#5");
        parse("0 0 30W 2 SUN#5");
    }

    #[test]
    fn next_fire_times_across_years() {
        let at = |text: &str| {
            let (date, time) = text.split_once('T').unwrap_or((text, "00:00:00"));
            let d: Vec<i32> = date.split('-').map(|p| p.parse().unwrap()).collect();
            let t: Vec<u8> = time.split(':').map(|p| p.parse().unwrap()).collect();
            Civil {
                year: d[0],
                month: d[1] as u8,
                day: d[2] as u8,
                hour: t[0],
                minute: t[1],
                second: t[2],
            }
        };
        let check = |text: &str, from: &str, want: &[&str]| {
            let expr = parse(text);
            let mut cursor = at(from);
            let mut got = Vec::new();
            for _ in want {
                let Some(next) = expr.next_match(cursor) else {
                    break;
                };
                assert!(expr.matches(next), "{text:?}: {next}");
                got.push(next.to_string());
                cursor = Civil::from_epoch_seconds(next.as_epoch_seconds() + 1);
            }
            let want: Vec<String> = want.iter().map(|w| at(w).to_string()).collect();
            assert_eq!(got, want, "{text:?} from {from}");
        };
        // The last day of the month at 23:00, through a leap February.
        check(
            "0 23 L * *",
            "2024-01-15",
            &[
                "2024-01-31T23:00:00",
                "2024-02-29T23:00:00",
                "2024-03-31T23:00:00",
                "2024-04-30T23:00:00",
            ],
        );
        check(
            "0 23 L 2 *",
            "2023-01-01",
            &[
                "2023-02-28T23:00:00",
                "2024-02-29T23:00:00",
                "2025-02-28T23:00:00",
            ],
        );
        check("0 0 L 2 *", "2099-03-01", &["2100-02-28", "2101-02-28"]);
        check("0 0 L-1 2 *", "2024-01-01", &["2024-02-28", "2025-02-27"]);
        // L-30 is the 1st of a 31-day month; L-28 in February the 1st of a leap year's.
        check(
            "0 0 L-30 * *",
            "2026-01-02",
            &["2026-03-01", "2026-05-01", "2026-07-01", "2026-08-01"],
        );
        check("0 0 L-28 2 *", "2024-02-02", &["2028-02-01", "2032-02-01"]);
        // 1W on Saturday the 1st is Monday the 3rd; on a Monday the 1st, the 1st.
        check("0 0 1W * *", "2025-10-02", &["2025-11-03", "2025-12-01"]);
        // 31W on Sunday the 31st is Friday the 29th; months without a 31st do not fire.
        check(
            "0 0 31W * *",
            "2025-08-01",
            &["2025-08-29", "2025-10-31", "2025-12-31"],
        );
        // 15W: a Saturday goes back to Friday, a Sunday forward to Monday.
        check(
            "0 0 15W * *",
            "2025-11-01",
            &["2025-11-14", "2025-12-15", "2026-01-15", "2026-02-16"],
        );
        // 29W in February: leap years only; on Sunday the 29th, Friday the 27th.
        check("0 0 0 29W 2 *", "2024-03-01", &["2028-02-29", "2032-02-27"]);
        check("0 0 0 29W 2 *", "2097-03-01", &["2104-02-29"]);
        check(
            "0 0 LW * *",
            "2025-08-01",
            &["2025-08-29", "2025-09-30", "2025-10-31", "2025-11-28"],
        );
        check("0 0 LW * *", "2026-01-01", &["2026-01-30", "2026-02-27"]);
        // The second Tuesday, the last Friday, the first Sunday.
        check(
            "0 9 * * TUE#2",
            "2026-01-01",
            &[
                "2026-01-13T09:00:00",
                "2026-02-10T09:00:00",
                "2026-03-10T09:00:00",
            ],
        );
        check(
            "0 0 ? * FRIL",
            "2026-01-01",
            &["2026-01-30", "2026-02-27", "2026-03-27"],
        );
        check(
            "0 0 ? * 5L",
            "2026-01-01",
            &["2026-01-30", "2026-02-27", "2026-03-27"],
        );
        check(
            "0 0 ? * 7#1",
            "2026-01-01",
            &["2026-01-04", "2026-02-01", "2026-03-01"],
        );
        check(
            "0 0 * * SAT#5",
            "2026-01-01",
            &["2026-01-31", "2026-05-30", "2026-08-29"],
        );
        // A February with a 5th Monday: 40 years apart around 2100, found in one search.
        check(
            "0 0 0 * 2 MON#5",
            "2024-01-01",
            &["2044-02-29", "2072-02-29", "2112-02-29"],
        );
        // Lists are unions: the first and the last day; the first Monday and the last Friday.
        check(
            "0 0 1,L * *",
            "2026-01-15",
            &["2026-01-31", "2026-02-01", "2026-02-28", "2026-03-01"],
        );
        check(
            "0 0 ? * MON#1,FRIL",
            "2026-01-01",
            &["2026-01-05", "2026-01-30", "2026-02-02"],
        );
        // The day rule: both fields restricted, either decides (the last day, and Fridays).
        check(
            "0 0 L * FRI",
            "2026-01-26",
            &["2026-01-30", "2026-01-31", "2026-02-06"],
        );
        check(
            "0 0 15W * TUE#2",
            "2025-11-01",
            &["2025-11-11", "2025-11-14", "2025-12-09"],
        );
        // Seconds, in a 6-field expression.
        check(
            "30 0 0 L * *",
            "2026-01-31T00:00:31",
            &["2026-02-28T00:00:30"],
        );
        // No firing before year 9999 is no firing.
        let none =
            |text: &str, from: &str| assert_eq!(parse(text).next_match(at(from)), None, "{text:?}");
        none("0 0 * 2 MON#5", "9988-03-01");
        none("0 0 L 12 *", "9999-12-31T00:00:01");
        none("0 0 29W 2 *", "9997-01-01");
    }

    proptest::proptest! {
        /// Day fields made mostly of form characters: no panic, and whatever parses finds
        /// matching times in order (the parser's own proptest covers whole expressions).
        #[test]
        fn day_form_fields_never_panic(
            dom in "(L|LW|L-[0-9]{1,2}|[0-9]{1,2}W)(,[0-9]{1,2}W|,L-[0-9]{1,2})?|[0-9LWlw#?*,/-]{1,8}",
            month in proptest::sample::select(vec!["*", "2", "2,4", "1-6", "FEB"]),
            dow in r"\?|\*|[0-8](L|#[0-6])(,[0-8]#[1-5])?|(SUN|MON|FRI|sat)(L|#[0-6])|[0-7LW#?*,/-]{1,6}",
            year in 1990i32..2400,
        ) {
            let text = format!("0 0 {dom} {month} {dow}");
            match CronExpr::parse(&text) {
                Ok(expr) => {
                    let from = Civil::midnight(year, 1, 1);
                    if let Some(first) = expr.next_match(from) {
                        proptest::prop_assert!(first >= from && expr.matches(first), "{}", text);
                        let after = Civil::from_epoch_seconds(first.as_epoch_seconds() + 1);
                        let second = expr.next_match(after);
                        proptest::prop_assert!(second.is_some_and(|s| s > first && expr.matches(s)), "{}", text);
                    } else {
                        proptest::prop_assert!(false, "{} never fires from {}", text, from);
                    }
                }
                Err(error) => proptest::prop_assert!(error.to_string().len() < 300),
            }
        }
    }
}
