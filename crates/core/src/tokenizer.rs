//! Tokenization through the `tokenizers` crate (`tokenizer.json`).

use std::path::Path;

use crate::error::{Error, Result};

/// A model's tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.inner.get_vocab_size(true))
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from disk.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Tokenizer::from_bytes(path, &bytes)
    }

    /// Loads a `tokenizer.json` held in memory; `path` names it in errors.
    ///
    /// The `tokenizers` crate panics on some malformed files (JSON cut off inside its
    /// `decoder`, a corrupt precompiled normalizer): the JSON is checked first, and a panic
    /// still raised while building the tokenizer becomes this file's error.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Tokenizer> {
        let error = |message: String| Error::Tokenizer {
            path: path.to_path_buf(),
            message,
        };
        serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
            .map_err(|e| error(format!("not valid JSON: {e}")))?;
        let built = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes))
            .map_err(|_| error("the tokenizers library could not read it (it panicked)".into()))?;
        let inner = built.map_err(|e| error(e.to_string()))?;
        Ok(Tokenizer { inner })
    }

    /// Number of tokens it knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text`, without special tokens added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenize(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenize(e.to_string()))
    }
}
