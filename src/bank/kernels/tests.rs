//! Every kernel level against an f64 reference, with a tolerance derived
//! from the length; batched against single; f16 against f32 of the same
//! values; int8 exactly.

use super::quant::{QueryInt8, decode_f16, encode_f16, encode_int8_row, gamma, round_to_f16};
use super::*;
use super::{bf16, fixed16};

use crate::storage::sim::Rng;

/// Uniform in [-1, 1).
fn signed(rng: &mut Rng) -> f32 {
    rng.next_f32() * 2.0 - 1.0
}

fn vector(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| signed(rng)).collect()
}

const LENGTHS: [usize; 20] = [
    0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 384, 768, 1031,
];

fn f64_dot(a: &[f32], b: &[f32]) -> (f64, f64) {
    let exact = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let magnitude = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) * f64::from(*y)).abs())
        .sum();
    (exact, magnitude)
}

/// Rows laid out with a stride, one offset, so the kernels read unaligned.
fn column(rows: &[Vec<f32>], row_bytes: impl Fn(&[f32]) -> Vec<u8>, stride: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; rows.len() * stride + 8];
    for (i, r) in rows.iter().enumerate() {
        let b = row_bytes(r);
        bytes[3 + i * stride..3 + i * stride + b.len()].copy_from_slice(&b);
    }
    bytes
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; v.len() * 2];
    encode_f16(v, &mut out);
    out
}

#[test]
fn float_kernels_agree_with_f64_within_gamma_n() {
    let mut rng = Rng(11);
    for level in Level::all_supported() {
        for n in LENGTHS {
            let queries: Vec<Vec<f32>> = (0..MAX_BLOCK).map(|_| vector(&mut rng, n)).collect();
            let rows: Vec<Vec<f32>> = (0..5).map(|_| vector(&mut rng, n)).collect();
            let stride = 4 * n + 5;
            let bytes = column(&rows, f32_bytes, stride);
            let slots = [4u32, 0, 2, 1, 3];
            let set = Rows {
                bytes: &bytes,
                stride_bytes: stride,
                offset_bytes: 3,
                slots: &slots,
            };
            let refs: Vec<&[f32]> = queries.iter().map(|q| q.as_slice()).collect();
            let mut out = vec![0.0f32; slots.len() * MAX_BLOCK];
            score_f32(level, &refs, n, set, &mut out);
            for (i, &slot) in slots.iter().enumerate() {
                for (b, q) in queries.iter().enumerate() {
                    let (exact, magnitude) = f64_dot(q, &rows[slot as usize]);
                    let got = f64::from(out[i * MAX_BLOCK + b]);
                    // Products are exact in f64; the f32 result carries at
                    // most gamma_n relative to the magnitude, plus its own
                    // final rounding.
                    let tol = gamma(n) * magnitude + 1e-7 * exact.abs() + 1e-30;
                    assert!(
                        (got - exact).abs() <= tol,
                        "{level:?} n={n} row {slot} query {b}: {got} vs {exact} (tol {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn batched_scores_equal_single_scores_bit_for_bit() {
    let mut rng = Rng(12);
    for level in Level::all_supported() {
        for n in [5, 64, 768, 1031] {
            let queries: Vec<Vec<f32>> = (0..MAX_BLOCK).map(|_| vector(&mut rng, n)).collect();
            let rows: Vec<Vec<f32>> = (0..3).map(|_| vector(&mut rng, n)).collect();
            let bytes = column(&rows, f32_bytes, 4 * n);
            let slots = [0u32, 1, 2];
            let set = Rows {
                bytes: &bytes,
                stride_bytes: 4 * n,
                offset_bytes: 3,
                slots: &slots,
            };
            for width in 1..=MAX_BLOCK {
                let refs: Vec<&[f32]> = queries[..width].iter().map(|q| q.as_slice()).collect();
                let mut out = vec![0.0f32; 3 * width];
                score_f32(level, &refs, n, set, &mut out);
                for b in 0..width {
                    let mut one = [0.0f32; 3];
                    score_f32(level, &refs[b..b + 1], n, set, &mut one);
                    for i in 0..3 {
                        assert_eq!(
                            out[i * width + b].to_bits(),
                            one[i].to_bits(),
                            "{level:?} n={n} width {width}"
                        );
                    }
                }
            }
        }
    }
}

/// The register-blocked kernel gives, for every query of a pass of any
/// width and every row (odd row counts, unaligned rows, every tail
/// length), the bits the single-query kernel gives at the same level.
#[test]
fn batch_kernel_scores_equal_single_query_scores_bit_for_bit() {
    let mut rng = Rng(14);
    for level in Level::all_supported() {
        for n in LENGTHS {
            let queries: Vec<Vec<f32>> = (0..MAX_BATCH).map(|_| vector(&mut rng, n)).collect();
            // Both as allocated and as the scan passes them (each on a
            // 64-byte boundary), so both load paths are compared.
            let copies = AlignedQueries::new(&queries, n);
            let rows: Vec<Vec<f32>> = (0..7).map(|_| vector(&mut rng, n)).collect();
            let stride = 4 * n + 12;
            let bytes = column(&rows, f32_bytes, stride);
            let slots = [6u32, 0, 2, 1, 5, 3, 4];
            let (plain, aligned) = (queries.iter().map(|q| q.as_slice()).collect::<Vec<_>>(), copies.refs());
            for (width, queries) in [1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, MAX_BATCH]
                .into_iter()
                .flat_map(|w| [(w, &plain), (w, &aligned)])
            {
                for count in [1, 2, 3, 4, 5, 7] {
                    let set = Rows {
                        bytes: &bytes,
                        stride_bytes: stride,
                        offset_bytes: 3,
                        slots: &slots[..count],
                    };
                    let refs = &queries[..width];
                    let mut out = vec![f32::NAN; count * width];
                    score_f32_batch(level, refs, n, set, &mut out);
                    for b in 0..width {
                        let mut one = [0.0f32; 7];
                        score_f32(level, &refs[b..b + 1], n, set, &mut one);
                        for i in 0..count {
                            assert_eq!(
                                out[i * width + b].to_bits(),
                                one[i].to_bits(),
                                "{level:?} n={n} width {width} rows {count}: row {i} query {b}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn aligned_queries_hold_the_same_values_each_on_a_64_byte_boundary() {
    let mut rng = Rng(15);
    for n in LENGTHS {
        let queries: Vec<Vec<f32>> = (0..5).map(|_| vector(&mut rng, n)).collect();
        let aligned = AlignedQueries::new(&queries, n);
        let refs = aligned.refs();
        assert_eq!(refs.len(), queries.len());
        for (copy, query) in refs.iter().zip(&queries) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(copy), bits(query), "n={n}");
            assert_eq!(
                copy.as_ptr() as usize % 64,
                0,
                "n={n}: a query starts on a 64-byte boundary"
            );
        }
    }
}

#[test]
fn f16_rows_score_exactly_like_their_f32_values() {
    let mut rng = Rng(13);
    for level in Level::all_supported() {
        for n in LENGTHS {
            let queries: Vec<Vec<f32>> = (0..3).map(|_| vector(&mut rng, n)).collect();
            let mut rows: Vec<Vec<f32>> = (0..4).map(|_| vector(&mut rng, n)).collect();
            rows.iter_mut().for_each(|r| round_to_f16(r));
            let h = column(&rows, f16_bytes, 2 * n + 2);
            let f = column(&rows, f32_bytes, 4 * n);
            for (i, r) in rows.iter().enumerate() {
                assert_eq!(&decode_f16(&f16_bytes(r)), r);
                let _ = i;
            }
            let slots = [3u32, 1, 0, 2];
            let refs: Vec<&[f32]> = queries.iter().map(|q| q.as_slice()).collect();
            let (mut a, mut b) = (vec![0.0f32; 12], vec![0.0f32; 12]);
            let rows_h = Rows {
                bytes: &h,
                stride_bytes: 2 * n + 2,
                offset_bytes: 3,
                slots: &slots,
            };
            let rows_f = Rows {
                bytes: &f,
                stride_bytes: 4 * n,
                offset_bytes: 3,
                slots: &slots,
            };
            score_f16(level, &refs, n, rows_h, &mut a);
            score_f32(level, &refs, n, rows_f, &mut b);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{level:?} n={n}");
        }
    }
}

#[test]
fn int8_kernels_are_exact_at_every_level_and_path() {
    let mut rng = Rng(14);
    for n in LENGTHS.into_iter().chain([129, 191, 16384]) {
        let rows: Vec<Vec<f32>> = (0..4).map(|_| vector(&mut rng, n)).collect();
        let stride = (4 + n).div_ceil(64) * 64;
        let mut bytes = vec![0u8; rows.len() * stride + 3];
        for (i, r) in rows.iter().enumerate() {
            encode_int8_row(r, &mut bytes[3 + i * stride..3 + (i + 1) * stride]);
        }
        // Extreme codes: an all -127 (or +127) row and an all -127 query.
        bytes[3 + 4..3 + 4 + n]
            .iter_mut()
            .for_each(|b| *b = if n % 2 == 0 { 0x81 } else { 0x7f });
        let queries: Vec<Codes> = (0..5)
            .map(|b| {
                let codes: Vec<i8> = (0..n)
                    .map(|_| {
                        if b == 0 {
                            -127
                        } else {
                            ((rng.next() % 255) as i32 - 127) as i8
                        }
                    })
                    .collect();
                Codes::new(&codes)
            })
            .collect();
        let refs: Vec<&Codes> = queries.iter().collect();
        let slots = [2u32, 0, 3, 1];
        let set = Rows {
            bytes: &bytes,
            stride_bytes: stride,
            offset_bytes: 3,
            slots: &slots,
        };
        let mut want = vec![0i32; 20];
        for (i, &slot) in slots.iter().enumerate() {
            let row = &bytes[3 + slot as usize * stride + 4..][..n];
            for (b, q) in queries.iter().enumerate() {
                let codes = &q.narrow[INT8_LEAD_BYTES..INT8_LEAD_BYTES + n];
                let sum: i64 = codes
                    .iter()
                    .zip(row)
                    .map(|(&p, &r)| i64::from(p) * i64::from(r as i8))
                    .sum();
                want[i * 5 + b] = sum as i32;
            }
        }
        for level in Level::all_supported() {
            for path in [Int8Path::MultiplyAdd, Int8Path::Vnni256, Int8Path::Vnni512] {
                let mut got = vec![0i32; 20];
                score_i8_path(level, path, &refs, set, &mut got);
                assert_eq!(got, want, "{level:?} {path:?} n={n}");
            }
        }
    }
}

#[test]
fn int8_encoding_is_deterministic_and_within_half_a_step() {
    let mut rng = Rng(15);
    for n in [1, 7, 768] {
        let v = vector(&mut rng, n);
        let mut row = vec![0u8; (4 + n).div_ceil(64) * 64];
        encode_int8_row(&v, &mut row);
        let scale = f32::from_le_bytes(row[..4].try_into().unwrap());
        assert!(row[4 + n..].iter().all(|&b| b == 0));
        for (i, &x) in v.iter().enumerate() {
            let r = f64::from(row[4 + i] as i8);
            assert!((f64::from(x) - f64::from(scale) * r).abs() <= f64::from(scale) * 0.5001);
        }
        let q = QueryInt8::new(&v, 0.0);
        assert!(q.codes.narrow.iter().all(|c| (-127..=127).contains(c)));
        assert!(q.bound(scale) > 0.0);
    }
}

#[test]
fn dot_helper_matches_the_reference() {
    let mut rng = Rng(16);
    let (a, b) = (vector(&mut rng, 77), vector(&mut rng, 77));
    let (exact, magnitude) = f64_dot(&a, &b);
    assert!((f64::from(dot(&a, &b)) - exact).abs() <= gamma(77) * magnitude + 1e-7);
}

/// Unit vector the way the bank normalises: f64 norm, f32 components.
fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|x| (f64::from(*x) / norm) as f32).collect()
}

/// Families of unit vectors that stress the int8 bound: random, mass on a
/// few dimensions (large scale), one dominant dimension plus tiny noise
/// (tiny codes), near-duplicates (ties within 1e-6), and huge dimensions.
fn adversarial(rng: &mut Rng, n: usize, family: usize) -> Vec<f32> {
    let mut v = vector(rng, n);
    match family {
        0 => {}
        1 => v
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x *= if i % 97 < 2 { 50.0 } else { 0.01 }),
        2 => {
            v.iter_mut().for_each(|x| *x *= 1e-4);
            v[n / 2] = 1.0;
        }
        _ => {
            let base = vector(&mut Rng(99), n);
            v = base.iter().zip(&v).map(|(b, x)| b + x * 1e-6).collect();
        }
    }
    unit(&v)
}

#[test]
fn int8_bound_covers_every_row_at_every_level() {
    let mut rng = Rng(17);
    let mut worst_ratio = 0.0f64;
    for n in [1, 3, 17, 64, 768, 4096, 16384] {
        for family in 0..4 {
            let q = adversarial(&mut rng, n, family);
            let rows: Vec<Vec<f32>> = (0..6).map(|f| adversarial(&mut rng, n, (family + f) % 4)).collect();
            let qstride = (4 + n).div_ceil(64) * 64;
            let mut side = vec![0u8; rows.len() * qstride];
            for (i, r) in rows.iter().enumerate() {
                encode_int8_row(r, &mut side[i * qstride..(i + 1) * qstride]);
            }
            let f = column(&rows, f32_bytes, 4 * n);
            let slots: Vec<u32> = (0..rows.len() as u32).collect();
            for eps in [0.0f32, 0.05, 0.3] {
                let qi = QueryInt8::new(&q, eps);
                let mut dots = vec![0i32; rows.len()];
                let set = Rows {
                    bytes: &side,
                    stride_bytes: qstride,
                    offset_bytes: 0,
                    slots: &slots,
                };
                score_i8(Level::active(), &[&qi.codes], set, &mut dots);
                for level in Level::all_supported() {
                    let mut exact = vec![0.0f32; rows.len()];
                    let set = Rows {
                        bytes: &f,
                        stride_bytes: 4 * n,
                        offset_bytes: 3,
                        slots: &slots,
                    };
                    score_f32(level, &[&q], n, set, &mut exact);
                    for (i, &e) in exact.iter().enumerate() {
                        let scale = f32::from_le_bytes(side[i * qstride..i * qstride + 4].try_into().unwrap());
                        let approx = qi.approx(scale, dots[i]) - eps;
                        let error = f64::from((approx - (e - eps)).abs());
                        let bound = f64::from(qi.bound(scale));
                        assert!(
                            error <= bound,
                            "n={n} family {family} row {i} {level:?}: {error} > {bound}"
                        );
                        worst_ratio = worst_ratio.max(error / bound);
                    }
                }
            }
        }
    }
    println!("largest |approx - exact| / bound seen: {worst_ratio:.3}");
}

#[test]
fn int8_code_rounds_like_f32_round() {
    let mut rng = Rng(18);
    let specials = [
        0.5f32,
        -0.5,
        1.5,
        -1.5,
        0.49999997,
        -0.49999997,
        126.5,
        -126.5,
        127.4,
        200.0,
        -200.0,
        0.0,
        -0.0,
    ];
    let samples = specials
        .into_iter()
        .chain((0..100_000).map(|_| signed(&mut rng) * 300.0));
    for y in samples {
        let mut row = [0u8; 64];
        // scale 1: the code is y itself, rounded.
        encode_int8_row(&[y, 127.0], &mut row);
        let want = y.round().clamp(-127.0, 127.0) as i8;
        assert_eq!(row[4] as i8, want, "{y}");
    }
}

/// Rows of random bytes (any bit pattern, NaN and infinity included) at an
/// odd offset, and the slots that pick them in a scrambled order.
fn random_column(rng: &mut Rng, rows: usize, row_bytes: usize, stride: usize) -> (Vec<u8>, Vec<u32>) {
    let bytes: Vec<u8> = (0..rows * stride + 3).map(|_| rng.next() as u8).collect();
    let slots: Vec<u32> = (0..rows as u32).rev().collect();
    assert!(row_bytes <= stride);
    (bytes, slots)
}

/// The rows of a `random_column` and the lane sum of each one's first
/// `row_bytes` bytes, by the definition (`format::lane_sum32`).
fn rows_and_sums<'a>(bytes: &'a [u8], slots: &'a [u32], stride: usize, row_bytes: usize) -> (Rows<'a>, Vec<u32>) {
    let rows = Rows {
        bytes,
        stride_bytes: stride,
        offset_bytes: 3,
        slots,
    };
    let sums = (0..slots.len())
        .map(|i| crate::format::lane_sum32(rows.row(i, row_bytes)))
        .collect();
    (rows, sums)
}

/// The float kernels' lane sums equal `format::lane_sum32` of each row's
/// stored bytes at every level, for every length (tails of every size and
/// parity, dims not a multiple of 16) and block size (only the first group
/// of queries sums), and summing changes no score bit.
#[test]
fn float_kernel_lane_sums_equal_the_portable_definition() {
    let mut rng = Rng(21);
    let lengths = LENGTHS
        .into_iter()
        .chain([5, 11, 13, 18, 24, 40, 47, 49, 56, 95, 383, 769]);
    for level in Level::all_supported() {
        for n in lengths.clone() {
            for (format, component_bytes) in [(Format::F32, 4), (Format::F16, 2)] {
                let stride = component_bytes * n + 7;
                let (bytes, slots) = random_column(&mut rng, 6, component_bytes * n, stride);
                let (rows, want) = rows_and_sums(&bytes, &slots, stride, component_bytes * n);
                for nq in [1, 3, 4, 5, MAX_BLOCK] {
                    let queries: Vec<Vec<f32>> = (0..nq).map(|_| vector(&mut rng, n)).collect();
                    let refs: Vec<&[f32]> = queries.iter().map(|q| q.as_slice()).collect();
                    let (mut plain, mut summed) = (vec![0.0f32; 6 * nq], vec![0.0f32; 6 * nq]);
                    let mut sums = vec![0u32; 6];
                    #[allow(clippy::type_complexity)] // two kernel signatures, named once here
                    let (score, score_summed): (
                        fn(_, _, _, _, &mut [f32]),
                        fn(_, _, _, _, &mut [f32], &mut [u32]),
                    ) = match format {
                        Format::F32 => (score_f32, score_f32_summed),
                        Format::F16 => (score_f16, score_f16_summed),
                    };
                    score(level, &refs, n, rows, &mut plain);
                    score_summed(level, &refs, n, rows, &mut summed, &mut sums);
                    assert_eq!(
                        sums, want,
                        "{level:?} n={n} nq={nq} {}-byte components",
                        component_bytes
                    );
                    // Random bytes hold NaNs, whose payload may differ.
                    let bits = |v: &[f32]| {
                        v.iter()
                            .map(|x| (!x.is_nan()).then_some(x.to_bits()))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(bits(&plain), bits(&summed), "{level:?} n={n} nq={nq}");
                }
            }
        }
    }
}

/// The int8 kernels' lane sums (every level and instruction path) equal
/// `format::lane_sum32` of the whole side-column row.
#[test]
fn int8_kernel_lane_sums_equal_the_portable_definition() {
    let mut rng = Rng(22);
    for n in [1usize, 59, 60, 61, 124, 125, 384, 768, 1031] {
        let stride = (4 + n).div_ceil(64) * 64;
        let (bytes, slots) = random_column(&mut rng, 5, stride, stride);
        let (rows, want) = rows_and_sums(&bytes, &slots, stride, stride);
        for nq in [1, 4, 6] {
            let queries: Vec<Codes> = (0..nq)
                .map(|_| {
                    Codes::new(
                        &(0..n)
                            .map(|_| ((rng.next() % 255) as i32 - 127) as i8)
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            let refs: Vec<&Codes> = queries.iter().collect();
            for level in Level::all_supported() {
                for path in [Int8Path::MultiplyAdd, Int8Path::Vnni256, Int8Path::Vnni512] {
                    let (mut plain, mut summed) = (vec![0i32; 5 * nq], vec![0i32; 5 * nq]);
                    let mut sums = vec![0u32; 5];
                    score_i8_path(level, path, &refs, rows, &mut plain);
                    score_i8_path_summed(level, path, &refs, rows, &mut summed, &mut sums);
                    assert_eq!(sums, want, "{level:?} {path:?} n={n} nq={nq}");
                    assert_eq!(plain, summed, "{level:?} {path:?} n={n} nq={nq}");
                }
            }
        }
    }
}

/// The f16 helpers convert whole slices with half's (F16C) conversions:
/// every value must round exactly as the one-at-a-time scalar conversion
/// did, ties, subnormals, the largest finite and lengths off the chunk
/// size included.
#[test]
fn f16_slice_conversions_round_like_the_scalar_one() {
    use super::quant::is_f16_exact;
    let scalar = |x: f32| half::f16::from_f32(x);
    let mut rng = Rng(29);
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65519.0,
        -65504.0,
        6.0e-8,
        -3.0e-8,
        5.9604645e-8,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        0.33333334,
        1.0e-5,
        -2.5e-6,
    ];
    values.extend((0..1000).map(|_| signed(&mut rng) * 0.2));
    values.extend((0..300).map(|i| f32::from_bits(0x3380_0000 + i * 4099)));
    for len in [0, 1, 7, 8, 63, 64, 65, 130, values.len()] {
        let v = &values[..len];
        let mut bytes = vec![0u8; 2 * len];
        encode_f16(v, &mut bytes);
        let expected: Vec<u8> = v.iter().flat_map(|&x| scalar(x).to_bits().to_le_bytes()).collect();
        assert_eq!(bytes, expected, "encode_f16, len {len}");
        let mut rounded = v.to_vec();
        round_to_f16(&mut rounded);
        for (r, &x) in rounded.iter().zip(v) {
            assert_eq!(r.to_bits(), scalar(x).to_f32().to_bits(), "round_to_f16 of {x:e}");
        }
        let exact = v.iter().all(|&x| scalar(x).to_f32().to_bits() == x.to_bits());
        assert_eq!(is_f16_exact(v), exact, "is_f16_exact, len {len}");
        assert!(is_f16_exact(&rounded), "a rounded vector is exact");
    }
}

/// Scores `rows` against `queries` with a first pass: the approximate
/// scores (row-major) and a bound per row.
type FirstPass<'a> = &'a dyn Fn(&[&[f32]], Rows<'_>, usize) -> (Vec<f32>, Vec<f32>);

/// Checks a first pass's bound against the exact kernel of every level on
/// adversarial rows and queries, unit and scaled; returns the largest
/// |approx - exact| / bound seen.
fn first_pass_bound_holds(seed: u64, pass: FirstPass<'_>) -> f64 {
    let mut rng = Rng(seed);
    let mut worst_ratio = 0.0f64;
    for n in [1, 3, 17, 31, 32, 33, 64, 100, 768, 1031, 4096] {
        for family in 0..4 {
            let mut queries: Vec<Vec<f32>> = (0..9).map(|f| adversarial(&mut rng, n, (family + f) % 4)).collect();
            let mut rows: Vec<Vec<f32>> = (0..7).map(|f| adversarial(&mut rng, n, (family + f) % 4)).collect();
            // Not unit length: components whose squares underflow (1e-22,
            // 1e-25, 1e-30), down among the subnormals, and a large norm;
            // queries too; and a row of zeros.
            for (from, scale) in [(0, 1e-22f32), (1, 1e-25), (2, 1e-30), (3, 1e-37), (4, 1e18), (5, 0.0)] {
                rows.push(rows[from].iter().map(|x| x * scale).collect());
            }
            queries[7].iter_mut().for_each(|x| *x *= 1e-24);
            queries[8].iter_mut().for_each(|x| *x *= 1e10);
            let bytes = column(&rows, f32_bytes, 4 * n + 4);
            let slots: Vec<u32> = (0..rows.len() as u32).collect();
            let set = Rows {
                bytes: &bytes,
                stride_bytes: 4 * n + 4,
                offset_bytes: 3,
                slots: &slots,
            };
            let query_refs: Vec<&[f32]> = queries.iter().map(Vec::as_slice).collect();
            let (approx, bounds) = pass(&query_refs, set, n);
            for exact_level in Level::all_supported() {
                for (b, q) in queries.iter().enumerate() {
                    let mut exact = vec![0.0f32; rows.len()];
                    score_f32(exact_level, &[q], n, set, &mut exact);
                    for (i, &e) in exact.iter().enumerate() {
                        let a = approx[i * queries.len() + b];
                        let error = f64::from((a - e).abs());
                        let bound = f64::from(bounds[i]);
                        assert!(
                            error <= bound,
                            "n={n} family {family} row {i} query {b} {exact_level:?}: |{a} - {e}| > {bound}"
                        );
                        if bound > 0.0 && bound.is_finite() {
                            worst_ratio = worst_ratio.max(error / bound);
                        }
                    }
                }
            }
        }
    }
    worst_ratio
}

#[test]
fn bf16_bound_covers_every_row_and_query() {
    let level = Level::Avx512;
    if !bf16::runs_at(level) {
        println!("skipped: this CPU has no AVX-512 BF16 (or DELTAMEM_BF16=off)");
        return;
    }
    let worst_ratio = first_pass_bound_holds(23, &|queries, set, n| {
        let rounded_queries = bf16::Rounded::queries(level, queries, n);
        let count = set.slots.len();
        let mut rounded = bf16::Rounded::with_capacity(count, n);
        bf16::round_rows(level, set, n, &mut rounded);
        let mut approx = vec![0.0f32; count * queries.len()];
        let mut bounds = vec![0.0f32; count];
        bf16::score(level, &rounded_queries, &rounded, count, &mut approx, &mut bounds, &[]);
        (approx, bounds)
    });
    // A bound no error comes near would make the scan re-score rows it
    // need not (0.41 is seen: the bound's quarter of slack, and errors
    // short of the worst case).
    println!("largest |approx - exact| / bound seen: {worst_ratio:.3}");
    assert!(
        worst_ratio > 0.2,
        "the bound is far looser than the errors: {worst_ratio}"
    );
}

/// The 16-bit pass of the rows against the queries.
fn fixed16_pass(level: Level, queries: &[&[f32]], set: Rows<'_>, n: usize) -> (Vec<f32>, Vec<f32>) {
    let scaled_queries = fixed16::Scaled::queries(level, queries, n);
    let count = set.slots.len();
    let mut scaled = fixed16::Scaled::with_capacity(count, n);
    fixed16::scale_rows(level, set, n, &mut scaled);
    let mut approx = vec![0.0f32; count * queries.len()];
    let mut bounds = vec![0.0f32; count];
    fixed16::score(level, &scaled_queries, &scaled, count, &mut approx, &mut bounds, &[]);
    (approx, bounds)
}

#[test]
fn fixed16_bound_covers_every_row_and_query() {
    let level = Level::Avx2;
    if !fixed16::runs_at(level) {
        println!("skipped: this CPU has no AVX2 (or DELTAMEM_FIXED16=off)");
        return;
    }
    let worst_ratio = first_pass_bound_holds(29, &|queries, set, n| fixed16_pass(level, queries, set, n));
    // A bound no error comes near would make the scan re-score rows it
    // need not (0.82 is seen: a row of one large component, the others
    // rounding to zero, against a query scaled by 1e10).
    println!("largest |approx - exact| / bound seen: {worst_ratio:.3}");
    assert!(
        worst_ratio > 0.2,
        "the bound is far looser than the errors: {worst_ratio}"
    );
}

#[test]
fn fixed16_bound_is_infinite_for_what_it_cannot_scale() {
    let level = Level::Avx2;
    if !fixed16::runs_at(level) {
        println!("skipped: this CPU has no AVX2 (or DELTAMEM_FIXED16=off)");
        return;
    }
    let n = 40;
    let unit = vec![0.15f32; n];
    let mut rows = vec![unit.clone(); 5];
    rows[1][7] = f32::NAN;
    rows.push(vec![0.0; n]); // a NaN among zeros: the largest magnitude misses it
    rows[5][0] = f32::NAN;
    rows[2][39] = f32::INFINITY;
    rows[3].iter_mut().for_each(|x| *x = 1e-41); // K / max overflows
    rows[4].iter_mut().for_each(|x| *x = 3e38); // the 1-norm overflows
    let bytes = column(&rows, f32_bytes, 4 * n);
    let slots: Vec<u32> = (0..rows.len() as u32).collect();
    let set = Rows {
        bytes: &bytes,
        stride_bytes: 4 * n,
        offset_bytes: 3,
        slots: &slots,
    };
    let (_, bounds) = fixed16_pass(level, &[&unit], set, n);
    assert!(bounds[0].is_finite() && bounds[0] > 0.0, "a plain row: {}", bounds[0]);
    for (i, bound) in bounds.iter().enumerate().skip(1) {
        assert_eq!(*bound, f32::INFINITY, "row {i}");
    }
    // Scores beyond f32: an approximate score of -inf against an exact
    // -3.35e38 (found by a review's search) needs an infinite bound.
    let (row, query) = ([1.440_527_9e-24f32, 3.353_968_6e11], [6.441_63e29f32, -1.000_000_06e27]);
    let huge_bytes = column(&[row.to_vec()], f32_bytes, 8);
    let huge = Rows {
        bytes: &huge_bytes,
        stride_bytes: 8,
        offset_bytes: 3,
        slots: &[0],
    };
    let (approx, bounds) = fixed16_pass(level, &[&query], huge, 2);
    let mut exact = [0.0f32];
    score_f32(level, &[&query], 2, huge, &mut exact);
    assert!(
        (approx[0] - exact[0]).abs() <= bounds[0] || bounds[0] == f32::INFINITY,
        "{} vs {} within {}",
        approx[0],
        exact[0],
        bounds[0]
    );
    // A query that cannot be scaled makes every row's bound infinite.
    let mut bad = unit.clone();
    bad[3] = f32::NAN;
    let (_, bounds) = fixed16_pass(level, &[&unit, &bad], set, n);
    assert!(bounds.iter().all(|b| *b == f32::INFINITY), "{bounds:?}");
}
