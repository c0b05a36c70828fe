//! Named tensors and raw bytes across the ranks of a [`Group`]: checkpoints of state that
//! strategies split over processes (pipeline stages, ZeRO-1 optimizer shards), and the NCCL
//! unique id that rank 0 hands to the others.
use super::Group;
use crate::{Device, Error, Result, Tensor};

/// Names and shapes as `u64`s, entry after entry: `[name bytes, bytes..., rank, dims...]`.
fn encode(entries: &[(String, Tensor)]) -> Vec<u64> {
    let mut out = Vec::new();
    for (name, t) in entries {
        out.push(name.len() as u64);
        out.extend(name.bytes().map(u64::from));
        out.push(t.rank() as u64);
        out.extend(t.dims().iter().map(|&d| d as u64));
    }
    out
}

/// The names and shapes `encode` wrote on rank `rank`.
fn decode(mut h: &[u64], rank: usize) -> Result<Vec<(String, Vec<usize>)>> {
    let bad = || Error::shape("Group::all_gather_named", format!("rank {rank} sent a header that is not names and shapes"));
    let mut take = |n: usize| -> Result<Vec<u64>> {
        let (head, rest) = h.split_at_checked(n).ok_or_else(bad)?;
        h = rest;
        Ok(head.to_vec())
    };
    let mut out = Vec::new();
    while let Ok(len) = take(1) {
        let bytes: Vec<u8> = take(len[0] as usize)?.into_iter().map(|b| u8::try_from(b).map_err(|_| bad())).collect::<Result<_>>()?;
        let name = String::from_utf8(bytes).map_err(|_| bad())?;
        let rank_len = take(1)?[0] as usize;
        let dims = take(rank_len)?.into_iter().map(|d| d as usize).collect();
        out.push((name, dims));
    }
    Ok(out)
}

impl Group {
    /// Every rank's `local` named tensors, on every rank, in rank order: this rank's as they
    /// are, the other ranks' on the CPU (a model split over processes because it does not fit
    /// one device must not land on one device whole). Collective: every rank calls it.
    pub fn all_gather_named(&self, local: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let headers = self.all_gather_u64(&encode(local))?;
        let mut values = Vec::new();
        for (_, t) in local {
            values.extend(t.to_vec()?);
        }
        let all = self.all_gather(&values)?;
        let cpu = Device::cpu();
        let mut out = Vec::new();
        for (rank, (header, flat)) in headers.iter().zip(all).enumerate() {
            if rank == self.rank() {
                out.extend(local.iter().cloned());
                continue;
            }
            let mut at = 0usize;
            for (name, dims) in decode(header, rank)? {
                let short =
                    || Error::shape("Group::all_gather_named", format!("rank {rank} sent fewer values than its shapes need ({name}: {dims:?})"));
                let n = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(short)?;
                let part = at.checked_add(n).and_then(|end| flat.get(at..end)).ok_or_else(short)?;
                out.push((name, Tensor::from_vec(part.to_vec(), dims, &cpu)?));
                at += n;
            }
        }
        Ok(out)
    }

    /// The names every rank passes, on every rank, in rank order. Collective.
    pub fn all_gather_names(&self, local: &[String]) -> Result<Vec<String>> {
        let mut h = Vec::new();
        for name in local {
            h.push(name.len() as u64);
            h.extend(name.bytes().map(u64::from));
            h.push(0);
        }
        let all = self.all_gather_u64(&h)?;
        let mut out = Vec::new();
        for (rank, header) in all.iter().enumerate() {
            out.extend(decode(header, rank)?.into_iter().map(|(n, _)| n));
        }
        Ok(out)
    }

    /// Overwrites `bytes` on every rank with rank `root`'s (all ranks pass the same length, else
    /// all get an error, as from [`Group::broadcast`]). Each byte travels as an `f32`, which holds it exactly: for small messages such as an
    /// NCCL unique id.
    pub fn broadcast_bytes(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        let mut values: Vec<f32> = bytes.iter().map(|&b| f32::from(b)).collect();
        self.broadcast(&mut values, root)?;
        for (b, v) in bytes.iter_mut().zip(values) {
            *b = v as u8;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_shapes_survive_the_header() {
        let dev = Device::cpu();
        let entries = vec![("conv.weight".to_string(), Tensor::zeros([2, 3], &dev).unwrap()), ("b".to_string(), Tensor::zeros([4], &dev).unwrap())];
        let back = decode(&encode(&entries), 0).unwrap();
        assert_eq!(back, vec![("conv.weight".to_string(), vec![2, 3]), ("b".to_string(), vec![4])]);
        assert!(decode(&[5, 104], 1).is_err());
        let g = Group::alone();
        let gathered = g.all_gather_named(&entries).unwrap();
        assert_eq!(gathered.len(), 2);
        assert_eq!(g.all_gather_names(&["x".into(), "yz".into()]).unwrap(), vec!["x".to_string(), "yz".to_string()]);
        let mut id = [7u8, 255, 0];
        g.broadcast_bytes(&mut id, 0).unwrap();
        assert_eq!(id, [7, 255, 0]);
    }
}
