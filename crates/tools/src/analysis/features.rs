//! Which dictionary features fire on which tokens: for every dictionary attached to a model, the
//! top features per token of one prompt call, and how well the dictionary reconstructs the
//! site on it (L0, mean squared error, fraction of variance unexplained).

use std::path::PathBuf;

use hookscope_core::hooks::Interventions;
use hookscope_core::host::f32_values;
use hookscope_core::schema::{DictionaryPart, Site};
use hookscope_core::{Batch, Model};
use hookscope_core::{Error, Result};

/// One attached dictionary on one prompt (batch row 0).
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureReport {
    /// The site it is attached to.
    pub site: Site,
    /// Where it was loaded from.
    pub path: PathBuf,
    /// Its number of features.
    pub width: usize,
    /// Per position, the most active features `(index, activation)`, largest first (only
    /// non-zero ones, at most `top_k`).
    pub top: Vec<Vec<(usize, f32)>>,
    /// Mean number of non-zero features per position.
    pub l0: f32,
    /// Mean squared error of the reconstruction per element.
    pub mse: f32,
    /// Squared error over the site's variance about its mean over positions (0: perfect).
    pub fraction_unexplained: f32,
}

/// Runs the prompt call of `batch` (its first row) and reports every dictionary attached to
/// `model`, keeping `top_k` features per position.
pub fn feature_report(model: &Model, batch: &Batch, top_k: usize) -> Result<Vec<FeatureReport>> {
    let layout = model.layout();
    if layout.dictionaries.is_empty() {
        return Err(Error::InvalidInput(
            "no dictionary is attached; attach one (`--sae SITE=PATH`, Model::attach)".into(),
        ));
    }
    let part = |site: Site, part| match site {
        Site::Layer { layer, site } => Ok(Site::Dictionary { layer, site, part }),
        other => Err(Error::InvalidInput(format!(
            "`{other}` is not a layer site"
        ))),
    };
    let mut sites = Vec::new();
    for placement in &layout.dictionaries {
        for p in DictionaryPart::ALL {
            sites.push(part(placement.site, p)?);
        }
    }
    let saved = super::prompt_call_saving(model, batch, &Interventions::new(), &sites)?;
    let mut reports = Vec::with_capacity(layout.dictionaries.len());
    for (placement, attachment) in layout.dictionaries.iter().zip(model.dictionaries()) {
        let value = |p| -> Result<Vec<f32>> {
            f32_values(saved.require(part(placement.site, p)?, 0)?.to_data())
        };
        let features = saved.require(part(placement.site, DictionaryPart::Features)?, 0)?;
        let shape = features.shape();
        let (batch, tokens, width) = (shape[0], shape[1], shape[2]);
        let values = value(DictionaryPart::Features)?;
        let first_row = &values[..tokens * width];
        let top: Vec<Vec<(usize, f32)>> = first_row
            .chunks(width.max(1))
            .map(|row| top_active(row, top_k))
            .collect();
        let active = first_row.iter().filter(|v| **v != 0.0).count();
        let (reconstruction, error) = (
            value(DictionaryPart::Reconstruction)?,
            value(DictionaryPart::Error)?,
        );
        let row = reconstruction.len() / batch.max(1);
        let (mse, fraction_unexplained) =
            reconstruction_error(&reconstruction[..row], &error[..row], tokens);
        reports.push(FeatureReport {
            site: placement.site,
            path: attachment.dictionary.source().to_path_buf(),
            width,
            top,
            l0: active as f32 / tokens.max(1) as f32,
            mse,
            fraction_unexplained,
        });
    }
    Ok(reports)
}

/// The `k` largest non-zero values of `row` with their indices, largest first (ties: the lower
/// index first), in time linear in the row.
pub fn top_active(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut active: Vec<(usize, f32)> = row
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, v)| *v != 0.0)
        .collect();
    let larger_first = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if active.len() > k && k > 0 {
        active.select_nth_unstable_by(k - 1, larger_first);
    }
    active.truncate(k);
    active.sort_by(larger_first);
    active
}

/// The mean squared error and the fraction of variance unexplained of a dictionary on
/// `tokens` positions: `reconstruction` and `error` are its values there, row-major, of equal
/// length; the value it read is their sum.
fn reconstruction_error(reconstruction: &[f32], error: &[f32], tokens: usize) -> (f32, f32) {
    let width = reconstruction.len().checked_div(tokens).unwrap_or(0).max(1);
    let target: Vec<f64> = reconstruction
        .iter()
        .zip(error)
        .map(|(r, e)| f64::from(*r) + f64::from(*e))
        .collect();
    let squared: f64 = error.iter().map(|e| f64::from(*e).powi(2)).sum();
    let mut mean = vec![0.0; width];
    for row in target.chunks(width) {
        mean.iter_mut()
            .zip(row)
            .for_each(|(m, v)| *m += v / tokens as f64);
    }
    let variance: f64 = target
        .chunks(width)
        .flat_map(|row| row.iter().zip(&mean).map(|(v, m)| (v - m).powi(2)))
        .sum();
    let fraction = if variance > 0.0 {
        squared / variance
    } else {
        f64::NAN
    };
    let count = error.len().max(1) as f64;
    ((squared / count) as f32, fraction as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_features_are_the_largest_active_ones() {
        let row = [0.0, 3.0, 0.5, 0.0, 3.0, 1.0];
        assert_eq!(top_active(&row, 3), [(1, 3.0), (4, 3.0), (5, 1.0)]);
        assert_eq!(top_active(&[0.0, 0.0], 4), []);
    }

    #[test]
    fn reconstruction_error_compares_with_the_variance() {
        // Two tokens of width 2: values read (1, 2) and (3, 4); mean (2, 3), variance sum 4.
        let error = [1.0, 0.0, 0.0, 1.0];
        let reconstruction = [0.0, 2.0, 3.0, 3.0];
        let (mse, fraction) = reconstruction_error(&reconstruction, &error, 2);
        assert_eq!(mse, 0.5);
        assert_eq!(fraction, 0.5);
    }
}
