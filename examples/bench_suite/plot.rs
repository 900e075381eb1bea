//! PNG plots of the results: throughput bars with their spread, and latency CDFs.

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::stats::Spread;
use super::Error;

/// Registers a sans-serif font for the labels (the bitmap backend has none of its own).
pub fn register_font() -> Result<(), Error> {
    let path = redelivery_testkit::fonts::sans_serif()
        .ok_or("no DejaVuSans.ttf found for plot labels (Debian: apt install fonts-dejavu-core)")?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(path)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{path} is not a usable font"))?;
    Ok(())
}

fn palette(i: usize) -> RGBColor {
    [
        RGBColor(0x4c, 0x72, 0xb0),
        RGBColor(0xdd, 0x84, 0x52),
        RGBColor(0x55, 0xa8, 0x68),
        RGBColor(0xc4, 0x4e, 0x52),
        RGBColor(0x81, 0x72, 0xb3),
    ][i % 5]
}

/// One bar per entry (median), with a line from its min to its max.
pub fn throughput(
    path: &std::path::Path,
    title: &str,
    bars: &[(String, Spread)],
) -> Result<(), Error> {
    // About 110 pixels a bar, so that the longest label ("batch_floor 1024 B") stays clear
    // of its neighbours.
    let width = (bars.len() as u32 * 110).max(900);
    let root = BitMapBackend::new(path, (width, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let top = bars.iter().map(|(_, s)| s.max).fold(1.0, f64::max) * 1.15;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(|e| e.to_string())?;
    let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 {
                labels.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("messages per second")
        .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, s))| {
            Rectangle::new(
                [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, s.median)],
                palette(i).filled(),
            )
        }))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, s))| {
            PathElement::new(
                vec![(i as f64 + 0.5, s.min), (i as f64 + 0.5, s.max)],
                BLACK.stroke_width(2),
            )
        }))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// One line per series: the share of records (y) handed out within a latency (x, ms).
pub fn latency_cdf(
    path: &std::path::Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), Error> {
    let root = BitMapBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    // Up to the largest p99.9 shown, so one outlier does not flatten the curves.
    let right = series
        .iter()
        .filter_map(|(_, pts)| pts.iter().find(|(_, f)| *f >= 0.999).map(|(x, _)| *x))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..right, 0f64..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("produce to handout (ms)")
        .y_desc("share of records")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = palette(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
