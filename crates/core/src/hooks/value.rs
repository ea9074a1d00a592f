//! Rank-erased site values: what a read returns and a write supplies.

use burn::tensor::{Int, Tensor, TensorData};

/// The value at a site: token ids or float activations of rank 2 to 4.
///
/// Holding a `SiteValue` holds a reference to the tensor, not a copy of its data.
#[derive(Debug, Clone)]
pub enum SiteValue {
    /// Token ids `[B, T]`.
    Ids(Tensor<2, Int>),
    /// A rank-2 float tensor (e.g. `next_token_probs`).
    Float2(Tensor<2>),
    /// A rank-3 float tensor (e.g. `layer_output`).
    Float3(Tensor<3>),
    /// A rank-4 float tensor (e.g. `attention_keys`).
    Float4(Tensor<4>),
}

impl SiteValue {
    /// The value's shape.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            SiteValue::Ids(t) => t.dims().to_vec(),
            SiteValue::Float2(t) => t.dims().to_vec(),
            SiteValue::Float3(t) => t.dims().to_vec(),
            SiteValue::Float4(t) => t.dims().to_vec(),
        }
    }

    /// "int ids of rank 2", "float of rank 3", ...: for error messages.
    pub fn describe(&self) -> String {
        match self {
            SiteValue::Ids(_) => "int ids of rank 2".into(),
            SiteValue::Float2(_) => "float of rank 2".into(),
            SiteValue::Float3(_) => "float of rank 3".into(),
            SiteValue::Float4(_) => "float of rank 4".into(),
        }
    }

    /// Copies the value to host memory (ids as i64, activations as f32).
    pub fn to_data(&self) -> TensorData {
        match self {
            SiteValue::Ids(t) => t.to_data().convert::<i64>(),
            SiteValue::Float2(t) => t.to_data().convert::<f32>(),
            SiteValue::Float3(t) => t.to_data().convert::<f32>(),
            SiteValue::Float4(t) => t.to_data().convert::<f32>(),
        }
    }

    /// The same value with every element zero.
    pub fn zeros_like(&self) -> SiteValue {
        match self {
            SiteValue::Ids(t) => SiteValue::Ids(t.zeros_like()),
            SiteValue::Float2(t) => SiteValue::Float2(t.zeros_like()),
            SiteValue::Float3(t) => SiteValue::Float3(t.zeros_like()),
            SiteValue::Float4(t) => SiteValue::Float4(t.zeros_like()),
        }
    }
}

/// A tensor type that a site can hold; the forward pass hands these to the hooks.
pub trait SiteTensor: Sized + Clone {
    /// Wraps the tensor (no copy).
    fn into_value(self) -> SiteValue;
    /// Unwraps a value of this type.
    fn from_value(value: SiteValue) -> Option<Self>;
    /// What this type is, for error messages.
    fn describe() -> &'static str;
}

macro_rules! site_tensor {
    ($ty:ty, $variant:ident, $text:literal) => {
        impl SiteTensor for $ty {
            fn into_value(self) -> SiteValue {
                SiteValue::$variant(self)
            }
            fn from_value(value: SiteValue) -> Option<Self> {
                match value {
                    SiteValue::$variant(t) => Some(t),
                    _ => None,
                }
            }
            fn describe() -> &'static str {
                $text
            }
        }
    };
}

site_tensor!(Tensor<2, Int>, Ids, "int ids of rank 2");
site_tensor!(Tensor<2>, Float2, "float of rank 2");
site_tensor!(Tensor<3>, Float3, "float of rank 3");
site_tensor!(Tensor<4>, Float4, "float of rank 4");
