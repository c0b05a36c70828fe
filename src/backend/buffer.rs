//! `Buffer`: device memory owned by one backend, shared by its clones, with what is known of its
//! values (label bounds, host copies of I32 values) and the hook that refills it once released.
use super::released;
use crate::DType;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// Device memory owned by one backend. Cheap to clone (shared); the backend's own type inside
/// returns itself to that backend's pool when the last clone drops.
#[derive(Clone)]
pub struct Buffer {
    raw: Arc<Shared<dyn Any + Send + Sync>>,
    len: usize,
    dtype: DType,
}

/// What every clone of a buffer shares: the backend's memory and what is known of its values.
struct Shared<T: ?Sized> {
    /// For I32 buffers, bounds that every value lies within, when known without reading the
    /// device (labels uploaded from the host); cleared by every op that writes I32 values.
    label_bound: Mutex<Option<(i32, i32)>>,
    /// For I32 buffers uploaded from the host, those values, so that the embedding gradient
    /// plans its sums without reading the device; cleared with `label_bound`.
    host_i32: Mutex<Option<Arc<[i32]>>>,
    /// What gives a released buffer its values back on first use (see [`Buffer::refill`]).
    refill: Mutex<Option<Refill>>,
    raw: T,
}

/// A hook that gives a released buffer memory and values again, run by the backend on the
/// thread of the op that found it released: ZeRO-3's all-gather of the unit of parameters the
/// buffer belongs to ([`crate::parallel::DataParallel`]), or a deferred tensor's host values
/// ([`crate::tensor::build_deferred`]). It gets the buffer, and must not release any buffer
/// itself, since the op that called it may already hold another one's memory.
pub(crate) type Refill = Arc<dyn Fn(&Buffer) -> crate::Result<()> + Send + Sync>;

impl Buffer {
    pub fn new<T: Any + Send + Sync>(raw: T, len: usize, dtype: DType) -> Self {
        Buffer { raw: Arc::new(Shared { label_bound: Mutex::new(None), host_i32: Mutex::new(None), refill: Mutex::new(None), raw }), len, dtype }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Whether both handles share one allocation (the same buffer, not equal contents).
    pub fn same_as(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.raw, &other.raw)
    }
    /// A key equal for every clone of this buffer and different from every other live buffer.
    pub fn key(&self) -> usize {
        Arc::as_ptr(&self.raw) as *const u8 as usize
    }
    /// The backend's own buffer type; `None` means the buffer belongs to another backend.
    pub fn downcast<T: Any>(&self) -> Option<&T> {
        self.raw.raw.downcast_ref::<T>()
    }
    /// `(min, max)` bounds of the values, if known (see `Tensor::from_labels`).
    pub fn label_bound(&self) -> Option<(i32, i32)> {
        *self.raw.label_bound.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn set_label_bound(&self, bound: Option<(i32, i32)>) {
        *self.raw.label_bound.lock().unwrap_or_else(|e| e.into_inner()) = bound;
    }
    /// The I32 values as uploaded from the host, if they are still the buffer's.
    pub fn host_i32(&self) -> Option<Arc<[i32]>> {
        self.raw.host_i32.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub(crate) fn set_host_i32(&self, values: Option<Arc<[i32]>>) {
        *self.raw.host_i32.lock().unwrap_or_else(|e| e.into_inner()) = values;
    }
    /// Sets (or, with `None`, removes) the hook that refills this buffer once released.
    pub(crate) fn set_refill(&self, hook: Option<Refill>) {
        *self.raw.refill.lock().unwrap_or_else(|e| e.into_inner()) = hook;
    }
    /// Whether a refill hook waits on this buffer.
    pub(crate) fn has_refill(&self) -> bool {
        self.raw.refill.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
    /// What a backend calls on finding this buffer released (by [`Backend::release`]) when op
    /// `op` needs it: runs the refill hook, which restores it, or fails with the released-buffer
    /// error where there is none. The backend checks again afterwards.
    pub(crate) fn refill(&self, op: &'static str, device: &str) -> crate::Result<()> {
        // Cloned out, so that the hook runs without this lock (it may take the buffer's others).
        let hook = self.raw.refill.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match hook {
            Some(f) => f(self),
            None => Err(released(op, device, self.len)),
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} x {:?})", self.len, self.dtype)
    }
}
