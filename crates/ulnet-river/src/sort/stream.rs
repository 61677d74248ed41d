//! Stores that bypass the cache: whole 64-byte lines written with non-temporal stores
//! (x86-64; elsewhere, ordinary copies), for data the writer will not read again soon, and
//! line-aligned buffers ([`Line`]) to gather it in.

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

/// Window `i` of `window_bytes` (whole lines) among the windows laid end to end in `lines`
/// (one per bucket, say).
pub fn window(lines: &mut [Line], window_bytes: usize, i: usize) -> &mut [u8] {
    let per = window_bytes / LINE;
    bytes_of(&mut lines[i * per..(i + 1) * per])
}

/// Copies `src` to `dst` (as long): the whole lines of `dst` with non-temporal stores, the
/// bytes before its first line boundary and after its last with ordinary ones (none when
/// `dst` starts a line and is whole lines long). The non-temporal stores are weakly
/// ordered: [`fence`] before another thread or the kernel reads `dst`.
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "as many bytes");
    let head = (dst.as_ptr() as usize).next_multiple_of(LINE) - dst.as_ptr() as usize;
    if head >= dst.len() {
        dst.copy_from_slice(src);
        return;
    }
    let body = (dst.len() - head) / LINE * LINE;
    let (d_head, rest) = dst.split_at_mut(head);
    let (d_body, d_tail) = rest.split_at_mut(body);
    let (s_head, rest) = src.split_at(head);
    let (s_body, s_tail) = rest.split_at(body);
    d_head.copy_from_slice(s_head);
    d_tail.copy_from_slice(s_tail);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        for (d, s) in d_body.chunks_exact_mut(LINE).zip(s_body.chunks_exact(LINE)) {
            let d = d.as_mut_ptr().cast::<__m128i>();
            let s = s.as_ptr().cast::<__m128i>();
            for k in 0..LINE / 16 {
                // SAFETY: `d` and `s` each point to 64 bytes in bounds (chunks of `d_body`
                // and `s_body`); `d` is 16-byte aligned (`d_body` starts on a line
                // boundary and its chunks are whole lines) and `s` is read unaligned, so
                // each 16-byte load and store stays inside them; SSE2 is part of x86-64.
                unsafe { _mm_stream_si128(d.add(k), _mm_loadu_si128(s.add(k))) }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    d_body.copy_from_slice(s_body);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn copy_writes_exactly_the_destination(start in 0usize..200, len in 0usize..1000, seed in any::<u8>()) {
            let src: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
            // Lines of 0xEE around the destination, which starts anywhere in a line.
            let mut lines = vec![Line([0xEE; LINE]); (start + len) / LINE + 2];
            let buf = bytes_of(&mut lines);
            copy(&mut buf[start..start + len], &src);
            fence();
            prop_assert_eq!(&buf[start..start + len], &src[..]);
            prop_assert!(buf[..start].iter().all(|&b| b == 0xEE));
            prop_assert!(buf[start + len..].iter().all(|&b| b == 0xEE));
        }
    }
}
