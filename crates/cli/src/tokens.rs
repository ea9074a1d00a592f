//! Token text for reports: decoding single ids and prompt tokens as labels.

pub use hookscope::report::{prompt_labels, token_text};
use hookscope::{Model, Result};

/// Encodes `text` and requires exactly one token (for metrics naming a token).
pub fn single_token(model: &Model, text: &str) -> Result<u32> {
    if let Some(id) = text.strip_prefix('#').and_then(|id| id.parse::<u32>().ok()) {
        return Ok(id);
    }
    let tokenizer = model.tokenizer().ok_or_else(|| {
        hookscope::Error::InvalidInput(format!(
            "this model has no tokenizer: name `{text}` by id as `#ID`"
        ))
    })?;
    match tokenizer.encode(text)?.as_slice() {
        [id] => Ok(*id),
        ids => Err(hookscope::Error::InvalidInput(format!(
            "`{text}` is {} tokens, not one (write `#ID` to name a token by id)",
            ids.len()
        ))),
    }
}
