//! numpy basic indexing of site values: `[i, a:b, :, -1]`, `[..., 3]`, `[:, ::2]`.
//!
//! A request with an index reads or writes only that part of the site's value. Integers select
//! one entry and drop the axis from the result, as in numpy; slices clamp their bounds to the
//! axis, and a negative step walks the axis backwards (`[:, ::-1]` reverses the positions);
//! `...` stands for as many full slices as the value needs.

use std::fmt;

use burn::tensor::Slice;

use super::SiteValue;

/// One entry of an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexItem {
    /// One position (negative counts from the end); the axis is dropped from the result.
    Int(i64),
    /// `start:stop:step`, any part omitted; a negative step walks backwards, as in numpy.
    Slice {
        /// First position (negative counts from the end; default the axis' first position in
        /// the step's direction).
        start: Option<i64>,
        /// End, exclusive (negative counts from the end; default past the axis' last position
        /// in the step's direction).
        stop: Option<i64>,
        /// Stride, never zero (default 1).
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
    /// The lowest selected position.
    start: usize,
    len: usize,
    /// The distance between selected positions.
    step: usize,
    /// True for a negative step: the part holds the positions in descending order.
    reversed: bool,
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

    /// Whether the index keeps the first axis (the batch) whole: no index, or a first entry
    /// `:` (an index starting with `...` may or may not reach the first axis, so it does not
    /// count).
    pub fn keeps_first_axis(&self) -> bool {
        match self.0.first() {
            None => true,
            Some(IndexItem::Slice { start, stop, step }) => {
                start.is_none() && stop.is_none() && matches!(step, None | Some(1))
            }
            Some(_) => false,
        }
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
            if step == Some(0) {
                return Err("slice step cannot be zero".into());
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
                reversed: false,
                kept: false,
            })
        }
        IndexItem::Slice { start, stop, step } => {
            let step = step.unwrap_or(1);
            // numpy's bounds: negative ones count from the end, then clamp to the axis; going
            // backwards the bounds run from the last position down to -1 (before the first).
            let (low, high) = if step > 0 {
                (0, signed_size)
            } else {
                (-1, signed_size - 1)
            };
            let clamp = |bound: i64| -> i64 {
                let bound = if bound < 0 {
                    bound + signed_size
                } else {
                    bound
                };
                bound.clamp(low, high)
            };
            let (default_start, default_stop) = if step > 0 { (low, high) } else { (high, low) };
            let first = start.map_or(default_start, clamp);
            let stop = stop.map_or(default_stop, clamp);
            let stride = step.unsigned_abs();
            let span = if step > 0 { stop - first } else { first - stop };
            let len = (span.max(0) as u64).div_ceil(stride);
            let lowest = if step > 0 || len == 0 {
                first
            } else {
                first - ((len - 1) * stride) as i64
            };
            Ok(AxisSelection {
                start: lowest.max(0) as usize,
                len: len as usize,
                step: stride as usize,
                reversed: step < 0,
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

    /// The selected part of `value` (rank kept, reversed axes in descending order).
    pub fn read(&self, value: &SiteValue) -> SiteValue {
        value.slice(&self.slices()).flip(&self.reversed_axes())
    }

    /// `whole` with the selected part replaced by `part` (of the part's shape, as
    /// [`Region::read`] gives it).
    pub fn write(&self, whole: SiteValue, part: SiteValue) -> Result<SiteValue, String> {
        whole.assign(&self.slices(), part.flip(&self.reversed_axes()))
    }

    /// The region as burn slices, one per axis, every one ascending.
    fn slices(&self) -> Vec<Slice> {
        self.axes
            .iter()
            .map(|a| {
                let end = match a.len {
                    0 => a.start,
                    len => a.start + (len - 1) * a.step + 1,
                };
                Slice::new(a.start as isize, Some(end as isize), a.step as isize)
            })
            .collect()
    }

    /// The axes a negative step walks backwards.
    fn reversed_axes(&self) -> Vec<usize> {
        (0..self.axes.len())
            .filter(|&axis| self.axes[axis].reversed)
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
        assert_eq!(
            region(":, 4:2", &[2, 5]).unwrap().slices()[1],
            Slice::new(4, Some(4), 1)
        );
    }

    /// The positions numpy's `list(range(size))[index]` gives, for one axis.
    fn numpy_positions(index: &str, size: usize) -> Vec<usize> {
        let values: Vec<f32> = (0..size).map(|v| v as f32).collect();
        let device = burn::tensor::Device::default();
        let value = SiteValue::from_floats(values, &[1, size], &device).unwrap();
        let part = region(&format!(":, {index}"), &[1, size])
            .unwrap()
            .read(&value);
        let data = part
            .to_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap();
        data.into_iter().map(|v| v as usize).collect()
    }

    #[test]
    fn negative_steps_walk_backwards_as_in_numpy() {
        // Expected lists are Python's `list(range(7))[index]`.
        assert_eq!(numpy_positions("::-1", 7), [6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(numpy_positions("::-2", 7), [6, 4, 2, 0]);
        assert_eq!(numpy_positions("5:1:-1", 7), [5, 4, 3, 2]);
        assert_eq!(numpy_positions("5:1:-3", 7), [5, 2]);
        assert_eq!(numpy_positions("-2::-3", 7), [5, 2]);
        assert_eq!(numpy_positions(":-3:-1", 7), [6, 5]);
        assert_eq!(numpy_positions("100:-100:-4", 7), [6, 2]);
        assert_eq!(numpy_positions("1:5:-1", 7), Vec::<usize>::new());
        assert_eq!(numpy_positions("2:5:2", 7), [2, 4]);
        assert_eq!(numpy_positions("5:2", 7), Vec::<usize>::new());
        assert_eq!(region(":, ::-2", &[2, 7]).unwrap().shape(), [2, 4]);
    }

    #[test]
    fn a_write_through_a_reversed_index_lands_in_numpy_order() {
        let device = burn::tensor::Device::default();
        let whole = SiteValue::from_floats(vec![0.0; 6], &[1, 6], &device).unwrap();
        let part = SiteValue::from_floats(vec![1.0, 2.0, 3.0], &[1, 3], &device).unwrap();
        // numpy: a = zeros(6); a[4::-2] = [1, 2, 3] gives [3, 0, 2, 0, 1, 0].
        let written = region(":, 4::-2", &[1, 6])
            .unwrap()
            .write(whole, part)
            .unwrap();
        let data = written
            .to_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap();
        assert_eq!(data, [3.0, 0.0, 2.0, 0.0, 1.0, 0.0]);
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
        for bad in ["", "x", "1:2:0", "1:2:3:4", "..., ...", "0,,1"] {
            assert!(Index::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn indices_print_canonically() {
        let index = Index::parse(" :,-1 , 2:, ::2, ...").unwrap();
        assert_eq!(index.to_string(), "[:, -1, 2:, ::2, ...]");
        assert_eq!(Index::parse("5:1:-2").unwrap().to_string(), "[5:1:-2]");
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
