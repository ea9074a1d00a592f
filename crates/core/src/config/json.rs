//! JSON as `transformers` writes it: Python's `json` module emits the bare tokens `Infinity`,
//! `-Infinity` and `NaN` (older `config.json` files, e.g. `"time_step_limit": [0.0, Infinity]`),
//! and transformers 5.x writes non-finite floats as `{"__float__": "Infinity"}`.

use serde::Deserialize;

/// Rewrites the bare non-finite tokens Python emits into transformers' `{"__float__": ...}`
/// form, leaving strings untouched, so that the text parses as standard JSON.
pub(crate) fn normalise_non_finite(text: &str) -> std::borrow::Cow<'_, str> {
    const TOKENS: [(&str, &str); 3] = [
        ("-Infinity", r#"{"__float__": "-Infinity"}"#),
        ("Infinity", r#"{"__float__": "Infinity"}"#),
        ("NaN", r#"{"__float__": "NaN"}"#),
    ];
    if !TOKENS.iter().any(|(token, _)| text.contains(token)) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            in_string = escaped || c != '"';
            escaped = !escaped && c == '\\';
        } else if c == '"' {
            in_string = true;
        } else if let Some((token, replacement)) =
            TOKENS.iter().find(|(token, _)| rest.starts_with(token))
        {
            out.push_str(replacement);
            rest = &rest[token.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.into()
}

/// A float from `config.json` that may be non-finite: a JSON number or transformers'
/// `{"__float__": "Infinity" | "-Infinity" | "NaN"}`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "FloatRepr")]
pub struct ConfigFloat(pub f64);

#[derive(Deserialize)]
#[serde(untagged)]
enum FloatRepr {
    Number(f64),
    Tagged {
        #[serde(rename = "__float__")]
        float: String,
    },
}

impl TryFrom<FloatRepr> for ConfigFloat {
    type Error = String;

    fn try_from(repr: FloatRepr) -> Result<Self, String> {
        match repr {
            FloatRepr::Number(value) => Ok(ConfigFloat(value)),
            FloatRepr::Tagged { float } => match float.as_str() {
                "Infinity" | "inf" => Ok(ConfigFloat(f64::INFINITY)),
                "-Infinity" | "-inf" => Ok(ConfigFloat(f64::NEG_INFINITY)),
                "NaN" | "nan" => Ok(ConfigFloat(f64::NAN)),
                other => Err(format!("`{other}` is not a float")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_non_finite_tokens_become_tagged_floats_outside_strings() {
        let text = r#"{"limit": [0.0, Infinity], "low": -Infinity, "name": "NaN \"Infinity\""}"#;
        let json: serde_json::Value = serde_json::from_str(&normalise_non_finite(text)).unwrap();
        let limit: Vec<ConfigFloat> = serde_json::from_value(json["limit"].clone()).unwrap();
        assert_eq!(limit, [ConfigFloat(0.0), ConfigFloat(f64::INFINITY)]);
        let low: ConfigFloat = serde_json::from_value(json["low"].clone()).unwrap();
        assert_eq!(low.0, f64::NEG_INFINITY);
        assert_eq!(json["name"], r#"NaN "Infinity""#);
    }

    #[test]
    fn tagged_floats_parse_and_unknown_tags_are_errors() {
        let inf: ConfigFloat = serde_json::from_str(r#"{"__float__": "Infinity"}"#).unwrap();
        assert_eq!(inf.0, f64::INFINITY);
        assert!(serde_json::from_str::<ConfigFloat>(r#"{"__float__": "lots"}"#).is_err());
        assert_eq!(serde_json::from_str::<ConfigFloat>("2.5").unwrap().0, 2.5);
    }
}
