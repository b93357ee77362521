//! The lateness picture: cumulative distribution of firing lateness per system, as SVG.

use std::path::Path;

use plotters::prelude::*;

use crate::error::BenchError;

/// Smallest lateness on the log axis (10 µs): a log scale cannot start at zero, and
/// lateness below this is indistinguishable in practice.
const X_MIN_MS: f64 = 0.01;

/// One line of the picture: a label and CDF points (lateness ms, fraction 0..1).
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Writes the CDF of every series into one SVG at `path`.
pub fn lateness_cdf_svg(path: &Path, title: &str, series: &[Series]) -> Result<(), BenchError> {
    let plot_error = |e: &dyn std::fmt::Display| BenchError::Plot(e.to_string());
    let x_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(1.0_f64, f64::max)
        * 1.2;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((X_MIN_MS..x_max).log_scale(), 0.0_f64..100.0_f64)
        .map_err(|e| plot_error(&e))?;
    chart
        .configure_mesh()
        .x_desc("firing lateness = receipt − due (ms, log scale)")
        .y_desc("% of tasks delivered within")
        .draw()
        .map_err(|e| plot_error(&e))?;
    for (n, s) in series.iter().enumerate() {
        let color = Palette99::pick(n).to_rgba();
        // Start each line at the axis so the curve reads as "0% before the first value".
        let first_x = s.points.first().map_or(X_MIN_MS, |p| p.0.max(X_MIN_MS));
        let line = std::iter::once((first_x, 0.0))
            .chain(s.points.iter().map(|&(x, y)| (x.max(X_MIN_MS), y * 100.0)));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(|e| plot_error(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_with_every_series() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cdf.svg");
        let series = vec![
            Series {
                label: "belfry".into(),
                points: vec![(0.5, 0.5), (2.0, 0.99), (8.0, 1.0)],
            },
            Series {
                label: "redis".into(),
                points: vec![(1.0, 0.5), (20.0, 1.0)],
            },
        ];
        lateness_cdf_svg(&path, "lateness", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("belfry") && svg.contains("redis"));
    }
}
