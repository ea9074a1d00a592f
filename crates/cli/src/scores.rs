//! The table and heatmap of a patching-style sweep (`patch`, `attrib`): one row of scores per
//! site (or head), one column per position, 0 = corrupt and 1 = clean.

use std::path::Path;

use clap::Args;
use hookscope::Result;

use crate::plot::{Palette, Panel, write_heatmaps};

/// The prompts and sites of a patching-style sweep.
#[derive(Debug, Args)]
pub struct ContrastArgs {
    /// The clean prompt.
    #[arg(long)]
    pub clean: String,
    /// The corrupt prompt (same number of tokens).
    #[arg(long)]
    pub corrupt: String,
    /// The sites (a pattern with a position axis, e.g. `layers.*.layer_output`).
    #[arg(long, value_name = "PATTERN")]
    pub site: String,
}

/// A sweep's scores with their labels.
pub struct ScoreTable<'a> {
    /// The metric on the clean and the corrupt run.
    pub clean: f32,
    /// See `clean`.
    pub corrupt: f32,
    /// One label per position.
    pub positions: &'a [String],
    /// Row label and its scores per position.
    pub rows: Vec<(String, Vec<f32>)>,
}

impl ScoreTable<'_> {
    /// Prints the table.
    pub fn print(&self) {
        println!(
            "metric: clean {:.4}, corrupt {:.4}; scores: 0 = corrupt, 1 = clean",
            self.clean, self.corrupt
        );
        let width = self.rows.iter().map(|(l, _)| l.len()).max().unwrap_or(4);
        let header: String = self
            .positions
            .iter()
            .map(|label| {
                let shown: String = format!("{label:?}").chars().take(9).collect();
                format!("{shown:>10}")
            })
            .collect();
        println!("{:<width$}{header}", "site");
        for (label, scores) in &self.rows {
            let row: String = scores.iter().map(|s| format!("{s:>10.3}")).collect();
            println!("{label:<width$}{row}");
        }
    }

    /// Writes the scores as a heatmap (rows down, positions across) titled `title`.
    pub fn write_png(&self, path: &Path, title: String) -> Result<()> {
        let panel = Panel {
            title,
            row_labels: self.rows.iter().map(|(label, _)| label.clone()).collect(),
            column_labels: self.positions.to_vec(),
            values: self.rows.iter().map(|(_, scores)| scores.clone()).collect(),
            range: (-1.0, 1.0),
            palette: Palette::Diverging,
        };
        write_heatmaps(path, &[panel])
    }
}
