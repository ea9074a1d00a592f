//! Running the dictionary attached at a site: its features, reconstruction and error served
//! as sites of their own, and the value that flows on.

use burn::tensor::Tensor;

use super::Hooks;
use crate::error::{Error, Result};
use crate::hooks::value::{SiteTensor, SiteValue};
use crate::schema::{DictionaryPart, Site};

/// The part of a site's value a dictionary reads, as rows `[B * T, width]`, and the shape that
/// part has at the site.
struct Rows {
    rows: Tensor<2>,
    shape: PartShape,
}

/// The shape of the part a dictionary reads.
#[derive(Clone, Copy)]
enum PartShape {
    /// `[B, T, X]`.
    Tokens([usize; 3]),
    /// `[B, T, NH, D]`.
    Heads([usize; 4]),
}

impl Rows {
    /// The rows of `value` (`[B, T, X]`, or `[B, T, NH, D]` flattened per token or, with
    /// `head`, that head's `[B, T, D]`).
    fn of(value: &SiteValue, head: Option<usize>) -> std::result::Result<Rows, String> {
        match (value, head) {
            (SiteValue::Float3(t), None) => {
                let [b, tokens, width] = t.dims();
                Ok(Rows {
                    rows: t.clone().reshape([b * tokens, width]),
                    shape: PartShape::Tokens([b, tokens, width]),
                })
            }
            (SiteValue::Float4(t), None) => {
                let [b, tokens, heads, dim] = t.dims();
                Ok(Rows {
                    rows: t.clone().reshape([b * tokens, heads * dim]),
                    shape: PartShape::Heads([b, tokens, heads, dim]),
                })
            }
            (SiteValue::Float4(t), Some(head)) => {
                let [b, tokens, _, dim] = t.dims();
                let part = t.clone().slice_dim(2, head..head + 1);
                Ok(Rows {
                    rows: part.reshape([b * tokens, dim]),
                    shape: PartShape::Tokens([b, tokens, dim]),
                })
            }
            (other, _) => Err(format!("a dictionary cannot read {}", other.describe())),
        }
    }

    /// `rows` (of this part's row count) in this part's shape.
    fn shaped(&self, rows: Tensor<2>) -> SiteValue {
        match self.shape {
            PartShape::Tokens(shape) => SiteValue::Float3(rows.reshape(shape)),
            PartShape::Heads(shape) => SiteValue::Float4(rows.reshape(shape)),
        }
    }

    /// `[B, T]`.
    fn tokens(&self) -> [usize; 2] {
        match self.shape {
            PartShape::Tokens([b, t, _]) | PartShape::Heads([b, t, _, _]) => [b, t],
        }
    }
}

impl Hooks<'_> {
    /// Runs the dictionary attached at `site` on `value`: serves its features (where writes may
    /// edit them), reconstruction and error (decoding only where one of those is read or
    /// written, or the reconstruction replaces the site), and returns the value that flows on:
    /// `value` itself when none of them was written and the error term is kept (exactly, not a
    /// recomputed sum), else the reconstruction plus the error (or the reconstruction alone).
    pub(super) fn run_dictionary<T: SiteTensor>(&mut self, site: Site, value: T) -> Result<T> {
        let (layout, dictionaries) = (self.layout, self.dictionaries);
        let Some((place, placement)) = layout.dictionary_at(site) else {
            return Ok(value);
        };
        let Site::Layer { layer, site: local } = site else {
            return Ok(value);
        };
        let attachment = &dictionaries[place];
        let dictionary = attachment.dictionary.as_ref();
        let part = |part| Site::Dictionary {
            layer,
            site: local,
            part,
        };
        let invalid = |message: String| Error::Edit {
            site: site.to_string(),
            message,
        };
        let whole = value.into_value();
        let target = Rows::of(&whole, placement.head).map_err(invalid)?;
        let input = match placement.input == site {
            true => target.rows.clone(),
            false => {
                let captured = self
                    .captured
                    .get(&layout.slot(placement.input))
                    .ok_or_else(|| {
                        invalid(format!(
                            "input `{}` was not served before it",
                            placement.input
                        ))
                    })?;
                Rows::of(captured, None).map_err(invalid)?.rows
            }
        };
        let [rows, _] = input.dims();
        let [batch, tokens] = target.tokens();
        let encoded = dictionary.encode(input);
        let features_site = part(DictionaryPart::Features);
        let features_edited = self.writes(features_site);
        let edited = DictionaryPart::ALL
            .into_iter()
            .any(|p| self.writes(part(p)));
        let features: Tensor<3> =
            encoded
                .features
                .clone()
                .reshape([batch, tokens, dictionary.features()]);
        let features = self.visit(features_site, features)?;
        let decoded = edited
            || !attachment.error_term
            || self.observes(part(DictionaryPart::Reconstruction))
            || self.observes(part(DictionaryPart::Error));
        if !decoded {
            // Only the features are read: nothing needs the decoder.
            return T::from_value(whole).ok_or_else(|| invalid("a value of another kind".into()));
        }
        let clean = dictionary.decode(encoded.features.clone(), &encoded);
        let reconstruction = match features_edited {
            true => dictionary.decode(features.reshape([rows, dictionary.features()]), &encoded),
            false => clean.clone(),
        };
        let reconstruction = self.visit_value(
            part(DictionaryPart::Reconstruction),
            target.shaped(reconstruction),
        )?;
        let error = target.shaped(target.rows.clone() - clean);
        let error = self.visit_value(part(DictionaryPart::Error), error)?;
        if !edited && attachment.error_term {
            return T::from_value(whole).ok_or_else(|| invalid("a value of another kind".into()));
        }
        let flowing = match attachment.error_term {
            true => reconstruction.plus(error).map_err(invalid)?,
            false => reconstruction,
        };
        let flowing = match (placement.head, whole, flowing) {
            (Some(head), SiteValue::Float4(whole), SiteValue::Float3(part)) => {
                let [b, t, d] = part.dims();
                let part = part.reshape([b, t, 1, d]);
                SiteValue::Float4(whole.slice_assign([0..b, 0..t, head..head + 1, 0..d], part))
            }
            (_, _, flowing) => flowing,
        };
        T::from_value(flowing).ok_or_else(|| invalid("a value of another kind".into()))
    }

    /// [`Hooks::visit`] for a float value of rank 3 or 4.
    fn visit_value(&mut self, site: Site, value: SiteValue) -> Result<SiteValue> {
        Ok(match value {
            SiteValue::Float3(t) => SiteValue::Float3(self.visit(site, t)?),
            SiteValue::Float4(t) => SiteValue::Float4(self.visit(site, t)?),
            other => other,
        })
    }
}
