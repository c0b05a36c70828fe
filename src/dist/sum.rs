//! The host sum that MPI's all-reduce and the host-staged collectives share: a fixed pairwise
//! tree over the parts' index, so that a sum is the same bits on every rank and in every
//! process layout.
use crate::{Error, Result};

/// The elementwise sum of equally long vectors in a fixed pairwise tree over their index:
/// each level adds neighbours (0+1, 2+3, ...) and carries an odd last one up unchanged. The
/// rounding therefore depends only on the number of parts and their order, never on timing.
pub fn tree_sum(mut parts: Vec<Vec<f32>>) -> Result<Vec<f32>> {
    let len = parts.first().map(Vec::len).ok_or_else(|| Error::invalid("tree_sum", "nothing to sum"))?;
    if parts.iter().any(|p| p.len() != len) {
        let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
        return Err(Error::shape("tree_sum", format!("parts of different lengths {lens:?}")));
    }
    while parts.len() > 1 {
        let mut next = Vec::with_capacity(parts.len().div_ceil(2));
        let mut it = parts.into_iter();
        while let Some(mut a) = it.next() {
            if let Some(b) = it.next() {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
            }
            next.push(a);
        }
        parts = next;
    }
    Ok(parts.pop().expect("at least one part"))
}
