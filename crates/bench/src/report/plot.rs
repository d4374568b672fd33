//! Draws figures with plotters, as SVG and PNG, with the DejaVu Sans font shipped in the
//! repository (so no system font or fontconfig is needed).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

use super::series::{BarSeries, Figure, Line};
use super::ReportError;

/// DejaVu Sans 2.37 (Bitstream Vera license, in `assets/fonts/LICENSE`).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";
const SIZE: (u32, u32) = (960, 600);

/// Registers the bundled font once; whether it loaded.
fn font_loaded() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok())
}

/// Draws `figure` into `dir` as NAME.svg and NAME.png; answers both paths.
pub(super) fn draw(figure: &Figure, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    if !font_loaded() {
        return Err(ReportError::Write {
            path: dir.to_path_buf(),
            reason: "the bundled font does not parse".into(),
        });
    }
    let name = match figure {
        Figure::Lines { name, .. } | Figure::Bars { name, .. } => name,
    };
    let svg = dir.join(format!("{name}.svg"));
    let png = dir.join(format!("{name}.png"));
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |reason: String| ReportError::Write { path, reason }
    };
    draw_on(SVGBackend::new(&svg, SIZE).into_drawing_area(), figure).map_err(failed(&svg))?;
    draw_on(BitMapBackend::new(&png, SIZE).into_drawing_area(), figure).map_err(failed(&png))?;
    Ok(vec![svg, png])
}

fn draw_on<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, figure: &Figure) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    match figure {
        Figure::Lines {
            title,
            x_label,
            y_label,
            xs,
            lines,
            log_y,
            ..
        } => draw_lines(&root, title, x_label, y_label, xs, lines, *log_y)?,
        Figure::Bars {
            title,
            groups,
            series,
            ..
        } => draw_bars(&root, title, groups, series)?,
    }
    root.present().map_err(e)
}

/// An f64 axis with tick marks exactly where asked (the settings a sweep ran at, the middle of
/// each bar group).
struct Ticks {
    inner: RangedCoordf64,
    at: Vec<f64>,
}

impl Ticks {
    fn new(range: Range<f64>, at: Vec<f64>) -> Ticks {
        Ticks {
            inner: range.into(),
            at,
        }
    }
}

impl Ranged for Ticks {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.at.clone()
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

fn color(i: usize) -> RGBColor {
    // Distinguishable on white, in the order lines are listed.
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(255, 127, 14),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    COLORS[i % COLORS.len()]
}

/// A short form of a tick value with up to three significant digits: 1, 0.5, 0.0012, 12K,
/// 1.5M.
fn short(v: f64) -> String {
    let a = v.abs();
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if a >= 1e6 {
        trim(format!("{:.2}", v / 1e6)) + "M"
    } else if a >= 1e3 {
        trim(format!("{:.1}", v / 1e3)) + "K"
    } else if a == 0.0 || a >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        let decimals = (-a.log10().floor()) as usize + 2;
        trim(format!("{v:.decimals$}"))
    }
}

/// The legend box, top left.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| e.to_string())
}

fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_label: &str,
    y_label: &str,
    xs: &[f64],
    lines: &[Line],
    log_y: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    // A log scale draws log10 of each value (positive values only) and labels ticks with the
    // values themselves.
    let owned: Vec<Line>;
    let lines = if log_y {
        owned = lines
            .iter()
            .map(|l| Line {
                label: l.label.clone(),
                points: l
                    .points
                    .iter()
                    .filter(|p| p.1 > 0.0)
                    .map(|&(x, y)| (x, y.log10()))
                    .collect(),
            })
            .collect();
        &owned[..]
    } else {
        lines
    };
    let y_of = |v: f64| if log_y { 10f64.powf(v) } else { v };
    let (x_min, x_max) = match (xs.first(), xs.last()) {
        (Some(&a), Some(&b)) if b > a => (a, b),
        (Some(&a), _) => (a - 1.0, a + 1.0),
        _ => (0.0, 1.0),
    };
    let pad = (x_max - x_min) * 0.05;
    let y_top = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let y_top = if log_y {
        y_top + 0.3
    } else if y_top > 0.0 {
        y_top * 1.15
    } else {
        1.0
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FAMILY, 26))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            Ticks::new((x_min - pad)..(x_max + pad), xs.to_vec()),
            0.0..y_top,
        )
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| short(y_of(*v)))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(e)?;
    for (i, line) in lines.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(line.points.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(line.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(2)));
        chart
            .draw_series(line.points.iter().map(|&p| Circle::new(p, 4, c.filled())))
            .map_err(e)?;
    }
    draw_legend(&mut chart)
}

fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    groups: &[String],
    series: &[BarSeries],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let values = series.iter().flat_map(|s| s.values.iter());
    let top = values.clone().map(|v| v.1.max(v.0)).fold(1.0f64, f64::max) * 2.0;
    let bottom = values
        .map(|v| v.0)
        .filter(|v| *v > 0.0)
        .fold(top, f64::min)
        .min(1.0)
        / 2.0;
    let n = groups.len().max(1);
    let centers: Vec<f64> = (0..n).map(|i| i as f64 + 0.5).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            Ticks::new(0.0..n as f64, centers),
            (bottom..top).log_scale(),
        )
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("operation")
        .y_desc("latency (microseconds, log scale)")
        .x_label_formatter(&|v| groups.get(v.floor() as usize).cloned().unwrap_or_default())
        .y_label_formatter(&|v| short(*v))
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .draw()
        .map_err(e)?;
    let width = 0.8 / series.len().max(1) as f64;
    for (j, s) in series.iter().enumerate() {
        let c = color(j);
        let left = |i: usize| i as f64 + 0.1 + j as f64 * width;
        chart
            .draw_series(s.values.iter().enumerate().map(|(i, &(p50, _))| {
                Rectangle::new(
                    [
                        (left(i) + width * 0.1, bottom),
                        (left(i) + width * 0.9, p50.max(bottom)),
                    ],
                    c.filled(),
                )
            }))
            .map_err(e)?
            .label(s.label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
        // The 99th percentile: a black tick above the bar.
        chart
            .draw_series(s.values.iter().enumerate().map(|(i, &(_, p99))| {
                PathElement::new(
                    vec![
                        (left(i) + width * 0.2, p99.max(bottom)),
                        (left(i) + width * 0.8, p99.max(bottom)),
                    ],
                    BLACK.stroke_width(3),
                )
            }))
            .map_err(e)?;
    }
    draw_legend(&mut chart)
}

/// Draws `figure` on a given area (tests look at the pixels).
#[cfg(test)]
pub(super) fn draw_for_test<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    figure: &Figure,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    assert!(font_loaded());
    draw_on(root, figure)
}

#[cfg(test)]
mod tests {
    use super::short;

    #[test]
    fn tick_values_keep_three_significant_digits() {
        let cases = [
            (0.0, "0"),
            (1.0, "1"),
            (0.5, "0.5"),
            (0.0125, "0.0125"),
            (0.002, "0.002"),
            (12.5, "12.5"),
            (45_000.0, "45K"),
            (1_500.0, "1.5K"),
            (2_250_000.0, "2.25M"),
        ];
        for (v, want) in cases {
            assert_eq!(short(v), want, "{v}");
        }
    }
}
