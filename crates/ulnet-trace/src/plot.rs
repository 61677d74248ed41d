//! Figures: line charts (log axes by transforming the data), grouped bars and heat maps,
//! drawn with plotters to SVG (for files and inline in HTML reports) or PNG.
//!
//! Text needs a TrueType font: `ULNET_FONT` names one, else the first of a few standard
//! paths (DejaVu, Liberation, Noto, FreeFont) is used. Without a font, figures fail with
//! [`PlotError::NoFont`]; the tables and JSON do not need one.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::OnceLock;

/// Why a figure could not be drawn.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PlotError {
    /// No TrueType font was found for the text.
    #[error("no TrueType font found for figure text: set ULNET_FONT to a .ttf file (Debian: fonts-dejavu-core)")]
    NoFont,
    /// Drawing failed.
    #[error("drawing {0}: {1}")]
    Draw(String, String),
}

const FONT_PATHS: [&str; 6] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers a font for figure text once per process.
pub fn ensure_font() -> Result<(), PlotError> {
    static FONT: OnceLock<bool> = OnceLock::new();
    let ok = *FONT.get_or_init(|| {
        let candidates = std::env::var("ULNET_FONT").ok().into_iter().chain(FONT_PATHS.iter().map(|s| s.to_string()));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::NoFont)
    }
}

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Joined by lines.
    Line,
    /// Dots.
    Points,
    /// A dashed reference line.
    Reference,
}

/// One series of a line chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) in data units.
    pub points: Vec<(f64, f64)>,
    /// How to draw it.
    pub style: Style,
}

/// A chart of lines or points.
#[derive(Clone, Debug)]
pub struct LineChart {
    /// File-name stem.
    pub name: String,
    /// Title.
    pub title: String,
    /// Horizontal axis text.
    pub x_label: String,
    /// Vertical axis text.
    pub y_label: String,
    /// Logarithmic horizontal axis.
    pub log_x: bool,
    /// Logarithmic vertical axis.
    pub log_y: bool,
    /// The series.
    pub series: Vec<Series>,
}

/// Grouped bars: one group of bars per category.
#[derive(Clone, Debug)]
pub struct BarChart {
    /// File-name stem.
    pub name: String,
    /// Title.
    pub title: String,
    /// Vertical axis text.
    pub y_label: String,
    /// Category names.
    pub categories: Vec<String>,
    /// (legend, one value per category).
    pub groups: Vec<(String, Vec<f64>)>,
}

/// A heat map of a matrix with text in each cell.
#[derive(Clone, Debug)]
pub struct Heatmap {
    /// File-name stem.
    pub name: String,
    /// Title.
    pub title: String,
    /// Row names (top to bottom).
    pub rows: Vec<String>,
    /// Column names.
    pub cols: Vec<String>,
    /// Values, rows × columns, for the colour.
    pub values: Vec<Vec<f64>>,
    /// Text in each cell.
    pub labels: Vec<Vec<String>>,
}

/// A figure.
#[derive(Clone, Debug)]
pub enum Figure {
    /// Lines or points.
    Lines(LineChart),
    /// Bars.
    Bars(BarChart),
    /// A matrix.
    Heatmap(Heatmap),
}

const SIZE: (u32, u32) = (800, 480);
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A number for an axis tick.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn draw_err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> PlotError + '_ {
    move |e| PlotError::Draw(what.to_string(), format!("{e:?}"))
}

impl Figure {
    /// The file-name stem.
    pub fn name(&self) -> &str {
        match self {
            Figure::Lines(c) => &c.name,
            Figure::Bars(c) => &c.name,
            Figure::Heatmap(c) => &c.name,
        }
    }

    /// The title.
    pub fn title(&self) -> &str {
        match self {
            Figure::Lines(c) => &c.title,
            Figure::Bars(c) => &c.title,
            Figure::Heatmap(c) => &c.title,
        }
    }

    /// The figure as an SVG document.
    pub fn svg(&self) -> Result<String, PlotError> {
        ensure_font()?;
        let mut s = String::new();
        {
            let root = SVGBackend::with_string(&mut s, SIZE).into_drawing_area();
            self.draw(&root)?;
            root.present().map_err(draw_err(self.name()))?;
        }
        Ok(s)
    }

    /// Writes the figure as a PNG file.
    pub fn png(&self, path: &Path) -> Result<(), PlotError> {
        ensure_font()?;
        let root = BitMapBackend::new(path, SIZE).into_drawing_area();
        self.draw(&root)?;
        root.present().map_err(draw_err(self.name()))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        root.fill(&WHITE).map_err(draw_err(self.name()))?;
        match self {
            Figure::Lines(c) => draw_lines(root, c),
            Figure::Bars(c) => draw_bars(root, c),
            Figure::Heatmap(c) => draw_heatmap(root, c),
        }
    }
}

fn draw_lines<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &LineChart) -> Result<(), PlotError> {
    let tx = |v: f64| if c.log_x { v.log10() } else { v };
    let ty = |v: f64| if c.log_y { v.log10() } else { v };
    type Prepared<'a> = (usize, &'a Series, Vec<(f64, f64)>);
    let series: Vec<Prepared> = c
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let pts = s
                .points
                .iter()
                .filter(|(x, y)| (!c.log_x || *x > 0.0) && (!c.log_y || *y > 0.0) && x.is_finite() && y.is_finite())
                .map(|&(x, y)| (tx(x), ty(y)))
                .collect();
            (i, s, pts)
        })
        .collect();
    let all = series.iter().flat_map(|s| s.2.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad =
        |a: f64, b: f64| if b - a < 1e-12 { (a - 0.5, b + 0.5) } else { (a - 0.03 * (b - a), b + 0.03 * (b - a)) };
    let ((x0, x1), (y0, y1)) = (pad(x0, x1), pad(y0, y1));
    let e = draw_err(&c.name);
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(draw_err(&c.name))?;
    // Log axes are labelled at whole decades only.
    let decade = |v: f64| if (v - v.round()).abs() < 1e-6 { tick(10f64.powf(v.round())) } else { String::new() };
    let fx = |v: &f64| if c.log_x { decade(*v) } else { tick(*v) };
    let fy = |v: &f64| if c.log_y { decade(*v) } else { tick(*v) };
    chart
        .configure_mesh()
        .x_desc(c.x_label.as_str())
        .y_desc(c.y_label.as_str())
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .draw()
        .map_err(draw_err(&c.name))?;
    for (i, s, pts) in series {
        let color = PALETTE[i % PALETTE.len()];
        let anno = match s.style {
            Style::Line => chart.draw_series(LineSeries::new(pts, color.stroke_width(2))),
            Style::Reference => chart.draw_series(DashedLineSeries::new(pts, 6, 4, color.stroke_width(2))),
            Style::Points => chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 2, color.filled()))),
        }
        .map_err(draw_err(&c.name))?;
        anno.label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    Ok(())
}

fn draw_bars<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &BarChart) -> Result<(), PlotError> {
    let n = c.categories.len().max(1);
    let top = c.groups.iter().flat_map(|g| g.1.iter()).copied().filter(|v| v.is_finite()).fold(0.0, f64::max);
    let top = if top <= 0.0 { 1.0 } else { top * 1.1 };
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(draw_err(&c.name))?;
    let cats = c.categories.clone();
    let fx = move |v: &f64| {
        let i = v.floor() as usize;
        if (v - v.floor() - 0.5).abs() < 0.01 && i < cats.len() {
            cats[i].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(4 * n + 1)
        .x_label_formatter(&fx)
        .y_desc(c.y_label.as_str())
        .y_label_formatter(&|v| tick(*v))
        .draw()
        .map_err(draw_err(&c.name))?;
    let groups = c.groups.len().max(1);
    let width = 0.8 / groups as f64;
    for (g, (label, values)) in c.groups.iter().enumerate() {
        let color = PALETTE[g % PALETTE.len()];
        chart
            .draw_series(values.iter().enumerate().map(|(i, v)| {
                let x = i as f64 + 0.1 + g as f64 * width;
                Rectangle::new([(x, 0.0), (x + width * 0.95, v.max(0.0))], color.filled())
            }))
            .map_err(draw_err(&c.name))?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    if groups > 1 || !c.groups.first().is_some_and(|g| g.0.is_empty()) {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err(&c.name))?;
    }
    Ok(())
}

fn draw_heatmap<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &Heatmap) -> Result<(), PlotError> {
    let (rows, cols) = (c.rows.len().max(1), c.cols.len().max(1));
    let max = c.values.iter().flatten().copied().fold(0.0, f64::max).max(1e-300);
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..cols as f64, 0f64..rows as f64)
        .map_err(draw_err(&c.name))?;
    let (col_names, row_names) = (c.cols.clone(), c.rows.clone());
    let label_at = |names: &[String], v: f64, flip: bool| {
        let i = v.floor() as usize;
        if (v - v.floor() - 0.5).abs() < 0.01 && i < names.len() {
            names[if flip { names.len() - 1 - i } else { i }].clone()
        } else {
            String::new()
        }
    };
    let fx = move |v: &f64| label_at(&col_names, *v, false);
    let fy = move |v: &f64| label_at(&row_names, *v, true);
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(4 * cols + 1)
        .y_labels(4 * rows + 1)
        .x_desc("to node")
        .y_desc("from node")
        .x_label_formatter(&fx)
        .y_label_formatter(&fy)
        .draw()
        .map_err(draw_err(&c.name))?;
    for (r, row) in c.values.iter().enumerate() {
        for (k, v) in row.iter().enumerate() {
            let y = (rows - 1 - r) as f64;
            let shade = (v / max).clamp(0.0, 1.0);
            let color = RGBColor(
                (255.0 - shade * (255.0 - 31.0)) as u8,
                (255.0 - shade * (255.0 - 119.0)) as u8,
                (255.0 - shade * (255.0 - 180.0)) as u8,
            );
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(k as f64, y), (k as f64 + 1.0, y + 1.0)],
                    color.filled(),
                )))
                .map_err(draw_err(&c.name))?;
            let text = c.labels.get(r).and_then(|l| l.get(k)).cloned().unwrap_or_default();
            let style =
                TextStyle::from(("sans-serif", 13).into_font()).color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
            chart
                .draw_series(std::iter::once(Text::new(text, (k as f64 + 0.5, y + 0.5), style)))
                .map_err(draw_err(&c.name))?;
        }
    }
    Ok(())
}
