//! Drawing a comparison as SVG: one lane per policy, time across, admitted
//! requests as green bars above the axis (at the time they are released, so a
//! shaper's spreading shows) and rejected ones as red bars below it, counted
//! per time bin. Each lane has a second panel, a close-up of the busiest
//! moment of the whole trace (for `boundary-burst`: the 0.2 s around the
//! window boundary), drawn with bins fine enough to see every admission.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::compare::Lane;

/// Bins across the whole trace.
const BINS: usize = 600;
/// Bins across the close-up.
const ZOOM_BINS: usize = 120;
/// The most window boundaries one panel draws (none when there would be
/// more): with the fixed bins, what bounds a plot's size whatever the
/// trace's span and the policies' windows.
const MAX_BOUNDARIES: f64 = 60.0;
const LANE_HEIGHT: u32 = 230;
const WIDTH: u32 = 1400;
/// One font size for every caption, one for every label.
const CAPTION: u32 = 16;
const LABEL: u32 = 13;

const GREEN: RGBColor = RGBColor(34, 139, 34);
const RED: RGBColor = RGBColor(200, 40, 40);
const GREY: RGBColor = RGBColor(150, 150, 150);

/// Counts per time bin for one lane.
#[derive(Debug, Clone, Copy, Default)]
struct Bin {
    admitted: u32,
    rejected: u32,
}

/// A span of time cut into bins.
#[derive(Debug, Clone, Copy)]
struct Span {
    from: f64,
    to: f64,
    bins: usize,
}

impl Span {
    fn width(&self) -> f64 {
        (self.to - self.from) / self.bins as f64
    }

    fn bin(&self, t: f64) -> Option<usize> {
        (self.from..self.to)
            .contains(&t)
            .then(|| (((t - self.from) / self.width()) as usize).min(self.bins - 1))
    }

    /// The bins of `lane` over this span.
    fn count(&self, lane: &Lane) -> Vec<Bin> {
        let mut bins = vec![Bin::default(); self.bins];
        for o in &lane.outcomes {
            if o.decision.allowed {
                if let Some(i) = self.bin(seconds(o.at.saturating_add(o.decision.delay))) {
                    bins[i].admitted += 1;
                }
            } else if let Some(i) = self.bin(seconds(o.at)) {
                bins[i].rejected += 1;
            }
        }
        bins
    }
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A bin width for people: `200 ms`, `1.5 s`, `40 µs`.
fn human(seconds: f64) -> String {
    match seconds {
        s if s >= 1.0 => format!("{} s", round3(s)),
        s if s >= 1e-3 => format!("{} ms", round3(s * 1e3)),
        s => format!("{} µs", round3(s * 1e6)),
    }
}

fn round3(x: f64) -> f64 {
    if !x.is_normal() {
        return x;
    }
    let digits = 2 - (x.abs().log10().floor() as i32).clamp(-30, 30);
    let scale = 10f64.powi(digits.max(0));
    (x * scale).round() / scale
}

/// The lanes as an SVG picture under `title`.
pub fn render(title: &str, lanes: &[Lane], burst_window: u64) -> Result<String, String> {
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
    let whole = Span {
        from: start - pad,
        to: end + pad,
        bins: BINS,
    };
    let zoom = close_up(whole, lanes);

    let height = LANE_HEIGHT * lanes.len().max(1) as u32 + 90;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        let draw = |e: DrawingAreaErrorKind<_>| format!("cannot draw the plot: {e}");
        root.fill(&WHITE).map_err(draw)?;
        let root = root
            .titled(
                &format!("{title}: admitted above the axis (when released), rejected below"),
                ("sans-serif", 18),
            )
            .map_err(draw)?;
        let (top, root) = root.split_vertically(30);
        legend(&top).map_err(draw)?;
        for (area, lane) in root.split_evenly((lanes.len().max(1), 1)).iter().zip(lanes) {
            let (left, right) = area.split_horizontally((WIDTH * 7 / 10) as i32);
            let s = lane.summary(burst_window);
            let caption = format!(
                "{}: admitted {}, rejected {}, largest burst {}",
                lane.label, s.admitted, s.rejected, s.max_burst
            );
            panel(&left, lane, whole, &caption).map_err(draw)?;
            let caption = format!("close-up of the busiest {}", human(zoom.to - zoom.from));
            panel(&right, lane, zoom, &caption).map_err(draw)?;
        }
        root.present().map_err(draw)?;
    }
    Ok(svg)
}

/// The busiest moment: the span, a hundredth of the trace wide (at least
/// 50 ms), holding the most requests of every lane together (the first such,
/// centred on its busy part), cut into [`ZOOM_BINS`] bins.
fn close_up(whole: Span, lanes: &[Lane]) -> Span {
    let mut total = vec![0u32; whole.bins];
    for lane in lanes {
        for (t, b) in total.iter_mut().zip(whole.count(lane)) {
            *t += b.admitted + b.rejected;
        }
    }
    let half = ((whole.to - whole.from) / 200.0).max(0.025);
    let reach = ((2.0 * half / whole.width()).ceil() as usize).clamp(1, whole.bins);
    let sums: Vec<u32> = total.windows(reach).map(|w| w.iter().sum()).collect();
    let most = sums.iter().copied().max().unwrap_or(0);
    let first = sums.iter().position(|&s| s == most).unwrap_or(0);
    // Centre on the requests inside the busiest run of bins.
    let busy: Vec<usize> = (first..first + reach).filter(|&i| total[i] > 0).collect();
    let middle = match (busy.first(), busy.last()) {
        (Some(a), Some(b)) => (a + b) as f64 / 2.0 + 0.5,
        _ => first as f64 + reach as f64 / 2.0,
    };
    let center = whole.from + middle * whole.width();
    Span {
        from: center - half,
        to: center + half,
        bins: ZOOM_BINS,
    }
}

/// Tick labels with as many decimals as the span needs to tell them apart.
fn tick(span: Span) -> impl Fn(&f64) -> String {
    let step = (span.to - span.from) / 8.0;
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    move |v| format!("{v:.decimals$}")
}

/// The one legend, above every lane: what the colours and lines mean.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let font = ("sans-serif", LABEL + 2).into_font();
    let mut x = 80;
    for (label, color, line) in [
        ("admitted, counted when released", GREEN, false),
        ("rejected", RED, false),
        ("window boundary (aligned windows)", GREY, true),
    ] {
        match line {
            true => area.draw(&PathElement::new(
                vec![(x + 6, 6), (x + 6, 24)],
                color.stroke_width(2),
            ))?,
            false => area.draw(&Rectangle::new([(x, 9), (x + 14, 21)], color.filled()))?,
        }
        area.draw(&Text::new(label, (x + 22, 8), font.clone()))?;
        x += 40 + 8 * label.len() as i32;
    }
    Ok(())
}

/// One lane over one span: bars per bin (admitted up, rejected down, each
/// side scaled to its own tallest bar), window boundaries and labelled
/// axes.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    lane: &Lane,
    span: Span,
    caption: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let bins = span.count(lane);
    let tallest = |side: fn(&Bin) -> u32| bins.iter().map(side).max().unwrap_or(0);
    let high = f64::from(tallest(|b| b.admitted).max(1)) * 1.15;
    // No rejection: a sliver below the axis, so that it shows.
    let low = match tallest(|b| b.rejected) {
        0 => high * 0.05,
        n => f64::from(n) * 1.15,
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", CAPTION))
        .margin(8)
        .x_label_area_size(38)
        .y_label_area_size(62)
        .build_cartesian_2d(span.from..span.to, -low..high)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(8)
        .y_labels(5)
        .label_style(("sans-serif", LABEL))
        .axis_desc_style(("sans-serif", LABEL + 1))
        .x_label_formatter(&tick(span))
        .y_label_formatter(&|v| format!("{:.0}", v.abs()))
        .x_desc("time (s)")
        .y_desc(format!("requests per {}", human(span.width())))
        .draw()?;
    if let Some(w) = lane.policy.aligned_window().map(seconds) {
        // At most MAX_BOUNDARIES lines, counted in floating point: a window
        // of a nanosecond over years is billions of windows, drawn as none.
        let (first, last) = ((span.from / w).ceil(), (span.to / w).floor());
        if last - first < MAX_BOUNDARIES {
            let lines = (first as i64..=last as i64)
                .map(|k| PathElement::new(vec![(k as f64 * w, -low), (k as f64 * w, high)], GREY));
            chart.draw_series(lines)?;
        }
    }
    let bar = |i: usize, value: f64, color: RGBColor| {
        let left = span.from + i as f64 * span.width();
        Rectangle::new([(left, 0.0), (left + span.width(), value)], color.filled())
    };
    let admitted = bins.iter().enumerate().filter(|(_, b)| b.admitted > 0);
    chart.draw_series(admitted.map(|(i, b)| bar(i, f64::from(b.admitted), GREEN)))?;
    let rejected = bins.iter().enumerate().filter(|(_, b)| b.rejected > 0);
    chart.draw_series(rejected.map(|(i, b)| bar(i, -f64::from(b.rejected), RED)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::compare;
    use crate::scenario::Scenario;

    #[test]
    fn the_close_up_is_the_boundary_burst() {
        let scenario = Scenario::find("boundary-burst").unwrap();
        let arrivals = scenario.arrivals().into_iter().map(Ok);
        let lanes = compare(scenario.policies().unwrap(), arrivals).unwrap();
        let whole = Span {
            from: 59.8,
            to: 120.2,
            bins: BINS,
        };
        let zoom = close_up(whole, &lanes);
        // Both bursts (59.9 s and 60.1 s) in view, the one at 120.1 s not.
        assert!(zoom.from < 59.9 && zoom.to > 60.1, "{zoom:?}");
        assert!(zoom.to < 61.0, "{zoom:?}");
        // Fine enough that each burst is its own bar.
        assert!(zoom.width() < 0.01, "{zoom:?}");
        assert_eq!(tick(zoom)(&59.9), "59.90");
        assert_eq!(human(0.104), "104 ms");
    }
}
