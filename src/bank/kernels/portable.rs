//! The portable kernels: plain Rust with eight independent accumulators
//! (the compiler keeps them in vector registers where it can). Used on
//! CPUs without AVX2 and on other architectures.

use super::Rows;

/// One dot product; `lanes(c)` decodes components `8c..8c+8` of the row
/// and `tail(i)` component i. The f32 and f16 kernels share it, so an f16
/// row scores exactly like its values held as f32; eight-lane blocks
/// let the compiler use vector registers.
#[inline(always)]
fn dot_with(query: &[f32], lanes: impl Fn(usize) -> [f32; 8], tail: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = query.len() / 8;
    for (c, q) in query.chunks_exact(8).enumerate() {
        let r = lanes(c);
        for lane in 0..8 {
            acc[lane] += q[lane] * r[lane];
        }
    }
    let mut rest = 0.0f32;
    for (i, q) in query.iter().enumerate().skip(chunks * 8) {
        rest += q * tail(i);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + rest
}

fn f32_at(row: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(row[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

fn f16_at(row: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])).to_f32()
}

pub(super) fn score_f32(queries: &[&[f32]], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
    for i in 0..rows.slots.len() {
        let row = rows.row(i, dim * 4);
        let lanes = |c: usize| -> [f32; 8] {
            let block: &[u8; 32] = row[32 * c..32 * c + 32].try_into().expect("32 bytes");
            std::array::from_fn(|lane| f32::from_le_bytes(block[4 * lane..4 * lane + 4].try_into().expect("4")))
        };
        for (b, q) in queries.iter().enumerate() {
            out[i * queries.len() + b] = dot_with(q, lanes, |k| f32_at(row, k));
        }
    }
}

pub(super) fn score_f16(queries: &[&[f32]], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
    for i in 0..rows.slots.len() {
        let row = rows.row(i, dim * 2);
        let lanes = |c: usize| -> [f32; 8] { std::array::from_fn(|lane| f16_at(row, 8 * c + lane)) };
        for (b, q) in queries.iter().enumerate() {
            out[i * queries.len() + b] = dot_with(q, lanes, |k| f16_at(row, k));
        }
    }
}

pub(super) fn score_i8(queries: &[&[i16]], dim: usize, rows: Rows<'_>, out: &mut [i32]) {
    for i in 0..rows.slots.len() {
        let row = rows.row(i, dim);
        for (b, q) in queries.iter().enumerate() {
            out[i * queries.len() + b] = q
                .iter()
                .zip(row)
                .map(|(&p, &r)| i32::from(p) * i32::from(r as i8))
                .sum();
        }
    }
}

/// The lane sum of each row's first `row_bytes` bytes (the definition,
/// `format::lane_sum32`, run on the row just scored: it is in L1).
pub(super) fn lane_sums(rows: Rows<'_>, row_bytes: usize, sums: &mut [u32]) {
    for (i, sum) in sums.iter_mut().enumerate().take(rows.slots.len()) {
        *sum = crate::format::lane_sum32(rows.row(i, row_bytes));
    }
}
