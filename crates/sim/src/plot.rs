//! Drawing a comparison as SVG: one lane per policy, time across, admitted
//! requests as green bars above the axis (at the time they are released, so a
//! shaper's spreading shows) and rejected ones as red bars below it.

use std::path::Path;

use plotters::prelude::*;

use weir_core::{Nanos, Policy};

use crate::compare::Lane;

fn window_of(policy: &Policy) -> Option<Nanos> {
    policy.aligned_window()
}

const BINS: usize = 600;
const LANE_HEIGHT: u32 = 150;

/// Counts per time bin for one lane.
#[derive(Debug, Clone, Copy, Default)]
struct Bin {
    admitted: u32,
    rejected: u32,
}

/// Writes the lanes to `path` as an SVG picture under `title`.
pub fn plot(path: &Path, title: &str, lanes: &[Lane], burst_window: u64) -> Result<(), String> {
    let seconds = |ns: u64| ns as f64 / 1e9;
    let events = || {
        lanes.iter().flat_map(|l| &l.outcomes).map(|o| {
            let delay = if o.decision.allowed {
                o.decision.delay
            } else {
                0
            };
            seconds(o.at.saturating_add(delay))
        })
    };
    let start = events().fold(f64::INFINITY, f64::min);
    let end = events().fold(f64::NEG_INFINITY, f64::max);
    if !start.is_finite() {
        return Err("the trace has no requests to plot".to_owned());
    }
    let pad = ((end - start) * 0.02).max(0.5);
    let (x0, x1) = (start - pad, end + pad);
    let bin_width = (x1 - x0) / BINS as f64;
    let bin_of = |t: f64| (((t - x0) / bin_width) as usize).min(BINS - 1);

    let height = LANE_HEIGHT * lanes.len().max(1) as u32 + 50;
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
    let draw = |e: DrawingAreaErrorKind<_>| format!("cannot draw {}: {e}", path.display());
    root.fill(&WHITE).map_err(draw)?;
    let root = root
        .titled(
            &format!("{title} — green: admitted (at release), red: rejected"),
            ("sans-serif", 18),
        )
        .map_err(draw)?;
    let areas = root.split_evenly((lanes.len().max(1), 1));
    for (i, (area, lane)) in areas.iter().zip(lanes).enumerate() {
        let mut bins = vec![Bin::default(); BINS];
        for o in &lane.outcomes {
            if o.decision.allowed {
                bins[bin_of(seconds(o.at.saturating_add(o.decision.delay)))].admitted += 1;
            } else {
                bins[bin_of(seconds(o.at))].rejected += 1;
            }
        }
        let top = bins
            .iter()
            .map(|b| b.admitted.max(b.rejected))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let s = lane.summary(burst_window);
        let caption = format!(
            "{}: admitted {}, rejected {}, largest burst {}",
            lane.label, s.admitted, s.rejected, s.max_burst
        );
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 14))
            .margin(6)
            .x_label_area_size(if i + 1 == lanes.len() { 36 } else { 20 })
            .y_label_area_size(44)
            .build_cartesian_2d(x0..x1, -top..top)
            .map_err(draw)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .y_labels(3)
            .y_label_formatter(&|v| format!("{:.0}", v.abs()))
            .x_desc(if i + 1 == lanes.len() { "time (s)" } else { "" })
            .draw()
            .map_err(draw)?;
        // Window policies: mark the aligned window boundaries.
        if let Some(w) = window_of(&lane.policy).map(seconds) {
            let first = (x0 / w).ceil() as i64;
            let last = (x1 / w).floor() as i64;
            if last - first < 60 {
                let grey = RGBColor(170, 170, 170);
                let lines = (first..=last).map(|k| {
                    PathElement::new(vec![(k as f64 * w, -top), (k as f64 * w, top)], grey)
                });
                chart.draw_series(lines).map_err(draw)?;
            }
        }
        let bar = |i: usize, value: f64, color: RGBColor| {
            let left = x0 + i as f64 * bin_width;
            Rectangle::new([(left, 0.0), (left + bin_width, value)], color.filled())
        };
        let green = RGBColor(34, 139, 34);
        let red = RGBColor(200, 40, 40);
        chart
            .draw_series(
                bins.iter()
                    .enumerate()
                    .filter(|(_, b)| b.admitted > 0)
                    .map(|(i, b)| bar(i, f64::from(b.admitted), green)),
            )
            .map_err(draw)?;
        chart
            .draw_series(
                bins.iter()
                    .enumerate()
                    .filter(|(_, b)| b.rejected > 0)
                    .map(|(i, b)| bar(i, -f64::from(b.rejected), red)),
            )
            .map_err(draw)?;
    }
    root.present().map_err(draw)
}
