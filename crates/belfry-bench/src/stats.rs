//! Measurement math: percentiles from HDR histograms, and the delivery tracker that turns
//! receipts into firing lateness, early deliveries, duplicates and losses.
//!
//! Everything here is pure (times are passed in), so the tests can check the arithmetic
//! without a clock.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency or lateness a histogram records: one hour in microseconds. Anything later
/// is clamped to this value (and still counted), so one pathological sample cannot fail a run.
pub const HISTOGRAM_US_MAX: u64 = 3_600_000_000;

/// Significant digits kept by the histograms: 3 gives 0.1% resolution at ~200 KiB each.
const HISTOGRAM_SIGFIG: u8 = 3;

/// A fresh histogram of microseconds, 1 µs .. [`HISTOGRAM_US_MAX`].
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy hdrhistogram's preconditions (low >= 1,
    // high >= 2 * low, sigfig <= 5), so this cannot fail.
    Histogram::new_with_bounds(1, HISTOGRAM_US_MAX, HISTOGRAM_SIGFIG)
        .expect("constant histogram bounds are valid")
}

/// Records `value_us`, clamped into the histogram's range.
pub fn record_clamped(histogram: &mut Histogram<u64>, value_us: u64) {
    let value = value_us.clamp(1, HISTOGRAM_US_MAX);
    // In range by construction, so recording cannot fail; ignore the impossible error rather
    // than panic in a measurement loop.
    let _ = histogram.record(value);
}

/// The percentiles every report shows, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Percentiles {
    pub count: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Self {
        if histogram.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: histogram.len(),
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
        }
    }
}

/// Formats microseconds for a table: "850 µs", "12.3 ms", "4.20 s".
pub fn format_us(us: u64) -> String {
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1_000.0)
    } else {
        format!("{:.2} s", us as f64 / 1_000_000.0)
    }
}

/// What one receipt turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    /// First receipt of this task, at or after its due time.
    OnTime { lateness_us: u64 },
    /// Received before its due time: a correctness failure of the system under test.
    Early { early_by_us: u64 },
    /// Received again (at-least-once delivery); not counted in the lateness histogram.
    Duplicate,
    /// An index the benchmark never submitted.
    Unknown,
}

/// Follows N submitted tasks, identified by their index 0..N, through delivery.
///
/// Lateness is `receipt time − due time`, both on this machine's wall clock (the server runs
/// on the same machine, so its clock is the same clock). Due times are whole milliseconds
/// (the API's precision); receipts are microseconds.
#[derive(Debug)]
pub struct DeliveryTracker {
    due_at_ms: Vec<u64>,
    /// Receipts per task index, saturating: 0 = never seen.
    receipts: Vec<u8>,
    lateness_us: Histogram<u64>,
    delivered: u64,
    early: u64,
    early_by_us_max: u64,
    duplicates: u64,
    unknown: u64,
    first_receipt_us: Option<u64>,
    last_receipt_us: Option<u64>,
}

impl DeliveryTracker {
    pub fn new(due_at_ms: Vec<u64>) -> Self {
        let receipts = vec![0; due_at_ms.len()];
        DeliveryTracker {
            due_at_ms,
            receipts,
            lateness_us: new_histogram(),
            delivered: 0,
            early: 0,
            early_by_us_max: 0,
            duplicates: 0,
            unknown: 0,
            first_receipt_us: None,
            last_receipt_us: None,
        }
    }

    /// Records that task `index` arrived at `receipt_unix_us`.
    pub fn record(&mut self, index: u64, receipt_unix_us: u64) -> Receipt {
        let Some(slot) = usize::try_from(index)
            .ok()
            .filter(|&i| i < self.due_at_ms.len())
        else {
            self.unknown += 1;
            return Receipt::Unknown;
        };
        self.first_receipt_us = Some(
            self.first_receipt_us
                .map_or(receipt_unix_us, |t| t.min(receipt_unix_us)),
        );
        self.last_receipt_us = Some(
            self.last_receipt_us
                .map_or(receipt_unix_us, |t| t.max(receipt_unix_us)),
        );
        let due_us = self.due_at_ms[slot].saturating_mul(1_000);
        let first = self.receipts[slot] == 0;
        self.receipts[slot] = self.receipts[slot].saturating_add(1);
        // Early is checked on every receipt, duplicates included: an early redelivery is as
        // wrong as an early first delivery.
        if receipt_unix_us < due_us {
            let early_by_us = due_us - receipt_unix_us;
            self.early += 1;
            self.early_by_us_max = self.early_by_us_max.max(early_by_us);
            if first {
                self.delivered += 1;
            } else {
                self.duplicates += 1;
            }
            return Receipt::Early { early_by_us };
        }
        if !first {
            self.duplicates += 1;
            return Receipt::Duplicate;
        }
        self.delivered += 1;
        let lateness_us = receipt_unix_us - due_us;
        record_clamped(&mut self.lateness_us, lateness_us);
        Receipt::OnTime { lateness_us }
    }

    pub fn expected(&self) -> u64 {
        self.due_at_ms.len() as u64
    }

    /// Distinct tasks received at least once.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    pub fn all_delivered(&self) -> bool {
        self.delivered == self.expected()
    }

    /// Latest receipt of any task so far (unix µs).
    pub fn last_receipt_us(&self) -> Option<u64> {
        self.last_receipt_us
    }

    pub fn lateness_histogram(&self) -> &Histogram<u64> {
        &self.lateness_us
    }

    pub fn summary(&self) -> DeliverySummary {
        let span_us = match (self.first_receipt_us, self.last_receipt_us) {
            (Some(first), Some(last)) => last - first,
            _ => 0,
        };
        DeliverySummary {
            expected: self.expected(),
            delivered: self.delivered,
            lost: self.expected() - self.delivered,
            early: self.early,
            early_by_us_max: self.early_by_us_max,
            duplicates: self.duplicates,
            unknown: self.unknown,
            receipt_span_us: span_us,
            lateness: Percentiles::of(&self.lateness_us),
        }
    }
}

/// The outcome of a delivery run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeliverySummary {
    pub expected: u64,
    pub delivered: u64,
    /// Submitted but never received before the run ended.
    pub lost: u64,
    pub early: u64,
    pub early_by_us_max: u64,
    pub duplicates: u64,
    pub unknown: u64,
    /// First to last receipt.
    pub receipt_span_us: u64,
    pub lateness: Percentiles,
}

impl DeliverySummary {
    /// The report's note when anything was delivered before it was due, which is a
    /// correctness failure, not a slow run.
    pub fn early_note(&self, label: &str) -> Option<String> {
        (self.early > 0).then(|| {
            format!(
                "{label}: {} EARLY deliveries (up to {} before due) — a correctness failure.",
                self.early,
                format_us(self.early_by_us_max)
            )
        })
    }
}

/// Points of a cumulative distribution (x = value in ms, y = fraction 0..1) from a
/// histogram, one per distinct recorded bucket, for plotting.
pub fn cdf_points_ms(histogram: &Histogram<u64>) -> Vec<(f64, f64)> {
    let total = histogram.len();
    if total == 0 {
        return Vec::new();
    }
    let mut seen = 0u64;
    let mut points = Vec::new();
    for bucket in histogram.iter_recorded() {
        seen += bucket.count_since_last_iteration();
        let value_ms = histogram.highest_equivalent(bucket.value_iterated_to()) as f64 / 1_000.0;
        points.push((value_ms, seen as f64 / total as f64));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker(due: &[u64]) -> DeliveryTracker {
        DeliveryTracker::new(due.to_vec())
    }

    #[test]
    fn lateness_is_receipt_minus_due() {
        let mut t = tracker(&[1_000, 2_000]);
        assert_eq!(
            t.record(0, 1_000_000 + 1_500),
            Receipt::OnTime { lateness_us: 1_500 }
        );
        assert_eq!(t.record(1, 2_000_000), Receipt::OnTime { lateness_us: 0 });
        let s = t.summary();
        assert_eq!((s.delivered, s.lost, s.early, s.duplicates), (2, 0, 0, 0));
        assert_eq!(s.receipt_span_us, 2_000_000 - 1_001_500);
        assert!(t.all_delivered());
    }

    #[test]
    fn early_receipts_are_counted_and_kept_out_of_the_histogram() {
        let mut t = tracker(&[5_000]);
        assert_eq!(
            t.record(0, 4_999_000),
            Receipt::Early { early_by_us: 1_000 }
        );
        // A later redelivery of the same task is a duplicate, not a second delivery.
        assert_eq!(t.record(0, 5_000_100), Receipt::Duplicate);
        assert_eq!(
            t.record(0, 4_990_000),
            Receipt::Early {
                early_by_us: 10_000
            }
        );
        let s = t.summary();
        assert_eq!(s.delivered, 1);
        assert_eq!(s.early, 2);
        assert_eq!(s.early_by_us_max, 10_000);
        assert_eq!(s.duplicates, 2);
        assert_eq!(s.lateness.count, 0);
    }

    #[test]
    fn losses_duplicates_and_unknown_indices() {
        let mut t = tracker(&[10, 20, 30, 40]);
        t.record(0, 50_000);
        t.record(2, 50_000);
        t.record(2, 60_000);
        t.record(2, 70_000);
        assert_eq!(t.record(4, 70_000), Receipt::Unknown);
        assert_eq!(t.record(u64::MAX, 70_000), Receipt::Unknown);
        let s = t.summary();
        assert_eq!(s.expected, 4);
        assert_eq!(s.delivered, 2);
        assert_eq!(s.lost, 2);
        assert_eq!(s.duplicates, 2);
        assert_eq!(s.unknown, 2);
        assert!(!t.all_delivered());
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut h = new_histogram();
        for v in 1..=1_000u64 {
            record_clamped(&mut h, v);
        }
        let p = Percentiles::of(&h);
        assert_eq!(p.count, 1_000);
        assert_eq!(p.p50_us, 500);
        assert_eq!(p.p90_us, 900);
        assert_eq!(p.p99_us, 990);
        assert_eq!(p.p999_us, 999);
        assert_eq!(p.max_us, 1_000);
    }

    #[test]
    fn percentiles_of_an_empty_histogram_are_zero() {
        assert_eq!(Percentiles::of(&new_histogram()), Percentiles::default());
    }

    #[test]
    fn values_outside_the_range_are_clamped_not_lost() {
        let mut h = new_histogram();
        record_clamped(&mut h, 0);
        record_clamped(&mut h, u64::MAX);
        assert_eq!(h.len(), 2);
        assert_eq!(h.min(), 1);
        assert!(h.max() >= HISTOGRAM_US_MAX);
    }

    #[test]
    fn cdf_ends_at_one_and_is_monotone() {
        let mut h = new_histogram();
        for v in [100, 100, 2_000, 30_000] {
            record_clamped(&mut h, v);
        }
        let points = cdf_points_ms(&h);
        assert_eq!(points.len(), 3);
        assert!(points
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert_eq!(points[0].1, 0.5);
        assert_eq!(points.last().map(|p| p.1), Some(1.0));
    }

    #[test]
    fn formatting_picks_a_readable_unit() {
        assert_eq!(format_us(850), "850 µs");
        assert_eq!(format_us(12_345), "12.3 ms");
        assert_eq!(format_us(4_200_000), "4.20 s");
    }
}
