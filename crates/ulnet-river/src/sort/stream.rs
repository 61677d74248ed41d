//! Stores that bypass the cache: whole 64-byte lines written with non-temporal stores
//! (x86-64; elsewhere, ordinary copies), for data the writer will not read again soon.

/// Bytes of a cache line.
pub const LINE: usize = 64;

/// One cache line's bytes, aligned as a line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Line(pub [u8; LINE]);

impl Line {
    /// A line of zeros.
    pub const ZERO: Line = Line([0; LINE]);
}

/// The bytes of `lines`, one line after another.
pub fn bytes_of(lines: &mut [Line]) -> &mut [u8] {
    let len = lines.len() * LINE;
    // SAFETY: `Line` is `repr(C)` around `[u8; LINE]` with the same size (its alignment,
    // 64, equals its size), so `lines` is `len` initialised bytes with no padding, any
    // byte value is a valid `u8`, and the borrow of `lines` is handed on whole.
    unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), len) }
}

/// Copies `src` to `dst` (as long, starting on a line boundary) with non-temporal stores.
/// They are weakly ordered: [`fence`] before another thread or the kernel reads `dst`.
pub fn write_lines(dst: &mut [u8], src: &[Line]) {
    assert_eq!(dst.len(), src.len() * LINE, "as many bytes as lines");
    assert_eq!(dst.as_ptr() as usize % LINE, 0, "the destination starts a line");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        for (d, s) in dst.chunks_exact_mut(LINE).zip(src) {
            let d = d.as_mut_ptr().cast::<__m128i>();
            let s = s.0.as_ptr().cast::<__m128i>();
            for k in 0..LINE / 16 {
                // SAFETY: `d` and `s` each point to 64 bytes in bounds (a chunk of `dst`
                // and one `Line`), both 16-byte aligned (a line-aligned start, checked
                // above, and `Line`'s alignment), so each of the four 16-byte loads and
                // stores stays inside them; SSE2 is part of x86-64.
                unsafe { _mm_stream_si128(d.add(k), _mm_load_si128(s.add(k))) }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (d, s) in dst.chunks_exact_mut(LINE).zip(src) {
        d.copy_from_slice(&s.0);
    }
}

/// Makes the non-temporal stores before it visible before any store after it (such as
/// the release of a buffer to another thread).
pub fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no operands and no preconditions; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}
