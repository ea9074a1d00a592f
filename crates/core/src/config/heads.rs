//! The attention head counts of a `config.json`, checked once for every adapter: query heads
//! split into key/value groups, and a head size that fits the hidden size.

use super::ArchConfig;
use crate::error::Result;

/// The config keys an architecture stores its attention sizes under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadKeys {
    /// The hidden size (`hidden_size`, GPT-2's `n_embd`).
    pub hidden: &'static str,
    /// The query heads (`num_attention_heads`, GPT-2's `n_head`).
    pub heads: &'static str,
    /// The key/value heads (`num_key_value_heads`).
    pub kv_heads: &'static str,
}

impl HeadKeys {
    /// The keys of Llama-style configs.
    pub const LLAMA: HeadKeys = HeadKeys {
        hidden: "hidden_size",
        heads: "num_attention_heads",
        kv_heads: "num_key_value_heads",
    };
}

/// How an architecture sizes a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadDim {
    /// `hidden / heads`, which must divide evenly (GPT-2, GPT-NeoX, Bamba).
    Split,
    /// The config's `head_dim`, else `hidden / heads` rounded down (transformers' Llama).
    Declared(Option<usize>),
}

/// A config's attention head counts, checked by [`AttentionHeads::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionHeads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Head dimension (nonzero).
    pub head_dim: usize,
}

impl AttentionHeads {
    /// Checks `heads` query heads and `kv_heads` key/value heads (`None`: one per query head)
    /// of a model of `hidden` size, the head sized as `head_dim` says: an error naming the
    /// config key at fault otherwise.
    pub fn check(
        config: &ArchConfig,
        keys: HeadKeys,
        (hidden, heads, kv_heads): (usize, usize, Option<usize>),
        head_dim: HeadDim,
    ) -> Result<Self> {
        let kv_heads = kv_heads.unwrap_or(heads);
        let refuse = |message: String| Err(config.unsupported(message));
        if heads == 0 {
            return refuse(format!("`{}` is 0", keys.heads));
        }
        if kv_heads == 0 {
            return refuse(format!("`{}` is 0", keys.kv_heads));
        }
        if !heads.is_multiple_of(kv_heads) {
            return refuse(format!(
                "`{}` {heads} is not a multiple of `{}` {kv_heads}",
                keys.heads, keys.kv_heads
            ));
        }
        let head_dim = match head_dim {
            HeadDim::Split if !hidden.is_multiple_of(heads) => {
                return refuse(format!(
                    "`{}` {hidden} is not a multiple of `{}` {heads}",
                    keys.hidden, keys.heads
                ));
            }
            HeadDim::Split | HeadDim::Declared(None) => hidden / heads,
            HeadDim::Declared(Some(dim)) => dim,
        };
        if head_dim == 0 {
            return refuse("`head_dim` is 0".into());
        }
        Ok(AttentionHeads {
            heads,
            kv_heads,
            head_dim,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(sizes: (usize, usize, Option<usize>), head_dim: HeadDim) -> Result<AttentionHeads> {
        let config = ArchConfig {
            path: "config.json".into(),
            json: json!({}),
        };
        AttentionHeads::check(&config, HeadKeys::LLAMA, sizes, head_dim)
    }

    fn refusal(sizes: (usize, usize, Option<usize>), head_dim: HeadDim) -> String {
        check(sizes, head_dim).unwrap_err().to_string()
    }

    #[test]
    fn heads_and_head_sizes_are_derived() {
        let heads = check((16, 4, Some(2)), HeadDim::Split).unwrap();
        assert_eq!((heads.heads, heads.kv_heads, heads.head_dim), (4, 2, 4));
        let heads = check((18, 4, None), HeadDim::Declared(None)).unwrap();
        assert_eq!((heads.kv_heads, heads.head_dim), (4, 4));
        let heads = check((16, 4, None), HeadDim::Declared(Some(8))).unwrap();
        assert_eq!(heads.head_dim, 8);
    }

    #[test]
    fn refusals_name_the_key() {
        let refused = refusal((16, 0, None), HeadDim::Split);
        assert!(refused.contains("`num_attention_heads` is 0"), "{refused}");
        let refused = refusal((16, 4, Some(3)), HeadDim::Split);
        assert!(
            refused
                .contains("`num_attention_heads` 4 is not a multiple of `num_key_value_heads` 3"),
            "{refused}"
        );
        let refused = refusal((18, 4, None), HeadDim::Split);
        assert!(
            refused.contains("`hidden_size` 18 is not a multiple"),
            "{refused}"
        );
        let refused = refusal((2, 4, None), HeadDim::Declared(None));
        assert!(refused.contains("`head_dim` is 0"), "{refused}");
    }
}
