//! The 128-bit linear congruential generator of the Sort Benchmark ("rand16").
//!
//! The sequence is `x(n+1) = (A * x(n) + C) mod 2^128` with `x(0) = 0`. Record
//! number `r` of a gensort file is built from `x(r+1)` (and, for binary records,
//! the nine numbers after it), so a generator can start anywhere in the
//! sequence by [`skip_ahead`], which composes the powers-of-two steps of the
//! generator in `O(log n)` multiplications.

/// The multiplier `A` of the generator (from L'Ecuyer's tables).
pub const MULTIPLIER: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

/// The increment `C` of the generator; its high ten bytes spell `JimGrayRIP`.
pub const INCREMENT: u128 = 0x4a69_6d47_7261_7952_4950_2020_2020_2001;

/// One step of the generator: the number that follows `x`.
#[inline(always)]
pub fn next(x: u128) -> u128 {
    x.wrapping_mul(MULTIPLIER).wrapping_add(INCREMENT)
}

/// The number `n` steps after the seed 0, that is `x(n)` (so `skip_ahead(0) == 0`
/// and `skip_ahead(1) == INCREMENT`). `n` is taken modulo 2^128, the period of
/// the generator.
pub fn skip_ahead(n: u128) -> u128 {
    // (a, c) describes the affine map f^(2^i)(x) = a*x + c; squaring the map
    // doubles the number of steps it takes.
    let mut a = MULTIPLIER;
    let mut c = INCREMENT;
    let mut x: u128 = 0;
    let mut bits = n;
    while bits != 0 {
        if bits & 1 == 1 {
            x = x.wrapping_mul(a).wrapping_add(c);
        }
        c = a.wrapping_mul(c).wrapping_add(c);
        a = a.wrapping_mul(a);
        bits >>= 1;
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_ahead_matches_stepping() {
        let mut x = 0u128;
        for n in 0..300u128 {
            assert_eq!(skip_ahead(n), x, "step {n}");
            x = next(x);
        }
    }

    #[test]
    fn powers_of_two_steps() {
        // x(2) and x(4): the increments of the squared and fourth-power maps,
        // which the original keeps in its table of generator powers.
        assert_eq!(skip_ahead(2), 0x95e0_e482_62b3_edfe_0447_9485_c755_b646);
        assert_eq!(skip_ahead(4), 0x882a_02c3_1536_2b60_765f_1000_68b3_3a1c);
    }

    #[test]
    fn period_wraps() {
        assert_eq!(next(skip_ahead(u128::MAX)), 0);
    }
}
