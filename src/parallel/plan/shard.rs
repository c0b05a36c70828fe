//! What each sharding mode ([`Shard`], ZeRO's stages as `DataParallel` implements them) keeps
//! on a device and what it sends: the planner's memory and gradient-sync terms for a
//! data-parallel degree above one.
use super::Link;
use crate::parallel::Shard;

/// The modes the search tries for a data-parallel degree of `data`: all four when there are
/// replicas to shard over, only [`Shard::None`] otherwise. Least sharded first, so that among
/// layouts predicted equally fast the search keeps the simpler one.
pub(super) fn modes(data: usize) -> &'static [Shard] {
    if data > 1 {
        &Shard::ALL
    } else {
        &[Shard::None]
    }
}

/// The gradient bucket `DataParallel` reduces at once by default (DDP's 25 MiB), and
/// ZeRO-3's unit of parameters gathered at once.
pub const DEFAULT_BUCKET_BYTES: u64 = 25 << 20;

/// The smaller buckets the search tries for a layout that does not fit with the default:
/// less held at once (gradients in flight, ZeRO-3's gathered units), more messages.
pub const SMALL_BUCKETS: [u64; 3] = [4 << 20, 1 << 20, 256 << 10];

/// Peak bytes of training state on one device holding `params` bytes of f32 parameters
/// (its stage's, split by the tensor degree) with `states` optimizer state tensors per
/// parameter, sharded `shard` over `data` replicas:
///
/// - none: parameters, gradients and optimizer state whole, `(2 + states) P`;
/// - optimizer (ZeRO-1): the state of the parameters a device owns, `2P + states P / d`;
/// - grads (ZeRO-2): full parameters, the device's shard of gradients, optimizer state and
///   the parameter pieces it updates, `P + (g + states) P / d`, plus the full gradients of
///   the buckets backward has filled and not yet reduce-scattered (two buckets, or the whole
///   model's when smaller);
/// - full (ZeRO-3): the shards, `(1 + g + states) P / d`, plus the units of full parameters
///   gathered at a time (the one computing, the one prefetched and the gathered flat values:
///   three buckets, or the whole model when smaller) and the gradients in flight.
///
/// A bucket is `bucket` bytes, or the largest parameter where that is larger (a parameter
/// is never split between buckets).
///
/// `g` is the gradient shards' share of f32's bytes (`grad_bytes / 4`: 1, or 1/2 for bf16 and
/// f16 shards, `DataParallelConfig::grad_dtype`).
///
/// `DataParallel` holds the flat buffer of the bucket being reduced (one bucket, or the whole
/// model's gradients when smaller) in every mode: with replicas (`d > 1`), and on one device
/// accumulating micro-batches (`accumulates`), which it runs too. On a small GPT over two CPU
/// devices (`tandem bench --bench memory --model gpt`) the allocators' peaks are about `5P`
/// in every mode, activations included: sharding lowers what is held between steps far more
/// than the peak at this size.
///
/// On a grid (tensor or pipeline degree above 1) the data axis reduces after backward
/// ([`DataGrid::shard`](crate::parallel::DataGrid::shard)): every sharding mode holds the full
/// parameters and gradients through the step, and only the optimizer state (with the pieces
/// it updates) is divided, ZeRO-1's `2P + states P / d`.
pub(super) fn state_bytes(
    params: u64,
    states: u64,
    grad_bytes: u64,
    shard: Shard,
    (data, accumulates): (usize, bool),
    bucket: u64,
    grid: bool,
) -> u64 {
    let shard = if grid && shard != Shard::None { Shard::Optimizer } else { shard };
    // Saturating: a size past a u64 is no device's, never a wrapped small one.
    let (add, mul) = (u64::saturating_add, u64::saturating_mul);
    let d = data.max(1) as u64;
    let grads = mul(params / 4, grad_bytes);
    let unit = bucket;
    let bucket = if d > 1 || accumulates { params.min(unit) } else { 0 };
    let in_flight = params.min(mul(2, unit));
    let state = mul(states, params);
    add(
        bucket,
        match shard {
            Shard::None => mul(params, add(2, states)),
            Shard::Optimizer => add(mul(2, params), state.div_ceil(d)),
            Shard::Grads => add(add(params, add(grads, state).div_ceil(d)), in_flight),
            Shard::Full => add(add(add(params, add(grads, state)).div_ceil(d), params.min(mul(3, unit))), in_flight),
        },
    )
}

/// Seconds of one step's gradient synchronisation of `params` bytes over `data` replicas
/// on `link`, not overlapped with backward (an upper bound, as for plain data parallelism):
/// none, an all-reduce; optimizer, the all-reduce and then each owner's broadcast of the
/// parameters it updated (an all-gather's volume); grads, a reduce-scatter of the gradients
/// and an all-gather of the updated pieces (what an all-reduce moves); full, every unit's
/// all-gather in forward and again in backward, and the reduce-scatter of the gradients.
///
/// Each of the `ceil(params / bucket)` buckets is its own collective: the bandwidth term is the
/// whole model's, the latency is paid per bucket.
///
/// On a grid every mode reduce-scatters and all-gathers (ZeRO-1 as ZeRO-2), ZeRO-3 gathering
/// once more before forward.
pub(super) fn sync_s(link: &Link, params: f64, shard: Shard, data: usize, bucket: u64, grid: bool) -> f64 {
    let shard = if grid && shard == Shard::Optimizer { Shard::Grads } else { shard };
    let buckets = (params / bucket.max(1) as f64).ceil().max(1.0);
    buckets * sync_one(link, params / buckets, shard, data)
}

/// [`sync_s`] of one bucket of `params` bytes.
fn sync_one(link: &Link, params: f64, shard: Shard, data: usize) -> f64 {
    match shard {
        Shard::None => link.all_reduce_s(params, data),
        Shard::Optimizer => link.all_reduce_s(params, data) + link.all_gather_s(params, data),
        Shard::Grads => link.reduce_scatter_s(params, data) + link.all_gather_s(params, data),
        Shard::Full => link.reduce_scatter_s(params, data) + 2.0 * link.all_gather_s(params, data),
    }
}
