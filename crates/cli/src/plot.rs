//! Heatmap images (PNG through `plotters`' bitmap backend, labels in the embedded DejaVu Sans):
//! attention patterns and patching sweeps.

use std::path::Path;
use std::sync::Once;

use hookscope::{Error, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

/// One heatmap: `values[row][column]`, drawn with `palette` over `range`.
pub struct Panel {
    /// Shown above the map.
    pub title: String,
    /// One label per row (top to bottom).
    pub row_labels: Vec<String>,
    /// One label per column (left to right).
    pub column_labels: Vec<String>,
    /// The values, one inner vector per row.
    pub values: Vec<Vec<f32>>,
    /// The values mapped to the two ends of the palette (beyond: clipped).
    pub range: (f32, f32),
    /// The colour scale.
    pub palette: Palette,
}

/// Colour scales.
#[derive(Debug, Clone, Copy)]
pub enum Palette {
    /// Viridis, for probabilities.
    Sequential,
    /// Blue, white, red, for scores around zero.
    Diverging,
}

impl Palette {
    /// What the colours mean, for the caption.
    fn legend(self, (low, high): (f32, f32)) -> String {
        match self {
            Palette::Sequential => format!("dark {low} .. yellow {high}"),
            Palette::Diverging => format!("blue {low} .. white .. red {high}"),
        }
    }

    fn color(self, value: f32, (low, high): (f32, f32)) -> RGBColor {
        let t = ((value - low) / (high - low)).clamp(0.0, 1.0);
        let t = if t.is_nan() { 0.5 } else { t };
        match self {
            Palette::Sequential => ViridisRGB::get_color(t),
            Palette::Diverging => {
                DerivedColorMap::new(&[RGBColor(33, 102, 172), WHITE, RGBColor(178, 24, 43)])
                    .get_color(t)
            }
        }
    }
}

const FONT: &str = "sans-serif";
const CELL: u32 = 28;

fn register_font() -> Result<()> {
    static REGISTER: Once = Once::new();
    let mut outcome = Ok(());
    REGISTER.call_once(|| {
        outcome = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| Error::InvalidInput("the embedded font does not load".into()));
    });
    outcome
}

/// Writes `panels` side by side into one PNG at `path`.
pub fn write_heatmaps(path: &Path, panels: &[Panel]) -> Result<()> {
    register_font()?;
    let failed = |e: &dyn std::fmt::Display| Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    };
    let label_room = |labels: &[String]| {
        let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        (longest.min(24) as u32) * 8 + 16
    };
    let rows = panels.iter().map(|p| p.values.len()).max().unwrap_or(0) as u32;
    let columns = panels
        .iter()
        .map(|p| p.column_labels.len())
        .max()
        .unwrap_or(0) as u32;
    let left = panels
        .iter()
        .map(|p| label_room(&p.row_labels))
        .max()
        .unwrap_or(0);
    let bottom = panels
        .iter()
        .map(|p| label_room(&p.column_labels))
        .max()
        .unwrap_or(0);
    let title = panels
        .iter()
        .map(|p| p.title.chars().count() + 36)
        .max()
        .unwrap_or(0) as u32;
    let panel_width = (left + columns * CELL + 20).max(title * 8);
    let panel_height = rows * CELL + bottom + 40;
    let width = panel_width * panels.len().max(1) as u32;
    let root = BitMapBackend::new(path, (width, panel_height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (panel, area) in panels.iter().zip(&areas) {
        draw_panel(panel, area, (left, bottom)).map_err(|e| failed(&e))?;
    }
    root.present().map_err(|e| failed(&e))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_panel(
    panel: &Panel,
    area: &Area<'_>,
    (left, bottom): (u32, u32),
) -> std::result::Result<
    (),
    DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>,
> {
    let rows = panel.values.len();
    let columns = panel.column_labels.len();
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{} ({})", panel.title, panel.palette.legend(panel.range)),
            (FONT, 15),
        )
        .margin(6)
        .x_label_area_size(bottom)
        .y_label_area_size(left)
        // A segmented range `0..n` has a segment for each of 0..=n: end one short.
        .build_cartesian_2d(
            (0..columns.saturating_sub(1)).into_segmented(),
            (0..rows.saturating_sub(1)).into_segmented(),
        )?;
    let short = |label: &String| -> String {
        let shown: String = label.chars().take(24).collect();
        shown.replace('\n', "\\n")
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(columns)
        .y_labels(rows)
        .x_label_style(
            (FONT, 12)
                .into_font()
                .transform(FontTransform::Rotate90)
                .into_text_style(area),
        )
        .y_label_style((FONT, 12))
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(x) => panel.column_labels.get(*x).map(short).unwrap_or_default(),
            _ => String::new(),
        })
        .y_label_formatter(&|y| match y {
            // Row 0 at the top: the chart's y axis grows upwards.
            SegmentValue::CenterOf(y) => rows
                .checked_sub(y + 1)
                .and_then(|row| panel.row_labels.get(row))
                .map(short)
                .unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    let cells = panel.values.iter().enumerate().flat_map(|(row, values)| {
        values.iter().enumerate().map(move |(column, value)| {
            let y = rows - 1 - row;
            let color = panel.palette.color(*value, panel.range);
            let corner = |c: usize, r: usize| (SegmentValue::Exact(c), SegmentValue::Exact(r));
            Rectangle::new(
                [corner(column, y), corner(column + 1, y + 1)],
                color.filled(),
            )
        })
    });
    chart.draw_series(cells)?;
    Ok(())
}
