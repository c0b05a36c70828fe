//! What a run under several processes agrees on: rank 0's checkpoint bytes, and the first stop
//! asked on any rank. [`share_bytes`] and [`gather_bytes`] move any bytes (a checkpoint file, a
//! run configuration) across a [`Group`]'s ranks, for a program that checks or restores its own
//! state under `mpirun`/`srun`; alone (a group of one) they cost nothing.
//!
//! ```
//! use tandem::dist::Group;
//! use tandem::train::ranks::{gather_bytes, share_bytes};
//! # fn main() -> tandem::Result<()> {
//! let alone = Group::alone();
//! assert_eq!(share_bytes(&alone, Some(b"ckpt".to_vec()))?, b"ckpt");
//! assert_eq!(gather_bytes(&alone, b"config")?, vec![b"config".to_vec()]);
//! # Ok(()) }
//! ```
use crate::dist::Group;
use crate::{Error, Result};

/// Rank 0's `bytes` on every rank (the others pass `None`), bit for bit. Collective: every
/// rank of `group` calls it.
pub fn share_bytes(group: &Group, bytes: Option<Vec<u8>>) -> Result<Vec<u8>> {
    if group.size() == 1 {
        return Ok(bytes.unwrap_or_default());
    }
    let mine = bytes.filter(|_| group.rank() == 0).unwrap_or_default();
    Ok(gather_bytes(group, &mine)?.swap_remove(0))
}

/// Every rank's `bytes`, on every rank, in rank order (the ranks may send different lengths).
/// Collective: every rank of `group` calls it.
pub fn gather_bytes(group: &Group, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut words: Vec<u64> = vec![bytes.len() as u64];
    words.extend(bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    }));
    let all = group.all_gather_u64(&words)?;
    all.into_iter()
        .enumerate()
        .map(|(rank, words)| {
            let Some((&len, words)) = words.split_first() else { return Err(Error::Msg(format!("rank {rank} sent no length"))) };
            let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            out.truncate(len as usize);
            Ok(out)
        })
        .collect()
}

/// The stop reason any rank has, the same on every rank (the lowest rank's), so that all stop
/// after the same step: a signal reaches the ranks at different moments, if at all.
pub(crate) fn agree_stop(group: &Group, local: Option<usize>) -> Result<Option<usize>> {
    if group.size() == 1 {
        return Ok(local);
    }
    let all = group.all_gather_u64(&[local.unwrap_or(0) as u64])?;
    Ok(all.iter().filter_map(|c| c.first().copied()).find(|&c| c != 0).map(|c| c as usize))
}
