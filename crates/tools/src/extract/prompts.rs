//! Reading a prompts file: JSONL with a `"text"` (or pre-tokenized `"ids"`) field per line, or
//! plain text with one prompt per line. Blank lines are skipped; a prompt keeps its 0-based line
//! number as its index. Shard `I/N` takes the prompts whose ordinal among all prompts is
//! `I mod N`, so the shards together cover every prompt exactly once.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use hookscope_core::tokenizer::Tokenizer;
use hookscope_core::{Error, Result};

/// One part of a job split across machines: shard `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// This shard, `0..count`.
    pub index: usize,
    /// How many shards the job is split into.
    pub count: usize,
}

impl Shard {
    /// The whole job.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Parses `I/N` (`0 <= I < N`).
    pub fn parse(text: &str) -> Result<Shard> {
        let invalid = || {
            Error::InvalidInput(format!(
                "--shard `{text}`: expected I/N with 0 <= I < N (e.g. 0/4)"
            ))
        };
        let (index, count) = text.split_once('/').ok_or_else(invalid)?;
        let index: usize = index.trim().parse().map_err(|_| invalid())?;
        let count: usize = count.trim().parse().map_err(|_| invalid())?;
        if index >= count {
            return Err(invalid());
        }
        Ok(Shard { index, count })
    }

    /// Whether the prompt with this ordinal (0-based, among all prompts) belongs here.
    pub fn takes(&self, ordinal: usize) -> bool {
        ordinal % self.count == self.index
    }
}

/// How the file spells its prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// One JSON object per line, with `"text"` or `"ids"`.
    JsonLines,
    /// One prompt per line.
    Text,
}

/// A prompt as read: its line in the file and its text or ids.
#[derive(Debug, Clone, PartialEq)]
pub struct RawPrompt {
    /// 0-based line number in the file.
    pub line: usize,
    /// Text to tokenize, or ids given as they are.
    pub content: PromptContent,
}

/// A prompt's text or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptContent {
    /// Text, tokenized with the model's tokenizer.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// The prompts of one shard of a file, read line by line (memory does not grow with the file).
pub struct PromptReader {
    path: PathBuf,
    format: Format,
    lines: std::io::Lines<BufReader<std::fs::File>>,
    line: usize,
    ordinal: usize,
    shard: Shard,
}

impl PromptReader {
    /// Opens `path` (`.jsonl`/`.ndjson`: JSON lines; anything else: plain text).
    pub fn open(path: &Path, shard: Shard) -> Result<PromptReader> {
        let file = std::fs::File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "ndjson") => Format::JsonLines,
            _ => Format::Text,
        };
        Ok(PromptReader {
            path: path.to_path_buf(),
            format,
            lines: BufReader::new(file).lines(),
            line: 0,
            ordinal: 0,
            shard,
        })
    }

    /// An error about line `line` (0-based) of the file, reported 1-based as editors count.
    fn error(&self, line: usize, message: impl std::fmt::Display) -> Error {
        Error::InvalidInput(format!("{}:{}: {message}", self.path.display(), line + 1))
    }

    fn parse(&self, line: usize, text: String) -> Result<PromptContent> {
        if self.format == Format::Text {
            return Ok(PromptContent::Text(text));
        }
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| self.error(line, format!("not a JSON object: {e}")))?;
        if let Some(text) = json.get("text") {
            return match text.as_str() {
                Some(text) => Ok(PromptContent::Text(text.to_string())),
                None => Err(self.error(line, "`text` must be a string")),
            };
        }
        match json.get("ids").and_then(Value::as_array) {
            Some(ids) => ids
                .iter()
                .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect::<Option<Vec<u32>>>()
                .map(PromptContent::Ids)
                .ok_or_else(|| self.error(line, "`ids` must be a list of token ids")),
            None => Err(self.error(line, "no `text` string (or `ids` list) field")),
        }
    }
}

impl Iterator for PromptReader {
    type Item = Result<RawPrompt>;

    fn next(&mut self) -> Option<Result<RawPrompt>> {
        loop {
            let line = self.line;
            let text = match self.lines.next()? {
                Ok(text) => text,
                Err(e) => return Some(Err(self.error(line, e))),
            };
            self.line += 1;
            if text.trim().is_empty() {
                continue;
            }
            let ordinal = self.ordinal;
            self.ordinal += 1;
            if !self.shard.takes(ordinal) {
                continue;
            }
            return Some(
                self.parse(line, text)
                    .map(|content| RawPrompt { line, content }),
            );
        }
    }
}

/// A prompt ready to run: its line and its token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// 0-based line number in the file.
    pub line: usize,
    /// Token ids (at least one).
    pub ids: Vec<u32>,
}

impl RawPrompt {
    /// Tokenizes the text (ids pass through); `source` names the file in errors.
    pub fn tokenize(self, tokenizer: Option<&Tokenizer>, source: &Path) -> Result<Prompt> {
        let at = |message: String| {
            Error::InvalidInput(format!("{}:{}: {message}", source.display(), self.line + 1))
        };
        let ids = match self.content {
            PromptContent::Ids(ids) => ids,
            PromptContent::Text(text) => match tokenizer {
                Some(tokenizer) => tokenizer.encode(&text)?,
                None => return Err(at("this model has no tokenizer.json: give `ids`".into())),
            },
        };
        if ids.is_empty() {
            return Err(at("the prompt has no tokens".into()));
        }
        Ok(Prompt {
            line: self.line,
            ids,
        })
    }
}

/// Counts the prompts of the whole file (every shard) and fingerprints its bytes (FNV-1a), in
/// one pass that holds one line at a time.
pub fn survey(path: &Path) -> Result<(usize, u64)> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut prompts = 0;
    for line in BufReader::new(file).split(b'\n') {
        let line = line.map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        for byte in line.iter().chain(b"\n") {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        if !line.iter().all(u8::is_ascii_whitespace) {
            prompts += 1;
        }
    }
    Ok((prompts, hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn shards_split_prompts_by_ordinal_and_keep_line_numbers() {
        let (_dir, path) = write("p.txt", "a\n\nb\nc\n  \nd\n");
        let lines = |shard| -> Vec<usize> {
            PromptReader::open(&path, shard)
                .unwrap()
                .map(|p| p.unwrap().line)
                .collect()
        };
        assert_eq!(lines(Shard::WHOLE), [0, 2, 3, 5]);
        assert_eq!(lines(Shard { index: 0, count: 2 }), [0, 3]);
        assert_eq!(lines(Shard { index: 1, count: 2 }), [2, 5]);
        assert_eq!(survey(&path).unwrap().0, 4);
    }

    #[test]
    fn json_lines_take_text_or_ids_and_name_the_bad_line() {
        let (_dir, path) = write(
            "p.jsonl",
            "{\"text\": \"hi\"}\n{\"ids\": [1, 2]}\n{\"txt\": 1}\n",
        );
        let read: Vec<_> = PromptReader::open(&path, Shard::WHOLE).unwrap().collect();
        assert_eq!(
            read[0].as_ref().unwrap().content,
            PromptContent::Text("hi".into())
        );
        assert_eq!(
            read[1].as_ref().unwrap().content,
            PromptContent::Ids(vec![1, 2])
        );
        let error = read[2].as_ref().unwrap_err().to_string();
        assert!(error.contains("p.jsonl:3: no `text`"), "{error}");
    }

    #[test]
    fn shard_syntax_is_checked() {
        assert_eq!(Shard::parse("1/4").unwrap(), Shard { index: 1, count: 4 });
        for bad in ["4/4", "1", "a/2", "0/0", "-1/2"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
    }
}
