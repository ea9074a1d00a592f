//! numpy basic indexing of site values: `[i, a:b, :, -1]`, `[..., 3]`, `[:, ::2]`.
//!
//! A request with an index reads or writes only that part of the site's value. Integers select
//! one entry and drop the axis from the result, as in numpy; slices clamp their bounds to the
//! axis; `...` stands for as many full slices as the value needs.

use std::fmt;

use burn::tensor::Slice;

/// One entry of an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexItem {
    /// One position (negative counts from the end); the axis is dropped from the result.
    Int(i64),
    /// `start:stop:step`, any part omitted; the step must be positive.
    Slice {
        /// First position (negative counts from the end; default 0).
        start: Option<i64>,
        /// End, exclusive (negative counts from the end; default the axis size).
        stop: Option<i64>,
        /// Stride (default 1).
        step: Option<i64>,
    },
    /// `...`: full slices over as many axes as needed.
    Ellipsis,
}

/// A numpy basic index: what part of a site's value a request reads or writes. The empty
/// index selects the whole value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Index(Vec<IndexItem>);

/// One axis of an index resolved against a concrete shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AxisSelection {
    start: usize,
    len: usize,
    step: usize,
    /// False for an integer index: the axis is dropped from the numpy-shaped result.
    kept: bool,
}

/// An index resolved against one value's shape: the part it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    axes: Vec<AxisSelection>,
}

impl Index {
    /// The index that selects everything.
    pub fn full() -> Index {
        Index::default()
    }

    /// Whether the index selects the whole value without touching it (no entries).
    pub fn is_full(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses the text between the brackets, e.g. `:, -1` or `0, 2:5, ...`.
    pub fn parse(text: &str) -> Result<Index, String> {
        if text.trim().is_empty() {
            return Err("an empty index `[]`: name at least one axis, e.g. `[:, -1]`".into());
        }
        let items = text
            .split(',')
            .map(|part| parse_item(part.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        if items.iter().filter(|i| **i == IndexItem::Ellipsis).count() > 1 {
            return Err("an index can only have a single ellipsis (`...`)".into());
        }
        Ok(Index(items))
    }

    /// The entries over `rank` axes, `...` expanded and missing trailing axes filled with
    /// full slices.
    fn expanded(&self, rank: usize) -> Result<Vec<IndexItem>, String> {
        let named = self.0.iter().filter(|i| **i != IndexItem::Ellipsis).count();
        if named > rank {
            return Err(format!(
                "too many indices: the value is {rank}-dimensional, but {named} were indexed"
            ));
        }
        let full = IndexItem::Slice {
            start: None,
            stop: None,
            step: None,
        };
        let mut items = Vec::with_capacity(rank);
        for item in &self.0 {
            if *item == IndexItem::Ellipsis {
                items.extend(std::iter::repeat_n(full, rank - named));
            } else {
                items.push(*item);
            }
        }
        items.resize(rank, full);
        Ok(items)
    }

    /// Resolves the index against a value of shape `shape`; errors as numpy words them.
    pub fn resolve(&self, shape: &[usize]) -> Result<Region, String> {
        let items = self.expanded(shape.len())?;
        let axes = items
            .iter()
            .zip(shape)
            .enumerate()
            .map(|(axis, (item, &size))| select(*item, axis, size))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Region { axes })
    }

    /// The shape to give a value of shape `operand` so that it lines up with the region this
    /// index selects in a value of rank `rank`: numpy broadcasting of `operand` against the
    /// region's (integer axes dropped) shape, then a length-1 axis at every integer position.
    pub fn align_operand(&self, operand: &[usize], rank: usize) -> Result<Vec<usize>, String> {
        let items = self.expanded(rank)?;
        let kept = items
            .iter()
            .filter(|i| !matches!(i, IndexItem::Int(_)))
            .count();
        if operand.len() > kept {
            return Err(format!(
                "a value of rank {} cannot broadcast to the {kept} axes this selects",
                operand.len()
            ));
        }
        let mut dims = std::iter::repeat_n(1, kept - operand.len()).chain(operand.iter().copied());
        Ok(items
            .iter()
            .map(|item| match item {
                IndexItem::Int(_) => 1,
                _ => dims.next().unwrap_or(1),
            })
            .collect())
    }
}

fn parse_item(text: &str) -> Result<IndexItem, String> {
    if text == "..." {
        return Ok(IndexItem::Ellipsis);
    }
    let number = |part: &str| -> Result<Option<i64>, String> {
        let part = part.trim();
        if part.is_empty() {
            return Ok(None);
        }
        part.parse::<i64>().map(Some).map_err(|_| {
            format!("`{part}` is not an integer (indices are integers, `a:b:c` slices or `...`)")
        })
    };
    let parts: Vec<&str> = text.split(':').collect();
    match parts.as_slice() {
        [single] => match number(single)? {
            Some(value) => Ok(IndexItem::Int(value)),
            None => Err("an empty entry between commas".into()),
        },
        [start, stop] | [start, stop, _] => {
            let step = match parts.get(2) {
                Some(step) => number(step)?,
                None => None,
            };
            match step {
                Some(0) => return Err("slice step cannot be zero".into()),
                Some(s) if s < 0 => {
                    return Err(format!("`{text}`: negative slice steps are not supported"));
                }
                _ => {}
            }
            Ok(IndexItem::Slice {
                start: number(start)?,
                stop: number(stop)?,
                step,
            })
        }
        _ => Err(format!(
            "`{text}` has too many `:` (a slice is `start:stop:step`)"
        )),
    }
}

/// numpy's resolution of one index entry on an axis of `size`.
fn select(item: IndexItem, axis: usize, size: usize) -> Result<AxisSelection, String> {
    let signed_size = i64::try_from(size).map_err(|_| "axis too large".to_string())?;
    match item {
        IndexItem::Int(value) => {
            let position = if value < 0 {
                value + signed_size
            } else {
                value
            };
            if !(0..signed_size).contains(&position) {
                return Err(format!(
                    "index {value} is out of bounds for axis {axis} with size {size}"
                ));
            }
            Ok(AxisSelection {
                start: position as usize,
                len: 1,
                step: 1,
                kept: false,
            })
        }
        IndexItem::Slice { start, stop, step } => {
            let clamp = |bound: i64| -> usize {
                let bound = if bound < 0 {
                    bound + signed_size
                } else {
                    bound
                };
                bound.clamp(0, signed_size) as usize
            };
            let start = start.map_or(0, clamp);
            let stop = stop.map_or(size, clamp);
            let step = step.unwrap_or(1) as usize;
            let len = stop.saturating_sub(start).div_ceil(step);
            Ok(AxisSelection {
                start,
                len,
                step,
                kept: true,
            })
        }
        IndexItem::Ellipsis => unreachable!("expanded away"),
    }
}

impl Region {
    /// The selected part's shape with every axis kept (length 1 at integer indices): the shape
    /// the part has as a tensor of the value's rank.
    pub fn kept_shape(&self) -> Vec<usize> {
        self.axes.iter().map(|a| a.len).collect()
    }

    /// The selected part's shape as numpy gives it (integer axes dropped).
    pub fn shape(&self) -> Vec<usize> {
        self.axes.iter().filter(|a| a.kept).map(|a| a.len).collect()
    }

    /// The positions of the axes numpy keeps (every axis but the integer-indexed ones).
    pub fn kept_axes(&self) -> impl Iterator<Item = usize> + '_ {
        self.axes
            .iter()
            .enumerate()
            .filter(|(_, a)| a.kept)
            .map(|(axis, _)| axis)
    }

    /// Whether nothing is selected (some axis is empty).
    pub fn is_empty(&self) -> bool {
        self.axes.iter().any(|a| a.len == 0)
    }

    /// The region as burn slices, one per axis.
    pub fn slices(&self) -> Vec<Slice> {
        self.axes
            .iter()
            .map(|a| {
                let end = a.start + a.len.saturating_sub(1) * a.step + 1;
                Slice::new(a.start as isize, Some(end as isize), a.step as isize)
            })
            .collect()
    }
}

impl fmt::Display for Index {
    /// `[:, -1]`; nothing for the full index.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        let bound = |b: Option<i64>| b.map(|b| b.to_string()).unwrap_or_default();
        let items: Vec<String> = self
            .0
            .iter()
            .map(|item| match item {
                IndexItem::Int(value) => value.to_string(),
                IndexItem::Ellipsis => "...".into(),
                IndexItem::Slice { start, stop, step } => match step {
                    Some(step) => format!("{}:{}:{step}", bound(*start), bound(*stop)),
                    None => format!("{}:{}", bound(*start), bound(*stop)),
                },
            })
            .collect();
        write!(f, "[{}]", items.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(index: &str, shape: &[usize]) -> Result<Region, String> {
        Index::parse(index)?.resolve(shape)
    }

    #[test]
    fn indices_resolve_as_numpy_does() {
        let r = region(":, -1", &[2, 5, 8]).unwrap();
        assert_eq!(r.shape(), [2, 8]);
        assert_eq!(r.kept_shape(), [2, 1, 8]);
        assert_eq!(region("..., 3", &[2, 5, 8]).unwrap().shape(), [2, 5]);
        assert_eq!(region("0, ...", &[2, 5, 8]).unwrap().shape(), [5, 8]);
        assert_eq!(region("1:, ::2", &[2, 5, 8]).unwrap().shape(), [1, 3, 8]);
        assert_eq!(region(":, 1:100", &[2, 5]).unwrap().shape(), [2, 4]);
        assert_eq!(region(":, -3:-1", &[2, 5]).unwrap().shape(), [2, 2]);
        assert_eq!(region(":, 4:2", &[2, 5]).unwrap().shape(), [2, 0]);
        assert!(region(":, 4:2", &[2, 5]).unwrap().is_empty());
        assert_eq!(region("1::3", &[8]).unwrap().shape(), [3]);
        assert_eq!(
            region("1::3", &[8]).unwrap().slices(),
            [Slice::new(1, Some(8), 3)]
        );
    }

    #[test]
    fn bad_indices_say_what_is_wrong() {
        let error = region(":, 5", &[2, 5]).unwrap_err();
        assert_eq!(error, "index 5 is out of bounds for axis 1 with size 5");
        assert!(region(":, -6", &[2, 5]).is_err());
        assert!(
            region("0, 0, 0", &[2, 5])
                .unwrap_err()
                .contains("too many indices")
        );
        for bad in ["", "x", "1:2:0", "::-1", "1:2:3:4", "..., ...", "0,,1"] {
            assert!(Index::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn indices_print_canonically() {
        let index = Index::parse(" :,-1 , 2:, ::2, ...").unwrap();
        assert_eq!(index.to_string(), "[:, -1, 2:, ::2, ...]");
        assert_eq!(Index::full().to_string(), "");
    }

    #[test]
    fn operands_line_up_with_the_region() {
        let index = Index::parse(":, -1").unwrap();
        assert_eq!(index.align_operand(&[8], 3).unwrap(), [1, 1, 8]);
        assert_eq!(index.align_operand(&[2, 8], 3).unwrap(), [2, 1, 8]);
        assert!(index.align_operand(&[2, 2, 8], 3).is_err());
        assert_eq!(Index::full().align_operand(&[8], 3).unwrap(), [1, 1, 8]);
        let head = Index::parse(":, :, 3").unwrap();
        assert_eq!(head.align_operand(&[], 4).unwrap(), [1, 1, 1, 1]);
    }
}
