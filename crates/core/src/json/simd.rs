//! The CPU-specific parts of the structural pass ([`super::fast`]): classifying 64-byte
//! blocks (one bit per byte for quotes, backslashes, JSON whitespace, structural
//! characters, control characters and non-ASCII bytes), the prefix XOR of the quote bits
//! and the writing of token positions, each with AVX2 and with AVX-512, and a copy of
//! stage 1 compiled for each level.
//!
//! This is the one module of the workspace that uses `unsafe`: `std::arch` intrinsics
//! behind `#[target_feature]`, called only at a [`Level`] that run-time feature detection
//! (`is_x86_feature_detected!`) found on this CPU. Each level computes exactly what the
//! portable Rust versions compute; the tests compare them on every byte value and on
//! random blocks and masks. In production a CPU without AVX2 (or not x86-64) does not use
//! the structural pass at all: the byte-at-a-time scanner of [`super`] runs instead.
#![allow(unsafe_code)]

use super::fast::{self, Stage1};

/// The classification of one block: bit `i` describes byte `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Masks {
    /// `"`
    pub quote: u64,
    /// `\`
    pub backslash: u64,
    /// JSON whitespace: space, `\t`, `\n`, `\r` (exact).
    pub ws: u64,
    /// `{`, `}`, `[`, `]`, `:`, `,`, and a few other bytes (`b | 0x20` is one of `{}:,`,
    /// such as `\x0c` or `;`): a superset, so callers look at the byte itself.
    pub op: u64,
    /// Bytes below 0x20.
    pub ctrl: u64,
    /// Bytes of 0x80 and above.
    pub high: u64,
}

/// `WS_TABLE[b & 15] == b` exactly for the four JSON whitespace bytes (and `b < 0x80`).
const WS_TABLE: [u8; 16] = [
    b' ', 100, 100, 100, 17, 100, 113, 2, 100, b'\t', b'\n', 112, 100, b'\r', 100, 100,
];
/// With `c = b | 0x20`: `OP_TABLE[c & 15] == c` for `:`, `{`, `,`, `}` and so for `[`, `]`.
const OP_TABLE: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, b':', b'{', b',', b'}', 0, 0];

/// Which implementation classifies blocks on this CPU. Obtain one only from
/// [`Level::detect`] or (tests) `Level::all_supported`: a SIMD variant promises that the
/// CPU has its features, and the `unsafe` calls of this module rely on that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// Plain Rust, one byte at a time: the reference for the others in tests.
    Portable,
    /// AVX2 (two 32-byte halves).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 BW (one 64-byte register).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Level {
    /// The best level this CPU supports.
    pub(crate) fn detect() -> Level {
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx512() {
                return Level::Avx512;
            }
            if has_avx2() {
                return Level::Avx2;
            }
        }
        Level::Portable
    }

    /// Every level this CPU supports, the portable one first (for tests).
    #[cfg(test)]
    pub(crate) fn all_supported() -> Vec<Level> {
        #[allow(unused_mut)]
        let mut v = vec![Level::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                v.push(Level::Avx2);
            }
            if has_avx512() {
                v.push(Level::Avx512);
            }
        }
        v
    }

    /// Stage 1 of the structural pass ([`fast::stage1`]) over `s` at this level.
    pub(crate) fn stage1(self, s: &[u8], idx: &mut Vec<u32>) -> Option<Stage1> {
        match self {
            Level::Portable => fast::stage1(s, idx, portable, fast::prefix_xor, fast::flatten),
            // SAFETY: `Level::Avx2` is only constructed by `detect` / `all_supported` after
            // `is_x86_feature_detected!` found AVX2, BMI1, POPCNT and PCLMULQDQ on this CPU.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { stage1_avx2(s, idx) },
            // SAFETY: `Level::Avx512` is only constructed after `is_x86_feature_detected!`
            // found AVX-512 F and BW, AVX2, BMI1, POPCNT and PCLMULQDQ.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { stage1_avx512(s, idx) },
        }
    }

    /// Classifies `block`.
    #[cfg(test)]
    pub(crate) fn classify(self, block: &[u8; 64]) -> Masks {
        match self {
            Level::Portable => portable(block),
            // SAFETY: `Level::Avx2` is only constructed by `detect` / `all_supported` after
            // `has_avx2` found AVX2 on this CPU.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { avx2(block) },
            // SAFETY: `Level::Avx512` is only constructed after `has_avx512` found AVX-512
            // F and BW on this CPU.
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { avx512(block) },
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("bmi1")
        && std::arch::is_x86_feature_detected!("popcnt")
        && std::arch::is_x86_feature_detected!("pclmulqdq")
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// Stage 1 compiled for AVX2, with the classification and the writing of positions
/// inlined.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,popcnt,pclmulqdq")]
fn stage1_avx2(s: &[u8], idx: &mut Vec<u32>) -> Option<Stage1> {
    fast::stage1(
        s,
        idx,
        |block| avx2(block),
        |x| clmul_prefix_xor(x),
        |bits, base, out| avx2_flatten(bits, base, out),
    )
}

/// `POSITIONS[b]`: the indices of the set bits of the byte `b`, in order (then zeros).
#[cfg(target_arch = "x86_64")]
static POSITIONS: [[u8; 8]; 256] = {
    let mut t = [[0u8; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let (mut bit, mut k) = (0, 0);
        while bit < 8 {
            if b & (1 << bit) != 0 {
                t[b][k] = bit as u8;
                k += 1;
            }
            bit += 1;
        }
        b += 1;
    }
    t
};

/// [`fast::flatten`] without a loop over the bits: eight bits at a time, their indices
/// come from a table and are widened and stored as eight `u32`s at once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
#[inline]
fn avx2_flatten(bits: u64, base: u32, out: &mut [u32; 64]) -> usize {
    use std::arch::x86_64::*;
    let mut k = 0;
    for eighth in 0..8u32 {
        let b = (bits >> (8 * eighth)) as u8;
        let positions = u64::from_le_bytes(POSITIONS[usize::from(b)]);
        let first = _mm256_set1_epi32((base + 8 * eighth) as i32);
        let v = _mm256_add_epi32(
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(positions as i64)),
            first,
        );
        // `k` counts the bits below this eighth, at most 56: the slice is in bounds.
        let Some(dst) = out.get_mut(k..k + 8) else {
            break;
        };
        // SAFETY: `dst` is 8 writable `u32`s, the 32 bytes the unaligned store writes.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) };
        k += b.count_ones() as usize;
    }
    k
}

/// Stage 1 compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,bmi1,popcnt,pclmulqdq")]
fn stage1_avx512(s: &[u8], idx: &mut Vec<u32>) -> Option<Stage1> {
    fast::stage1(
        s,
        idx,
        |block| avx512(block),
        |x| clmul_prefix_xor(x),
        |bits, base, out| avx512_flatten(bits, base, out),
    )
}

/// [`fast::flatten`] without a loop over the bits: sixteen bits at a time, the indices
/// of the set ones are compressed into a vector and stored.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
#[inline]
fn avx512_flatten(bits: u64, base: u32, out: &mut [u32; 64]) -> usize {
    use std::arch::x86_64::*;
    let iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let mut k = 0;
    for quarter in 0..4u32 {
        let m = (bits >> (16 * quarter)) as u16;
        let first = _mm512_set1_epi32((base + 16 * quarter) as i32);
        let v = _mm512_add_epi32(_mm512_maskz_compress_epi32(m, iota), first);
        // `k` counts the bits below this quarter, at most 48: the slice is in bounds.
        let Some(dst) = out.get_mut(k..k + 16) else {
            break;
        };
        // SAFETY: `dst` is 16 writable `u32`s, the 64 bytes the unaligned store writes.
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), v) };
        k += m.count_ones() as usize;
    }
    k
}

/// [`fast::prefix_xor`] as one carry-less multiplication by all ones (the compiler
/// cannot see through it and turn the masks into vectors of booleans).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq")]
#[inline]
fn clmul_prefix_xor(x: u64) -> u64 {
    use std::arch::x86_64::*;
    let product = _mm_clmulepi64_si128(_mm_set_epi64x(0, x as i64), _mm_set1_epi8(-1), 0);
    _mm_cvtsi128_si64(product) as u64
}

/// The portable classification; the reference for the SIMD versions.
pub(crate) fn portable(block: &[u8; 64]) -> Masks {
    let mut m = Masks::default();
    for (i, &b) in block.iter().enumerate() {
        let bit = 1u64 << i;
        let c = b | 0x20;
        if b == b'"' {
            m.quote |= bit;
        }
        if b == b'\\' {
            m.backslash |= bit;
        }
        if b < 0x80 && WS_TABLE[usize::from(b & 15)] == b {
            m.ws |= bit;
        }
        if c < 0x80 && OP_TABLE[usize::from(c & 15)] == c {
            m.op |= bit;
        }
        if b < 0x20 {
            m.ctrl |= bit;
        }
        if b >= 0x80 {
            m.high |= bit;
        }
    }
    m
}

/// `x`, through an empty `asm!` block that the optimiser cannot see into. Without it,
/// LLVM treats a mask built from `movemask` results as a vector of 64 one-bit lanes,
/// and the shifts of stage 1 become shuffles of those lanes that AVX2 code performs one
/// bit at a time (five times slower in all).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn opaque(mut x: u64) -> u64 {
    // SAFETY: the assembly is empty: it reads and writes nothing but the register that
    // holds `x`, which it leaves as it is.
    unsafe {
        std::arch::asm!("/* {0} */", inout(reg) x, options(pure, nomem, nostack, preserves_flags));
    }
    x
}

/// One 32-byte half of a block for [`avx2`]: quote, backslash, ws, op, ctrl, high.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn avx2_half(
    v: std::arch::x86_64::__m256i,
    ws_table: std::arch::x86_64::__m256i,
    op_table: std::arch::x86_64::__m256i,
) -> [u32; 6] {
    use std::arch::x86_64::*;
    let c = _mm256_or_si256(v, _mm256_set1_epi8(0x20));
    // b <= 0x1f, unsigned: max(b, 0x1f) == 0x1f.
    let ctrl = _mm256_cmpeq_epi8(
        _mm256_max_epu8(v, _mm256_set1_epi8(0x1f)),
        _mm256_set1_epi8(0x1f),
    );
    [
        _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8))) as u32,
        _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8))) as u32,
        _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_shuffle_epi8(ws_table, v))) as u32,
        _mm256_movemask_epi8(_mm256_cmpeq_epi8(c, _mm256_shuffle_epi8(op_table, c))) as u32,
        _mm256_movemask_epi8(ctrl) as u32,
        _mm256_movemask_epi8(v) as u32,
    ]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn avx2(block: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    // SAFETY: `block` is 64 readable bytes; the two unaligned loads read bytes 0..32 and
    // 32..64. The tables are 16 readable bytes each. `loadu` needs no alignment.
    let (lo, hi, ws_table, op_table) = unsafe {
        (
            _mm256_loadu_si256(block.as_ptr().cast()),
            _mm256_loadu_si256(block.as_ptr().add(32).cast()),
            _mm_loadu_si128(WS_TABLE.as_ptr().cast()),
            _mm_loadu_si128(OP_TABLE.as_ptr().cast()),
        )
    };
    let ws_table = _mm256_broadcastsi128_si256(ws_table);
    let op_table = _mm256_broadcastsi128_si256(op_table);
    let l = avx2_half(lo, ws_table, op_table);
    let h = avx2_half(hi, ws_table, op_table);
    let join = |k: usize| opaque(u64::from(l[k]) | (u64::from(h[k]) << 32));
    Masks {
        quote: join(0),
        backslash: join(1),
        ws: join(2),
        op: join(3),
        ctrl: join(4),
        high: join(5),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn avx512(block: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    // SAFETY: `block` is 64 readable bytes; `loadu` has no alignment requirement. The
    // tables are 16 readable bytes each.
    let (v, ws_table, op_table) = unsafe {
        (
            _mm512_loadu_si512(block.as_ptr().cast()),
            _mm512_broadcast_i32x4(_mm_loadu_si128(WS_TABLE.as_ptr().cast())),
            _mm512_broadcast_i32x4(_mm_loadu_si128(OP_TABLE.as_ptr().cast())),
        )
    };
    let c = _mm512_or_si512(v, _mm512_set1_epi8(0x20));
    Masks {
        quote: _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(b'"' as i8)),
        backslash: _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(b'\\' as i8)),
        ws: _mm512_cmpeq_epi8_mask(v, _mm512_shuffle_epi8(ws_table, v)),
        op: _mm512_cmpeq_epi8_mask(c, _mm512_shuffle_epi8(op_table, c)),
        ctrl: _mm512_cmple_epu8_mask(v, _mm512_set1_epi8(0x1f)),
        high: _mm512_movepi8_mask(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn is_ws(b: u8) -> bool {
        matches!(b, b' ' | b'\t' | b'\n' | b'\r')
    }

    #[test]
    fn portable_classes_every_byte() {
        for b in 0..=255u8 {
            let m = portable(&[b; 64]);
            let all = |x: u64, want: bool| x == if want { u64::MAX } else { 0 };
            assert!(all(m.quote, b == b'"'), "{b:#x}");
            assert!(all(m.backslash, b == b'\\'), "{b:#x}");
            assert!(all(m.ws, is_ws(b)), "whitespace is exact: {b:#x}");
            if matches!(b, b'{' | b'}' | b'[' | b']' | b':' | b',') {
                assert!(all(m.op, true), "{b:#x}");
            }
            assert!(all(m.ctrl, b < 0x20), "{b:#x}");
            assert!(all(m.high, b >= 0x80), "{b:#x}");
            // Never a byte that can continue a number or a literal.
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.') {
                assert!(all(m.op, false), "{b:#x}");
            }
        }
    }

    #[test]
    fn every_level_agrees_on_every_byte() {
        for level in Level::all_supported() {
            for b in 0..=255u8 {
                let mut block = [b' '; 64];
                for i in [0, 1, 15, 16, 31, 32, 33, 47, 48, 63] {
                    block[i] = b;
                }
                assert_eq!(level.classify(&block), portable(&block), "{level:?} {b:#x}");
            }
        }
    }

    /// The bit helpers of the SIMD stage 1 against the portable ones.
    fn check_bits(bits: u64) -> Result<(), TestCaseError> {
        let mut want = [0u32; 64];
        let n = fast::flatten(bits, 640, &mut want);
        prop_assert_eq!(n, bits.count_ones() as usize);
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx2() {
                // SAFETY: the CPU has PCLMULQDQ (checked by `has_avx2`).
                let got = unsafe { clmul_prefix_xor(bits) };
                prop_assert_eq!(got, fast::prefix_xor(bits), "{:#x}", bits);
            }
            if has_avx2() {
                let mut got = [0u32; 64];
                // SAFETY: the CPU has AVX2 and POPCNT (checked by `has_avx2`).
                let m = unsafe { avx2_flatten(bits, 640, &mut got) };
                prop_assert_eq!(m, n);
                prop_assert_eq!(&got[..n], &want[..n], "{:#x}", bits);
            }
            if has_avx512() {
                let mut got = [0u32; 64];
                // SAFETY: the CPU has AVX-512 F and POPCNT (checked by `has_avx512`).
                let m = unsafe { avx512_flatten(bits, 640, &mut got) };
                prop_assert_eq!(m, n);
                prop_assert_eq!(&got[..n], &want[..n], "{:#x}", bits);
            }
        }
        Ok(())
    }

    #[test]
    fn bit_helpers_on_edge_masks() {
        for bits in [
            0,
            1,
            1 << 63,
            u64::MAX,
            0x8000_0000_0000_0001,
            0xffff,
            0xffff << 48,
        ] {
            check_bits(bits).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    proptest! {
        #[test]
        fn bit_helpers_agree(bits in any::<u64>(), sparse in any::<u64>()) {
            check_bits(bits)?;
            check_bits(bits & sparse)?;
        }

        #[test]
        fn every_level_agrees_on_random_blocks(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            let block: [u8; 64] = bytes.try_into().expect("64 bytes");
            for level in Level::all_supported() {
                prop_assert_eq!(level.classify(&block), portable(&block), "{:?}", level);
            }
        }
    }
}
