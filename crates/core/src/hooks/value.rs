//! Rank-erased site values: what a read returns and a write supplies.

use burn::tensor::{Device, Gradients, Int, Shape, Slice, Tensor, TensorData};

/// Applies `$body` to the tensor of whichever variant `$value` is, rewrapping the result in the
/// same variant.
macro_rules! each_variant {
    ($value:expr, $t:ident => $body:expr) => {
        match $value {
            SiteValue::Ids($t) => SiteValue::Ids($body),
            SiteValue::Float2($t) => SiteValue::Float2($body),
            SiteValue::Float3($t) => SiteValue::Float3($body),
            SiteValue::Float4($t) => SiteValue::Float4($body),
        }
    };
}

/// Applies `$body` to the tensors of two values of the same variant (`Some` of the rewrapped
/// result), or gives `None` when their variants differ.
macro_rules! pair_variants {
    ($a:expr, $b:expr, ($x:ident, $y:ident) => $body:expr) => {
        match ($a, $b) {
            (SiteValue::Ids($x), SiteValue::Ids($y)) => Some(SiteValue::Ids($body)),
            (SiteValue::Float2($x), SiteValue::Float2($y)) => Some(SiteValue::Float2($body)),
            (SiteValue::Float3($x), SiteValue::Float3($y)) => Some(SiteValue::Float3($body)),
            (SiteValue::Float4($x), SiteValue::Float4($y)) => Some(SiteValue::Float4($body)),
            _ => None,
        }
    };
}

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

    /// A zero value of this shape that keeps its gradient (an autodiff leaf); an error for
    /// token ids, or a value off an autodiff device.
    pub fn gradient_leaf(&self) -> Result<SiteValue, String> {
        if matches!(self, SiteValue::Ids(_)) {
            return Err("token ids have no gradient".into());
        }
        let zeros = self.zeros_like();
        let autodiff = match &zeros {
            SiteValue::Ids(t) => t.is_autodiff(),
            SiteValue::Float2(t) => t.is_autodiff(),
            SiteValue::Float3(t) => t.is_autodiff(),
            SiteValue::Float4(t) => t.is_autodiff(),
        };
        if !autodiff {
            return Err("gradients need the model loaded on an autodiff device".into());
        }
        Ok(match zeros {
            SiteValue::Float2(t) => SiteValue::Float2(t.require_grad()),
            SiteValue::Float3(t) => SiteValue::Float3(t.require_grad()),
            SiteValue::Float4(t) => SiteValue::Float4(t.require_grad()),
            ids => ids,
        })
    }

    /// The gradient `gradients` holds for this leaf (off the autodiff device), if any.
    pub fn gradient(&self, gradients: &Gradients) -> Option<SiteValue> {
        match self {
            SiteValue::Ids(_) => None,
            SiteValue::Float2(t) => t.grad(gradients).map(SiteValue::Float2),
            SiteValue::Float3(t) => t.grad(gradients).map(SiteValue::Float3),
            SiteValue::Float4(t) => t.grad(gradients).map(SiteValue::Float4),
        }
    }

    /// The value off any autodiff device (and out of its graph).
    pub fn without_autodiff(self) -> SiteValue {
        each_variant!(self, t => t.without_autodiff())
    }

    /// The same value with every element zero.
    pub fn zeros_like(&self) -> SiteValue {
        each_variant!(self, t => t.zeros_like())
    }

    /// A float value of `shape` (rank 2 to 4) holding `values` in row-major order.
    pub fn from_floats(values: Vec<f32>, shape: &[usize], device: &Device) -> Result<Self, String> {
        let data = TensorData::new(values, shape.to_vec());
        match shape.len() {
            2 => Ok(SiteValue::Float2(Tensor::from_data(data, device))),
            3 => Ok(SiteValue::Float3(Tensor::from_data(data, device))),
            4 => Ok(SiteValue::Float4(Tensor::from_data(data, device))),
            rank => Err(format!("site values have rank 2 to 4, not {rank}")),
        }
    }

    /// The part of the value `slices` select (one slice per axis; the rank is kept).
    pub fn slice(&self, slices: &[Slice]) -> SiteValue {
        each_variant!(self, t => t.clone().slice(slices))
    }

    /// The value with each of `axes` reversed.
    pub fn flip(self, axes: &[usize]) -> SiteValue {
        axes.iter().fold(
            self,
            |value, &axis| each_variant!(value, t => t.flip([axis])),
        )
    }

    /// The value with the part `slices` select replaced by `part` (of that part's shape and
    /// this value's kind).
    pub fn assign(self, slices: &[Slice], part: SiteValue) -> Result<SiteValue, String> {
        let (kind, own) = (part.describe(), self.describe());
        pair_variants!(self, part, (t, p) => t.slice_assign(slices, p))
            .ok_or_else(|| format!("cannot write {kind} into {own}"))
    }

    /// The value broadcast (numpy rules, same rank) to `shape`, or `None` if it does not
    /// broadcast.
    pub fn broadcast_to(&self, shape: &[usize]) -> Option<SiteValue> {
        let own = self.shape();
        if own.len() != shape.len() || own.iter().zip(shape).any(|(a, b)| a != b && *a != 1) {
            return None;
        }
        if own == shape {
            return Some(self.clone());
        }
        let shape = Shape::from(shape.to_vec());
        Some(each_variant!(self, t => t.clone().expand(shape.clone())))
    }

    /// Element-wise sum with `other` (same kind and shape); token ids cannot be added to.
    pub fn plus(self, other: SiteValue) -> Result<SiteValue, String> {
        if matches!(self, SiteValue::Ids(_)) {
            return Err("token ids cannot be added to; use a set".into());
        }
        let kind = other.describe();
        let own = self.describe();
        pair_variants!(self, other, (t, o) => t + o)
            .ok_or_else(|| format!("cannot add {kind} to {own}"))
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
