//! A hint to the CPU to start loading memory that is about to be read.
//!
//! The keyed state of millions of keys does not fit the caches: looking a key up misses
//! the cache two or three times (its hash bucket, its slot). The pipeline knows which
//! keys come next, so it asks for their memory a few events ahead and the misses of
//! several events overlap instead of following each other.
//!
//! The one module besides `json/simd.rs` that allows `unsafe`: `_mm_prefetch` is a
//! `#[target_feature(enable = "sse")]` function, which safe code may only call from a
//! function with the same feature.
#![allow(unsafe_code)]

/// Hints that the cache line holding `*value` will be read soon. Never faults, never
/// changes anything observable; a no-op on CPUs without the instruction.
#[inline(always)]
pub fn prefetch<T: ?Sized>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        let p: *const T = value;
        // SAFETY: `_mm_prefetch` requires SSE, which every x86_64 CPU has (it is part of
        // the x86_64 baseline, so it is enabled in every build for this target). The
        // instruction only hints the cache: it does not dereference the pointer in the
        // sense of the memory model, cannot fault, and `p` comes from a live reference
        // anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
