//! SVG plots of runs: throughput per snapshot (top) and tier sizes (bottom) over time, one
//! colour per run, so runs of different policies sit side by side.

use crate::run::RunResult;
use plotters::prelude::*;
use std::path::Path;

/// Why a plot could not be written.
#[derive(Debug, thiserror::Error)]
#[error("plot {path}: {message}")]
pub struct PlotError {
    path: String,
    message: String,
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// Writes `runs` (label, result) to `path` as SVG.
pub fn write_svg(path: &Path, title: &str, runs: &[(String, RunResult)]) -> Result<(), PlotError> {
    draw(path, title, runs).map_err(|e| PlotError { path: path.display().to_string(), message: e.to_string() })
}

fn draw(path: &Path, title: &str, runs: &[(String, RunResult)]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1000, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let (top, bottom) = root.split_vertically(400);
    let t_max = runs.iter().map(|(_, r)| r.elapsed_s).fold(1.0, f64::max);
    let tps_max = runs
        .iter()
        .flat_map(|(_, r)| r.sites.iter().flat_map(|s| s.snapshots.iter().map(|p| p.tps)))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .caption("throughput per snapshot", ("sans-serif", 15))
        .build_cartesian_2d(0.0..t_max, 0.0..tps_max)?;
    chart.configure_mesh().x_desc("seconds").y_desc("requests/s").draw()?;
    for (i, (label, r)) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for s in &r.sites {
            let style = if s.site == 0 { colour.stroke_width(2) } else { colour.mix(0.5).stroke_width(1) };
            let points = s.snapshots.iter().map(|p| (p.t_s + r.snapshot_s / 2.0, p.tps));
            let name = if r.sites.len() > 1 { format!("{label} site {}", s.site) } else { label.clone() };
            chart
                .draw_series(LineSeries::new(points, style))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        }
        if let Some(g) = r.sites[0].guarantee_tps.filter(|_| i == 0) {
            chart
                .draw_series(LineSeries::new(vec![(0.0, g), (t_max, g)], BLACK.mix(0.6).stroke_width(1)))?
                .label(format!("guarantee {g:.0} TPS"));
        }
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;

    let nodes_max = runs.iter().map(|(_, r)| r.nodes).max().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .caption("proxy-tier nodes of site 0 (dashed: all nodes of site 1)", ("sans-serif", 15))
        .build_cartesian_2d(0.0..t_max, 0.0..nodes_max + 0.5)?;
    chart.configure_mesh().x_desc("seconds").y_desc("nodes").draw()?;
    for (i, (label, r)) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let proxies = r.tiers.iter().map(|t| (t.t_s, t.split[0].0 as f64));
        chart
            .draw_series(LineSeries::new(proxies, colour.stroke_width(2)))?
            .label(format!("{label} proxies"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        if r.splits.len() > 1 {
            let site1: Vec<(f64, f64)> =
                r.tiers.iter().map(|t| (t.t_s, (t.split[1].0 + t.split[1].1) as f64)).collect();
            chart.draw_series(DashedLineSeries::new(site1, 6, 4, colour.stroke_width(1)))?;
        }
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
