//! What every collective tells the other ranks before it moves any data: which operation, the
//! element type, the length and the root (or chunk size). MPI trusts each rank's own count, so
//! ranks that disagree would read or write past each other's buffers (heap corruption) or wait
//! forever; with the headers compared first, every rank returns the same clear error instead,
//! and since the headers have one fixed size, the group stays usable after it.
// Without the `mpi` feature a group is one process, which has nothing to agree with.
#![cfg_attr(not(feature = "mpi"), allow(dead_code))]
use crate::{Error, Result};

/// Words of a [`Header`] on the wire.
pub(super) const WORDS: usize = 4;

/// A collective's kind, as its header carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Barrier = 1,
    Broadcast = 2,
    /// `MPI_Allreduce` ([`super::Order::Mpi`]).
    AllReduce = 3,
    /// The rank-order sum ([`super::Order::Ranks`]).
    AllReduceRanks = 4,
    /// An all-gather whose lengths may differ by rank.
    AllGather = 5,
    /// An all-reduce moved as many calls of one chunk size, agreed once (`extra`: the chunk).
    AllReduceChunks = 6,
    AllReduceRanksChunks = 7,
    /// A collective of a device communicator that trusts each rank's count (NCCL's).
    Device = 8,
}

const OPS: [Op; 8] =
    [Op::Barrier, Op::Broadcast, Op::AllReduce, Op::AllReduceRanks, Op::AllGather, Op::AllReduceChunks, Op::AllReduceRanksChunks, Op::Device];

/// A device communicator's collective that the ranks agree on through the group first
/// ([`super::Group::agree_device`]): in the header's element word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceOp {
    AllReduce = 16,
    Broadcast = 17,
    ReduceScatter = 18,
}

/// The element type of a collective's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Elem {
    None = 0,
    F32 = 1,
    U64 = 2,
}

/// One rank's description of the collective it is about to run: `[op, element type, length,
/// extra]`, where `extra` is the root of a broadcast or the chunk of a chunked all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header(pub [u64; WORDS]);

impl Header {
    pub fn new(op: Op, elem: Elem, len: usize, extra: usize) -> Header {
        Header([op as u64, elem as u64, len as u64, extra as u64])
    }
    pub fn device(op: DeviceOp, len: usize, extra: usize) -> Header {
        Header([Op::Device as u64, op as u64, len as u64, extra as u64])
    }
    pub fn len(&self) -> u64 {
        self.0[2]
    }

    /// What the header says, as a message names it: `broadcast of 100 f32 values from rank 0`.
    pub fn describe(&self) -> String {
        let [op, elem, len, extra] = self.0;
        let values = match elem {
            0 => String::new(),
            1 => format!(" of {len} f32 values"),
            2 => format!(" of {len} u64 values"),
            16..=18 => format!(" of {len} f32 values"),
            e => format!(" of {len} values of unknown type {e}"),
        };
        match OPS.iter().find(|o| **o as u64 == op) {
            Some(Op::Barrier) => "barrier".into(),
            Some(Op::Broadcast) => format!("broadcast{values} from rank {extra}"),
            Some(Op::AllReduce) => format!("all_reduce{values}"),
            Some(Op::AllReduceRanks) => format!("all_reduce{values} in rank order"),
            Some(Op::AllGather) => format!("all_gather{values}"),
            Some(Op::AllReduceChunks) => format!("all_reduce{values} in chunks of {extra}"),
            Some(Op::AllReduceRanksChunks) => format!("all_reduce{values} in rank order, in chunks of {extra}"),
            Some(Op::Device) => match elem {
                16 => format!("device all_reduce{values}"),
                17 => format!("device broadcast{values} from device {extra}"),
                _ => format!("device reduce_scatter{values} of {extra} rows"),
            },
            None => format!("an unknown collective (code {op})"),
        }
    }
}

/// Checks the headers of every rank (`all`, in rank order; `rank` is this one): the same
/// operation and element type everywhere and, unless `lengths_may_differ`, the same length and
/// extra. The error is the same on every rank, which all see the same headers; it names
/// `op`, what each rank asked for, and the ranks that differ from rank 0.
pub(super) fn check(op: &'static str, all: &[Header], rank: usize, lengths_may_differ: bool) -> Result<()> {
    let key = |h: &Header| if lengths_may_differ { [h.0[0], h.0[1], 0, 0] } else { h.0 };
    let Some(first) = all.first() else { return Ok(()) };
    let differ: Vec<usize> = (1..all.len()).filter(|&r| key(&all[r]) != key(first)).collect();
    if differ.is_empty() {
        return Ok(());
    }
    // Ranks that say the same are listed together, so a message stays short for many ranks.
    let mut said: Vec<(String, Vec<usize>)> = Vec::new();
    for (r, h) in all.iter().enumerate() {
        let d = h.describe();
        match said.iter_mut().find(|(s, _)| *s == d) {
            Some((_, ranks)) => ranks.push(r),
            None => said.push((d, vec![r])),
        }
    }
    const MOST: usize = 8;
    let mut parts: Vec<String> = said.iter().take(MOST).map(|(d, ranks)| format!("{} {d}", rank_list(ranks))).collect();
    if said.len() > MOST {
        parts.push(format!("and {} other kinds", said.len() - MOST));
    }
    Err(Error::shape(
        op,
        format!(
            "the ranks disagree on the collective: {}; {} from rank 0, so no data was moved (this is rank {rank})",
            parts.join(", "),
            match differ.as_slice() {
                [r] => format!("rank {r} differs"),
                _ => format!("{} differ", rank_list(&differ)),
            }
        ),
    ))
}

/// `rank 3` or `ranks 0, 2, 5`, at most eight of them named: how a message about a job's
/// processes names some of them.
///
/// ```
/// assert_eq!(tandem::dist::rank_list(&[3]), "rank 3");
/// assert_eq!(tandem::dist::rank_list(&[0, 2, 5]), "ranks 0, 2, 5");
/// ```
pub fn rank_list(ranks: &[usize]) -> String {
    const MOST: usize = 8;
    match ranks {
        [r] => format!("rank {r}"),
        _ => {
            let mut s = ranks.iter().take(MOST).map(usize::to_string).collect::<Vec<_>>().join(", ");
            if ranks.len() > MOST {
                s.push_str(&format!(" and {} more", ranks.len() - MOST));
            }
            format!("ranks {s}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_that_differs_is_named_with_every_rank() {
        let h = |len| Header::new(Op::Broadcast, Elem::F32, len, 0);
        assert!(check("Group::broadcast", &[h(4), h(4), h(4)], 0, false).is_ok());
        let text = check("Group::broadcast", &[h(4), h(5), h(4)], 2, false).unwrap_err().to_string();
        assert!(
            text.contains("Group::broadcast")
                && text.contains("ranks 0, 2 broadcast of 4 f32 values from rank 0")
                && text.contains("rank 1 broadcast of 5 f32"),
            "{text}"
        );
        assert!(text.contains("rank 1 differs from rank 0") && text.contains("this is rank 2"), "{text}");
        // All-gathers may differ in length, never in operation or element type.
        let g = |elem, len| Header::new(Op::AllGather, elem, len, 0);
        assert!(check("Group::all_gather", &[g(Elem::F32, 1), g(Elem::F32, 9)], 0, true).is_ok());
        assert!(check("Group::all_gather", &[g(Elem::F32, 1), g(Elem::U64, 1)], 0, true).is_err());
        let mixed = check("Group::barrier", &[Header::new(Op::Barrier, Elem::None, 0, 0), Header::new(Op::AllReduce, Elem::F32, 3, 0)], 0, false)
            .unwrap_err()
            .to_string();
        assert!(mixed.contains("rank 0 barrier, rank 1 all_reduce of 3 f32 values"), "{mixed}");
        assert_eq!(rank_list(&(0..10).collect::<Vec<_>>()), "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 2 more");
    }
}
