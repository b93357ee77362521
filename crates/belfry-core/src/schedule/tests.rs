//! Tests of next-fire computation across time zones and DST, bounds, and misfire policies.

use jiff::Timestamp;
use proptest::prelude::*;

use super::*;

/// Milliseconds of an RFC 9557 zoned date-time such as `2026-03-08T03:00:00-04:00[America/New_York]`.
fn ms(text: &str) -> UnixMs {
    let zoned: jiff::Zoned = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
    zoned.timestamp().as_millisecond() as u64
}

/// The next `expected.len()` firings of `expression` in `zone` after `after` are `expected`,
/// written in the zone.
fn check(expression: &str, zone: &str, after: &str, expected: &[&str]) {
    let cron = CronSchedule::new(CronExpr::parse(expression).unwrap(), zone).unwrap();
    let mut cursor = ms(after);
    let mut got = Vec::new();
    for _ in expected {
        let Some(next) = cron.next_after(cursor) else {
            break;
        };
        assert!(next > cursor);
        got.push(cron.format_local(next).unwrap());
        cursor = next;
    }
    assert_eq!(got, expected, "{expression:?} in {zone} after {after}");
}

#[test]
fn utc_and_tokyo_have_no_surprises() {
    check(
        "0 0 9 * * MON-FRI",
        "UTC",
        "2026-11-20T09:00:00+00:00[UTC]",
        &[
            "2026-11-23T09:00:00+00:00[UTC]",
            "2026-11-24T09:00:00+00:00[UTC]",
        ],
    );
    check(
        "*/20 * * * * *",
        "UTC",
        "2026-11-20T23:59:30.500+00:00[UTC]",
        &[
            "2026-11-20T23:59:40+00:00[UTC]",
            "2026-11-21T00:00:00+00:00[UTC]",
        ],
    );
    check(
        "30 2 * * *",
        "Asia/Tokyo",
        "2026-03-08T00:00:00+09:00[Asia/Tokyo]",
        &[
            "2026-03-08T02:30:00+09:00[Asia/Tokyo]",
            "2026-03-09T02:30:00+09:00[Asia/Tokyo]",
        ],
    );
    check(
        "@yearly",
        "Asia/Tokyo",
        "2026-06-01T00:00:00+09:00[Asia/Tokyo]",
        &["2027-01-01T00:00:00+09:00[Asia/Tokyo]"],
    );
}

#[test]
fn new_york_spring_forward_fires_skipped_times_once_at_the_transition() {
    let ny = "America/New_York";
    check(
        "30 2 * * *",
        ny,
        "2026-03-07T12:00:00-05:00[America/New_York]",
        &[
            "2026-03-08T03:00:00-04:00[America/New_York]",
            "2026-03-09T02:30:00-04:00[America/New_York]",
        ],
    );
    check(
        "* * * * *",
        ny,
        "2026-03-08T01:58:00-05:00[America/New_York]",
        &[
            "2026-03-08T01:59:00-05:00[America/New_York]",
            "2026-03-08T03:00:00-04:00[America/New_York]",
            "2026-03-08T03:01:00-04:00[America/New_York]",
        ],
    );
    check(
        "30 * * * *",
        ny,
        "2026-03-08T00:00:00-05:00[America/New_York]",
        &[
            "2026-03-08T00:30:00-05:00[America/New_York]",
            "2026-03-08T01:30:00-05:00[America/New_York]",
            "2026-03-08T03:00:00-04:00[America/New_York]",
            "2026-03-08T03:30:00-04:00[America/New_York]",
        ],
    );
    check(
        "0 0,15,30,45 2 * * *",
        ny,
        "2026-03-07T03:00:00-05:00[America/New_York]",
        &[
            "2026-03-08T03:00:00-04:00[America/New_York]",
            "2026-03-09T02:00:00-04:00[America/New_York]",
        ],
    );
}

#[test]
fn new_york_fall_back_fires_fixed_times_once_and_hourly_ones_each_real_hour() {
    let ny = "America/New_York";
    check(
        "30 1 * * *",
        ny,
        "2026-10-31T12:00:00-04:00[America/New_York]",
        &[
            "2026-11-01T01:30:00-04:00[America/New_York]",
            "2026-11-02T01:30:00-05:00[America/New_York]",
        ],
    );
    // After the first occurrence has passed, the second does not fire.
    check(
        "30 1 * * *",
        ny,
        "2026-11-01T01:10:00-05:00[America/New_York]",
        &["2026-11-02T01:30:00-05:00[America/New_York]"],
    );
    check(
        "0 1-2 * * *",
        ny,
        "2026-11-01T00:00:00-04:00[America/New_York]",
        &[
            "2026-11-01T01:00:00-04:00[America/New_York]",
            "2026-11-01T02:00:00-05:00[America/New_York]",
        ],
    );
    check(
        "*/20 * * * *",
        ny,
        "2026-11-01T00:50:00-04:00[America/New_York]",
        &[
            "2026-11-01T01:00:00-04:00[America/New_York]",
            "2026-11-01T01:20:00-04:00[America/New_York]",
            "2026-11-01T01:40:00-04:00[America/New_York]",
            "2026-11-01T01:00:00-05:00[America/New_York]",
            "2026-11-01T01:20:00-05:00[America/New_York]",
            "2026-11-01T01:40:00-05:00[America/New_York]",
            "2026-11-01T02:00:00-05:00[America/New_York]",
        ],
    );
    // From inside the first pass, an hourly schedule's earlier minute comes again in the
    // second pass.
    check(
        "5 * * * *",
        ny,
        "2026-11-01T01:10:00-04:00[America/New_York]",
        &[
            "2026-11-01T01:05:00-05:00[America/New_York]",
            "2026-11-01T02:05:00-05:00[America/New_York]",
        ],
    );
}

#[test]
fn berlin_transitions() {
    let berlin = "Europe/Berlin";
    check(
        "0 30 2 * * *",
        berlin,
        "2026-03-28T12:00:00+01:00[Europe/Berlin]",
        &[
            "2026-03-29T03:00:00+02:00[Europe/Berlin]",
            "2026-03-30T02:30:00+02:00[Europe/Berlin]",
        ],
    );
    check(
        "30 2 * * *",
        berlin,
        "2026-10-24T12:00:00+02:00[Europe/Berlin]",
        &[
            "2026-10-25T02:30:00+02:00[Europe/Berlin]",
            "2026-10-26T02:30:00+01:00[Europe/Berlin]",
        ],
    );
    check(
        "0 * * * *",
        berlin,
        "2026-10-25T01:30:00+02:00[Europe/Berlin]",
        &[
            "2026-10-25T02:00:00+02:00[Europe/Berlin]",
            "2026-10-25T02:00:00+01:00[Europe/Berlin]",
            "2026-10-25T03:00:00+01:00[Europe/Berlin]",
        ],
    );
}

/// The L, W and # forms fire on DST days by the same skip and repeat rules as any day.
#[test]
fn day_forms_on_dst_days_follow_the_dst_rule() {
    let berlin = "Europe/Berlin";
    // 2024-03-31, the last day of March, was a Sunday: Berlin skipped 02:00-02:59.
    check(
        "0 30 2 L * *",
        berlin,
        "2024-03-30T12:00:00+01:00[Europe/Berlin]",
        &[
            "2024-03-31T03:00:00+02:00[Europe/Berlin]",
            "2024-04-30T02:30:00+02:00[Europe/Berlin]",
        ],
    );
    // 2027-10-31, the last day of October, is a Sunday: Berlin repeats 02:00-02:59. A fixed
    // hour fires at the first occurrence only; every hour fires at both.
    check(
        "0 30 2 L * *",
        berlin,
        "2027-10-30T12:00:00+02:00[Europe/Berlin]",
        &[
            "2027-10-31T02:30:00+02:00[Europe/Berlin]",
            "2027-11-30T02:30:00+01:00[Europe/Berlin]",
        ],
    );
    check(
        "0 30 * L * *",
        berlin,
        "2027-10-31T01:00:00+02:00[Europe/Berlin]",
        &[
            "2027-10-31T01:30:00+02:00[Europe/Berlin]",
            "2027-10-31T02:30:00+02:00[Europe/Berlin]",
            "2027-10-31T02:30:00+01:00[Europe/Berlin]",
            "2027-10-31T03:30:00+01:00[Europe/Berlin]",
        ],
    );
    // Berlin changes on the last Sunday of March and October: SUNL is always a DST day.
    check(
        "0 30 2 ? * SUNL",
        berlin,
        "2026-03-01T00:00:00+01:00[Europe/Berlin]",
        &[
            "2026-03-29T03:00:00+02:00[Europe/Berlin]",
            "2026-04-26T02:30:00+02:00[Europe/Berlin]",
        ],
    );
    // LW on a Friday before a Sunday the 31st is not moved by the change that Sunday.
    check(
        "0 30 2 LW 10 *",
        berlin,
        "2027-01-01T00:00:00+01:00[Europe/Berlin]",
        &[
            "2027-10-29T02:30:00+02:00[Europe/Berlin]",
            "2028-10-31T02:30:00+01:00[Europe/Berlin]",
        ],
    );
    // New York changes on the second Sunday of March and the first of November.
    let new_york = "America/New_York";
    check(
        "30 2 * * SUN#2",
        new_york,
        "2026-03-01T00:00:00-05:00[America/New_York]",
        &[
            "2026-03-08T03:00:00-04:00[America/New_York]",
            "2026-04-12T02:30:00-04:00[America/New_York]",
        ],
    );
    check(
        "30 1 * * 7#1",
        new_york,
        "2026-10-15T00:00:00-04:00[America/New_York]",
        &[
            "2026-11-01T01:30:00-04:00[America/New_York]",
            "2026-12-06T01:30:00-05:00[America/New_York]",
        ],
    );
    // The last day of February in a DST zone, across a leap year.
    check(
        "0 23 L 2 *",
        new_york,
        "2027-01-01T00:00:00-05:00[America/New_York]",
        &[
            "2027-02-28T23:00:00-05:00[America/New_York]",
            "2028-02-29T23:00:00-05:00[America/New_York]",
        ],
    );
}

#[test]
fn lord_howe_half_hour_shift() {
    let zone = "Australia/Lord_Howe";
    // DST ends on 2026-04-05: 02:00 (+11) becomes 01:30 (+10:30), repeating 01:30-01:59.
    check(
        "45 1 * * *",
        zone,
        "2026-04-04T12:00:00+11:00[Australia/Lord_Howe]",
        &[
            "2026-04-05T01:45:00+11:00[Australia/Lord_Howe]",
            "2026-04-06T01:45:00+10:30[Australia/Lord_Howe]",
        ],
    );
    check(
        "*/15 * * * *",
        zone,
        "2026-04-05T01:20:00+11:00[Australia/Lord_Howe]",
        &[
            "2026-04-05T01:30:00+11:00[Australia/Lord_Howe]",
            "2026-04-05T01:45:00+11:00[Australia/Lord_Howe]",
            "2026-04-05T01:30:00+10:30[Australia/Lord_Howe]",
            "2026-04-05T01:45:00+10:30[Australia/Lord_Howe]",
            "2026-04-05T02:00:00+10:30[Australia/Lord_Howe]",
        ],
    );
    // DST starts on 2026-10-04: 02:00 (+10:30) becomes 02:30 (+11).
    check(
        "15 2 * * *",
        zone,
        "2026-10-03T12:00:00+10:30[Australia/Lord_Howe]",
        &[
            "2026-10-04T02:30:00+11:00[Australia/Lord_Howe]",
            "2026-10-05T02:15:00+11:00[Australia/Lord_Howe]",
        ],
    );
    check(
        "*/15 * * * *",
        zone,
        "2026-10-04T01:50:00+10:30[Australia/Lord_Howe]",
        &[
            "2026-10-04T02:30:00+11:00[Australia/Lord_Howe]",
            "2026-10-04T02:45:00+11:00[Australia/Lord_Howe]",
        ],
    );
}

#[test]
fn santiago_transitions_at_midnight() {
    let zone = "America/Santiago";
    // 2026-04-05 00:00 (-03) falls back to 2026-04-04 23:00 (-04): the previous day's last
    // hour repeats.
    check(
        "30 23 * * *",
        zone,
        "2026-04-04T12:00:00-03:00[America/Santiago]",
        &[
            "2026-04-04T23:30:00-03:00[America/Santiago]",
            "2026-04-05T23:30:00-04:00[America/Santiago]",
        ],
    );
    // 2026-09-06 00:00 (-04) springs forward to 01:00 (-03): that midnight never happens.
    check(
        "@daily",
        zone,
        "2026-09-05T12:00:00-04:00[America/Santiago]",
        &[
            "2026-09-06T01:00:00-03:00[America/Santiago]",
            "2026-09-07T00:00:00-03:00[America/Santiago]",
        ],
    );
}

#[test]
fn instants_beyond_year_9999_have_no_next_firing() {
    let cron = CronSchedule::new(CronExpr::parse("* * * * * *").unwrap(), "Europe/Berlin").unwrap();
    assert_eq!(cron.next_after(u64::MAX), None);
    assert_eq!(cron.next_after(253_402_300_799_000), None);
    // The last instant the time zone library can write (9999-12-30T22:00:00Z): a firing past
    // it was answered as "at": "".
    let last = jiff::Timestamp::MAX.as_second() as u64 * 1000;
    assert_eq!(cron.next_after(last - 2_000), Some(last - 1_000));
    assert_eq!(cron.next_after(last - 1_000), Some(last));
    assert_eq!(cron.next_after(last), None);
    assert!(jiff::Timestamp::from_second((last / 1000) as i64).is_ok());
}

#[test]
fn unknown_zone_is_refused() {
    let expr = CronExpr::parse("* * * * *").unwrap();
    for bad in [
        "Mars/Olympus_Mons",
        "",
        "../../etc/passwd",
        &"A".repeat(100),
    ] {
        let error = CronSchedule::new(expr.clone(), bad).unwrap_err();
        assert!(
            error.to_string().starts_with("unknown time zone"),
            "{error}"
        );
    }
    assert_eq!(
        Trigger::cron("* * * * *", "Nowhere/Land")
            .unwrap_err()
            .to_string(),
        r#"unknown time zone "Nowhere/Land": expected an IANA name such as "Europe/Berlin" or "UTC""#
    );
}

#[test]
fn a_zone_name_a_typo_away_gets_the_known_one_suggested() {
    let expr = CronExpr::parse("* * * * *").unwrap();
    for (typo, meant) in [
        ("Asia/Tokio", "Asia/Tokyo"),
        ("Europe/Berlim", "Europe/Berlin"),
        ("america/new_yrok", "America/New_York"),
    ] {
        let error = CronSchedule::new(expr.clone(), typo).unwrap_err();
        assert_eq!(error.suggestion.as_deref(), Some(meant), "{typo}");
        assert!(
            error
                .to_string()
                .ends_with(&format!("(did you mean {meant:?}?)")),
            "{error}"
        );
    }
    // Nothing is close to these: no guess.
    for far in ["Mars/Olympus_Mons", "Nowhere/Land"] {
        let error = CronSchedule::new(expr.clone(), far).unwrap_err();
        assert_eq!(error.suggestion, None, "{far}: {error}");
    }
}

/// The zone directory's files that are not zones are refused: `localtime` is the host's zone,
/// so a schedule in it fired by each node's /etc/localtime.
#[test]
fn host_dependent_zone_files_are_refused() {
    let expr = CronExpr::parse("0 9 * * *").unwrap();
    for name in ["localtime", "posixrules", "Factory", "LOCALTIME"] {
        assert!(CronSchedule::new(expr.clone(), name).is_err(), "{name}");
    }
}

#[test]
fn intervals_and_bounds() {
    let spec = |start, end| {
        ScheduleSpec::new(
            Trigger::every(10_000, 1_000).unwrap(),
            start,
            end,
            1,
            MisfirePolicy::FireOnce,
        )
        .unwrap()
    };
    assert_eq!(spec(None, None).preview(0, 3), [1_000, 11_000, 21_000]);
    assert_eq!(spec(None, None).preview(11_000, 2), [21_000, 31_000]);
    assert_eq!(spec(None, None).preview(11_001, 1), [21_000]);
    // start_at inclusive, end_at inclusive.
    assert_eq!(
        spec(Some(21_000), Some(41_000)).preview(0, 10),
        [21_000, 31_000, 41_000]
    );
    assert_eq!(spec(Some(21_001), Some(40_999)).preview(0, 10), [31_000]);
    assert_eq!(spec(None, Some(500)).preview(0, 10), Vec::<UnixMs>::new());
    assert_eq!(spec(None, None).preview(0, usize::MAX).len(), PREVIEW_MAX);

    let error = |r: Result<ScheduleSpec, ScheduleError>| r.unwrap_err().to_string();
    assert_eq!(
        error(Trigger::every(999, 0).map(|_| unreachable!())),
        "every_ms must be at least 1000 ms, got 999"
    );
    assert_eq!(
        error(Trigger::every(INTERVAL_MS_MAX + 1, 0).map(|_| unreachable!())),
        "every_ms must be at most 315360000000 ms, got 315360000001"
    );
    let trigger = Trigger::every(1_000, 0).unwrap();
    assert_eq!(
        error(ScheduleSpec::new(
            trigger.clone(),
            Some(10),
            Some(9),
            1,
            MisfirePolicy::Skip
        )),
        "end_at (9) is before start_at (10)"
    );
    for shards in [0, SHARD_COUNT_MAX + 1] {
        assert_eq!(
            error(ScheduleSpec::new(
                trigger.clone(),
                None,
                None,
                shards,
                MisfirePolicy::Skip
            )),
            format!("shard_count must be 1 to 1000, got {shards}")
        );
    }
    assert_eq!(
        error(Trigger::cron("0 0 32 * *", "UTC").map(|_| unreachable!())),
        r#"invalid cron expression: field 3 (day of month) "32": value out of range 1-31"#
    );
    // Near the end of u64 an interval simply stops.
    let far = ScheduleSpec::new(
        Trigger::every(INTERVAL_MS_MAX, u64::MAX - 10).unwrap(),
        None,
        None,
        1,
        MisfirePolicy::Skip,
    )
    .unwrap();
    assert_eq!(far.preview(u64::MAX - 100, 5), [u64::MAX - 10]);
}

fn interval_spec(misfire: MisfirePolicy, end_at_ms: Option<UnixMs>) -> ScheduleSpec {
    ScheduleSpec::new(
        Trigger::every(10_000, 0).unwrap(),
        None,
        end_at_ms,
        1,
        misfire,
    )
    .unwrap()
}

fn range(from: UnixMs, to: UnixMs) -> Vec<UnixMs> {
    (from..=to).step_by(10_000).collect()
}

#[test]
fn misfire_policies() {
    use MisfirePolicy::*;
    // (policy, end_at, cursor, now, fired, new cursor, misfired, dropped)
    type Row = (
        MisfirePolicy,
        Option<UnixMs>,
        UnixMs,
        UnixMs,
        Vec<UnixMs>,
        UnixMs,
        bool,
        u64,
    );
    let rows: Vec<Row> = vec![
        // Nothing due yet.
        (FireOnce, None, 100_000, 100_000, vec![], 100_000, false, 0),
        (FireOnce, None, 100_000, 109_999, vec![], 100_000, false, 0),
        // On time, or a little late: all due fire, whatever the policy.
        (
            Skip,
            None,
            100_000,
            110_000,
            vec![110_000],
            110_000,
            false,
            0,
        ),
        (
            Skip,
            None,
            100_000,
            125_000,
            vec![110_000, 120_000],
            120_000,
            false,
            0,
        ),
        (
            FireOnce,
            None,
            100_000,
            160_000,
            range(110_000, 160_000),
            160_000,
            false,
            0,
        ),
        // 900 s of downtime: due 110 s..=1000 s (90 times); missed are those before 940 s.
        (
            Skip,
            None,
            100_000,
            1_000_000,
            range(940_000, 1_000_000),
            1_000_000,
            true,
            83,
        ),
        (
            FireOnce,
            None,
            100_000,
            1_000_000,
            vec![1_000_000],
            1_000_000,
            true,
            89,
        ),
        (
            CatchUp,
            None,
            100_000,
            1_000_005,
            range(110_000, 1_000_000),
            1_000_000,
            true,
            0,
        ),
        // Skip keeps only the due times within the threshold of now.
        (
            Skip,
            None,
            100_000,
            1_065_000,
            vec![
                1_010_000, 1_020_000, 1_030_000, 1_040_000, 1_050_000, 1_060_000,
            ],
            1_060_000,
            true,
            90,
        ),
        // Catch-up is capped at the latest CATCH_UP_MAX.
        (
            CatchUp,
            None,
            0,
            20_000_000,
            range(10_010_000, 20_000_000),
            20_000_000,
            true,
            1_000,
        ),
        // end_at bounds the due set.
        (
            CatchUp,
            Some(150_000),
            100_000,
            1_000_000,
            range(110_000, 150_000),
            150_000,
            true,
            0,
        ),
        (
            FireOnce,
            Some(150_000),
            150_000,
            1_000_000,
            vec![],
            150_000,
            false,
            0,
        ),
    ];
    for (policy, end_at, cursor, now, fired, new_cursor, misfired, dropped) in rows {
        let due = interval_spec(policy, end_at).due(cursor, now);
        let expected = Due {
            fire_times: fired,
            cursor_ms: new_cursor,
            misfired,
            dropped,
        };
        assert_eq!(
            due, expected,
            "{policy:?} end {end_at:?} cursor {cursor} now {now}"
        );
    }
}

fn daily_at_nine_in_berlin(misfire: MisfirePolicy) -> ScheduleSpec {
    ScheduleSpec::new(
        Trigger::cron("0 9 * * *", "Europe/Berlin").unwrap(),
        None,
        None,
        1,
        misfire,
    )
    .unwrap()
}

#[test]
fn skip_after_downtime_fires_nothing_when_everything_is_old() {
    let daily = daily_at_nine_in_berlin(MisfirePolicy::Skip);
    let cursor = ms("2026-06-01T09:00:00+02:00[Europe/Berlin]");
    let now = ms("2026-06-04T12:00:00+02:00[Europe/Berlin]");
    let due = daily.due(cursor, now);
    assert!(due.fire_times.is_empty());
    assert!(due.misfired);
    assert_eq!(due.dropped, 3);
    assert_eq!(
        due.cursor_ms,
        ms("2026-06-04T09:00:00+02:00[Europe/Berlin]")
    );
}

#[test]
fn due_until_takes_fire_times_ahead_and_judges_misfires_at_now() {
    let daily = daily_at_nine_in_berlin(MisfirePolicy::Skip);
    let nine = ms("2026-06-04T09:00:00+02:00[Europe/Berlin]");
    let cursor = nine - 86_400_000;
    // Half a second before nine, looking a second ahead: nine fires, not late.
    let ahead = daily.due_until(cursor, nine - 500, nine + 500);
    assert_eq!(ahead.fire_times, vec![nine]);
    assert_eq!(ahead.cursor_ms, nine);
    assert!(!ahead.misfired);
    // Looking ahead less than the gap: nothing yet, as `due` at the same now.
    let short = daily.due_until(cursor, nine - 500, nine - 1);
    assert!(short.fire_times.is_empty());
    assert_eq!(short.cursor_ms, cursor);
    assert_eq!(short, daily.due(cursor, nine - 500));
    // An until before now counts as now.
    assert_eq!(
        daily.due_until(cursor, nine, nine - 10_000),
        daily.due(cursor, nine)
    );
    // Two days down: yesterday's nine is missed at now, whatever the look-ahead; Skip
    // drops it and fires today's, which is ahead of now.
    let down = daily.due_until(cursor - 86_400_000, nine - 500, nine + 500);
    assert!(down.misfired);
    assert_eq!(down.fire_times, vec![nine]);
    assert_eq!(down.dropped, 1);
}

#[test]
fn a_year_of_per_second_downtime_is_cheap_to_decide() {
    let every_second = ScheduleSpec::new(
        Trigger::cron("* * * * * *", "UTC").unwrap(),
        None,
        None,
        1,
        MisfirePolicy::CatchUp,
    )
    .unwrap();
    let now = 365 * 86_400_000 + 500;
    let due = every_second.due(0, now);
    assert_eq!(due.fire_times.len(), CATCH_UP_MAX);
    assert_eq!(due.fire_times.last(), Some(&(365 * 86_400_000)));
    assert_eq!(due.cursor_ms, 365 * 86_400_000);
    // A lower bound: the look-back stopped once it had CATCH_UP_MAX firings.
    assert!(due.dropped > 0);
}

// ---- property tests ----

const ZONES: [&str; 6] = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Tokyo",
    "America/Santiago",
];

/// Zones with DST in 2026: New York and Berlin (one hour at 02:00/03:00), Lord Howe (half an
/// hour), Santiago (at midnight, so the repeated hour belongs to the previous day) and Dublin
/// (whose tz data calls winter time the "daylight" one).
const DST_ZONES: [&str; 5] = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Europe/Dublin",
];

fn expression() -> impl Strategy<Value = String> {
    let second = prop::sample::select(vec!["0", "*/15", "30", "*"]);
    let minute = prop::sample::select(vec!["*", "*/7", "0", "30", "15,45", "0-10/5"]);
    let hour = prop::sample::select(vec!["*", "1", "2", "1-3", "*/2", "0", "2,3"]);
    let dom = prop::sample::select(vec!["*", "*", "1-15", "?"]);
    let dow = prop::sample::select(vec!["*", "*", "MON-FRI", "SUN"]);
    (second, minute, hour, dom, dow).prop_map(|(s, mi, h, d, w)| format!("{s} {mi} {h} {d} * {w}"))
}

fn time_fields() -> impl Strategy<Value = String> {
    let second = prop::sample::select(vec!["0", "*/15", "30"]);
    let minute = prop::sample::select(vec!["*", "*/7", "0", "30", "15,45"]);
    let hour = prop::sample::select(vec!["*", "1", "2", "1-3", "*/2", "0", "2,3", "23"]);
    (second, minute, hour).prop_map(|(s, mi, h)| format!("{s} {mi} {h}"))
}

/// An expression whose day fields name `date` and the two days after it (in its month) by
/// one kind of L, W or # form, so it fires within days of `date`.
fn day_form_expression(time: &str, kind: usize, date: Civil) -> String {
    let len = super::cron::days_in_month(date.year, date.month);
    const NAMES: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let items: Vec<String> = (date.day..=(date.day + 2).min(len))
        .map(|day| {
            let wd = usize::from(super::cron::weekday(date.year, date.month, day));
            match kind {
                0 => format!("L-{}", len - day),
                1 => format!("{day}W"),
                2 => format!("{wd}#{}", (day - 1) / 7 + 1),
                _ if day + 7 > len => format!("{}L", NAMES[wd]),
                _ => format!("{}#{}", NAMES[wd], (day - 1) / 7 + 1),
            }
        })
        .collect();
    match kind {
        0 | 1 => format!("{time} {} * ?", items.join(",")),
        _ => format!("{time} ? * {}", items.join(",")),
    }
}

fn offset_at(cron: &CronSchedule, second: i64) -> i64 {
    i64::from(
        cron.zone()
            .to_offset(Timestamp::from_second(second).unwrap())
            .seconds(),
    )
}

/// A slow reference: walks real seconds after `after_s` and applies the DST rule directly.
fn brute_next(cron: &CronSchedule, after_s: i64, limit_s: i64) -> Option<i64> {
    let expr = cron.expr();
    for s in after_s + 1..=limit_s {
        let offset = offset_at(cron, s);
        let before = offset_at(cron, s - 1);
        if offset > before {
            // s starts a gap: local times [s + before, s + offset) were skipped.
            let skipped =
                (s + before..s + offset).any(|c| expr.matches(Civil::from_epoch_seconds(c)));
            if skipped {
                return Some(s);
            }
        }
        let civil = Civil::from_epoch_seconds(s + offset);
        if !expr.matches(civil) {
            continue;
        }
        // A second occurrence: an earlier instant showed the same local time.
        let repeated = [1_800i64, 3_600, 7_200]
            .iter()
            .any(|&d| offset_at(cron, s - d) == offset + d);
        if repeated && !expr.every_hour() {
            continue;
        }
        return Some(s);
    }
    None
}

/// Instants of DST transitions in 2026 in the zone (none for UTC and Tokyo).
fn transitions_2026(cron: &CronSchedule) -> Vec<i64> {
    let start = Timestamp::from_second(1_767_225_600).unwrap();
    cron.zone()
        .following(start)
        .take(2)
        .map(|t| t.timestamp().as_second())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn next_fire_increases_and_matches(
        text in expression(),
        zone in prop::sample::select(ZONES.to_vec()),
        start_s in 1_577_836_800i64..2_051_222_400,
        start_ms_part in 0u64..1000,
    ) {
        let cron = CronSchedule::new(CronExpr::parse(&text).unwrap(), zone).unwrap();
        let mut cursor = start_s as u64 * 1000 + start_ms_part;
        for _ in 0..20 {
            let Some(next) = cron.next_after(cursor) else { break };
            prop_assert!(next > cursor);
            prop_assert_eq!(next % 1000, 0);
            let local = cron.local(next).unwrap();
            if !cron.expr().matches(local) {
                // Only a gap transition may fire at a non-matching local time, and only when
                // a skipped local time matched.
                let s = (next / 1000) as i64;
                let (offset, before) = (offset_at(&cron, s), offset_at(&cron, s - 1));
                prop_assert!(offset > before, "{} fired at {}", text, local);
                prop_assert!((s + before..s + offset)
                    .any(|c| cron.expr().matches(Civil::from_epoch_seconds(c))));
            }
            cursor = next;
        }
    }

    #[test]
    fn next_fire_agrees_with_brute_force_around_transitions(
        text in expression(),
        zone in prop::sample::select(DST_ZONES.to_vec()),
        which in 0usize..2,
        shift_s in -6 * 3_600i64..6 * 3_600,
    ) {
        let cron = CronSchedule::new(CronExpr::parse(&text).unwrap(), zone).unwrap();
        let transitions = transitions_2026(&cron);
        let after_s = transitions[which] + shift_s;
        let expected = brute_next(&cron, after_s, after_s + 8 * 86_400);
        let got = cron.next_after(after_s as u64 * 1000).map(|ms| (ms / 1000) as i64);
        prop_assert_eq!(got, expected, "{} in {} after {}", text, zone, after_s);
    }

    #[test]
    fn day_forms_agree_with_brute_force_around_transitions(
        time in time_fields(),
        kind in 0usize..4,
        zone in prop::sample::select(DST_ZONES.to_vec()),
        which in 0usize..2,
        shift_s in -6 * 3_600i64..6 * 3_600,
    ) {
        let utc = CronSchedule::new(CronExpr::parse("* * * * *").unwrap(), zone).unwrap();
        let transition = transitions_2026(&utc)[which];
        // The local date just after the change (Santiago's fall-back lands on the day before).
        let date = utc.local(transition as u64 * 1000).unwrap();
        let text = day_form_expression(&time, kind, date);
        let cron = CronSchedule::new(CronExpr::parse(&text).unwrap(), zone).unwrap();
        let after_s = transition + shift_s;
        let expected = brute_next(&cron, after_s, after_s + 8 * 86_400);
        let got = cron.next_after(after_s as u64 * 1000).map(|ms| (ms / 1000) as i64);
        prop_assert!(expected.is_some(), "{} in {} after {}", text, zone, after_s);
        prop_assert_eq!(got, expected, "{} in {} after {}", text, zone, after_s);
    }

    #[test]
    fn catch_up_partitions_the_due_set(
        cursor in 0u64..1_000_000,
        gap in 0u64..2_000_000,
        policy in prop::sample::select(vec![MisfirePolicy::Skip, MisfirePolicy::FireOnce, MisfirePolicy::CatchUp]),
    ) {
        let spec = interval_spec(policy, None);
        let now = cursor + gap;
        let all: Vec<UnixMs> = spec.preview(cursor, PREVIEW_MAX).into_iter().filter(|&t| t <= now).collect();
        let due = spec.due(cursor, now);
        prop_assert_eq!(due.fire_times.len() as u64 + due.dropped, all.len() as u64);
        prop_assert!(due.fire_times.iter().all(|t| all.contains(t)));
        prop_assert_eq!(due.cursor_ms, all.last().copied().unwrap_or(cursor));
        if !due.misfired || policy == MisfirePolicy::CatchUp {
            prop_assert_eq!(&due.fire_times, &all);
        }
    }
}
