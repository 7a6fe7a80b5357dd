//! The f32 batch kernel on its own (`kernels::score_f32_batch`, what a
//! server pass of many queries spends its time in), on one thread, against
//! its peer in the same run: the single-query kernels scoring the same
//! queries `MAX_BLOCK` at a time. Rounds interleave the two.
//!
//! Two row sets of the same size in flops: `memory` walks N distinct rows
//! (default 100k x 768, 300 MB: streamed from memory, as a scan does), and
//! `cached` walks the first 256 rows (768 KB, inside L2) over and over, so
//! the kernel's arithmetic shows without the memory stream. Both call the
//! kernel 32 rows at a time, as the scan's prefetch steps do.
//!
//!   cargo run --release --example batch_kernel [-- ROWS [QUERIES [ROUNDS]]]
//!
//! Prints, per set, the median ms per pass and GFLOP/s per CPU second of
//! this thread (what a loaded machine still lets one see of the kernel's
//! speed), the wall figure, and the load average. At the AVX2 and AVX-512
//! levels also the FMA roofline of this thread (`peak`) and each kernel's
//! share of it: a kernel near 100% can only get faster by doing fewer FMAs.

use std::time::Instant;

use deltamem::bank::kernels::{self, AlignedQueries, Level, MAX_BLOCK, Rows, fixed16};

const DIM: usize = 768;
/// Rows per kernel call, as the scan's prefetch step.
const STEP_ROWS: usize = 32;
/// Rows of the `cached` set: 768 KB at dim 768.
const CACHED_ROWS: usize = 256;

fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write; the clock id is a constant
    // the kernel knows.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Values in [-0.5, 0.5) from the project's test generator.
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = deltamem::storage::sim::Rng(seed.max(1));
    (0..n).map(|_| rng.next_f32() - 0.5).collect()
}

/// One pass of `score` over `slot_of(0..rows)`, STEP_ROWS rows per call:
/// (wall seconds, thread CPU seconds).
fn pass(
    column: &[u8],
    rows: usize,
    slot_of: impl Fn(usize) -> u32,
    nq: usize,
    mut score: impl FnMut(Rows<'_>, &mut [f32]),
) -> (f64, f64) {
    let mut out = vec![0.0f32; STEP_ROWS * nq];
    let mut slots = [0u32; STEP_ROWS];
    let (t, c) = (Instant::now(), thread_cpu_seconds());
    let mut at = 0;
    while at < rows {
        let n = STEP_ROWS.min(rows - at);
        for (i, s) in slots[..n].iter_mut().enumerate() {
            *s = slot_of(at + i);
        }
        let set = Rows {
            bytes: column,
            stride_bytes: DIM * 4,
            offset_bytes: 0,
            slots: &slots[..n],
        };
        score(set, &mut out);
        std::hint::black_box(&out);
        at += n;
    }
    (t.elapsed().as_secs_f64(), thread_cpu_seconds() - c)
}

/// Row `i` of a pass -> its slot in the column.
type SlotOf = Box<dyn Fn(usize) -> u32>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let arg = |i: usize, default: usize| std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (rows, nq, rounds) = (arg(1, 100_000), arg(2, 32), arg(3, 7));
    let level = Level::active();
    let cached_rows: usize = std::env::var("BK_CACHED_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CACHED_ROWS);
    // 64-byte aligned rows, as a bank's mapped column holds them.
    let mut raw = vec![0u8; rows * DIM * 4 + 64];
    let pad = raw.as_ptr().align_offset(64);
    raw[pad..pad + rows * DIM * 4].copy_from_slice(bytemuck::cast_slice(&values(7, rows * DIM)));
    let column = &raw[pad..pad + rows * DIM * 4];
    let queries: Vec<Vec<f32>> = (0..nq).map(|b| values(100 + b as u64, DIM)).collect();
    // The queries as the scan passes them now (`AlignedQueries`), and
    // `BK_QUERY_SHIFT` f32 past a 64-byte boundary (default 4, 16 bytes:
    // where the allocator puts a Vec, which is how they came before).
    let aligned = AlignedQueries::new(&queries, DIM);
    let refs = aligned.refs();
    let shift: usize = std::env::var("BK_QUERY_SHIFT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut qraw = vec![0.0f32; nq * (DIM + 16) + 16];
    let qpad = qraw.as_ptr().align_offset(64);
    for (b, q) in queries.iter().enumerate() {
        let at = qpad + shift + b * (DIM + 16);
        qraw[at..at + DIM].copy_from_slice(q);
    }
    let shifted: Vec<&[f32]> = (0..nq).map(|b| &qraw[qpad + shift + b * (DIM + 16)..][..DIM]).collect();
    let flop = 2.0 * (rows * nq * DIM) as f64;
    println!(
        "{rows} rows x {DIM} f32, {nq} queries, level {}, one thread, load average at start {}",
        level.name(),
        load_average()
    );
    let avx512 = level == Level::Avx512;
    // Measured first, before the pages of the column are touched.
    let peak = (level >= Level::Avx2).then(|| peak::gflops(avx512));
    if let Some(peak) = peak {
        let (chains, bits) = if avx512 { (16, 512) } else { (12, 256) };
        println!(
            "FMA peak of this thread ({chains} independent {bits}-bit FMA chains, no loads): {peak:.1} GFLOP/s per CPU second"
        );
    }
    let sets: [(&str, SlotOf); 2] = [
        ("memory", Box::new(|i| i as u32)),
        ("cached", Box::new(move |i| (i % cached_rows.min(rows)) as u32)),
    ];
    let check = |set: Rows<'_>| {
        let end = set.slots.iter().max().map_or(0, |&s| s as usize + 1) * DIM * 4;
        assert!(end <= column.len(), "rows inside the column");
    };
    for (name, slot_of) in &sets {
        // [batch kernel, the same on shifted queries, the kernel before
        // on shifted queries, single-query kernels]
        let mut times: [Vec<(f64, f64)>; 5] = Default::default();
        let first_pass = fixed16::runs_at(level);
        let scaled_queries = first_pass.then(|| fixed16::Scaled::queries(level, &refs, DIM));
        let mut scaled = fixed16::Scaled::with_capacity(STEP_ROWS, DIM);
        let mut bounds = vec![0.0f32; STEP_ROWS];
        for _ in 0..rounds {
            times[0].push(pass(column, rows, slot_of, nq, |set, out| {
                kernels::score_f32_batch(level, &refs, DIM, set, out)
            }));
            times[1].push(pass(column, rows, slot_of, nq, |set, out| {
                kernels::score_f32_batch(level, &shifted, DIM, set, out)
            }));
            if avx512 {
                times[2].push(pass(column, rows, slot_of, nq, |set, out| {
                    check(set);
                    // SAFETY: AVX-512 is the active level, so the CPU has
                    // it; the rows lie inside the column (checked above);
                    // every query has DIM components.
                    unsafe { before::score(&shifted, DIM, set, out) }
                }));
            }
            if let Some(scaled_queries) = &scaled_queries {
                times[4].push(pass(column, rows, slot_of, nq, |set, out| {
                    fixed16::scale_rows(level, set, DIM, &mut scaled);
                    let count = set.slots.len();
                    // The next call's rows, asked for during this one's
                    // scores, as the scan does.
                    let next = set
                        .slots
                        .last()
                        .map_or(0, |&s| (s as usize + 1) * DIM * 4)
                        .min(column.len());
                    let ahead = &column[next..(next + count * DIM * 4).min(column.len())];
                    if std::env::var("BK_SCALE_ONLY").is_err() {
                        fixed16::score(level, scaled_queries, &scaled, count, out, &mut bounds, ahead);
                    }
                }));
            }
            times[3].push(pass(column, rows, slot_of, nq, |set, out| {
                for (g, group) in refs.chunks(MAX_BLOCK).enumerate() {
                    let width = group.len();
                    let part = &mut out[g * MAX_BLOCK * STEP_ROWS..];
                    kernels::score_f32(level, group, DIM, set, &mut part[..set.slots.len() * width]);
                }
            }));
        }
        let cpu = |v: &[(f64, f64)]| median(v.iter().map(|p| p.1).collect());
        let wall = |v: &[(f64, f64)]| median(v.iter().map(|p| p.0).collect());
        let line = |what: &str, v: &[(f64, f64)]| {
            let share = peak.map_or(String::new(), |p| {
                format!(", {:.0}% of the FMA peak", flop / cpu(v) / 1e9 / p * 100.0)
            });
            format!(
                "{what}: {:.1} ms CPU per pass ({:.1} GFLOP/s per CPU second{share}, {:.1} wall); now/this CPU {:.2}",
                cpu(v) * 1e3,
                flop / cpu(v) / 1e9,
                flop / wall(v) / 1e9,
                cpu(&times[0]) / cpu(v)
            )
        };
        println!("{name}:");
        println!("  {}", line("batch kernel, aligned queries (now)", &times[0]));
        println!("  {}", line(&format!("batch kernel, queries +{shift} f32"), &times[1]));
        if avx512 {
            println!("  {}", line(&format!("kernel before, queries +{shift} f32"), &times[2]));
        }
        println!("  {}", line("single-query kernels, aligned", &times[3]));
        if first_pass {
            // Not exact: the scan re-scores the pairs its bound cannot
            // settle, which this pass does not count.
            println!(
                "  {}",
                line("16-bit first pass (scaling + scores, no re-scoring)", &times[4])
            );
        }
    }
    println!("load average at the end: {}", load_average());
}

/// The FMA roofline of one thread at the AVX2 and AVX-512 levels.
#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;

    const CHAINS: usize = 16;

    /// `rounds` x CHAINS FMAs on registers: independent chains, enough to
    /// cover the FMA latency, and no loads, so only the FMA units limit it.
    #[target_feature(enable = "avx512f")]
    fn fmas_512(rounds: usize) -> f32 {
        let (a, b) = std::hint::black_box((_mm512_set1_ps(1.0e-3), _mm512_set1_ps(0.5)));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(a, b, *x);
            }
        }
        let sum = acc.iter().fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x));
        _mm512_reduce_add_ps(sum)
    }

    /// Chains of 256-bit FMAs: twelve and the two inputs fit the sixteen
    /// ymm registers (sixteen spilled, and measured below the batch kernel).
    const CHAINS_256: usize = 12;

    /// As `fmas_512`, with 256-bit FMAs.
    #[target_feature(enable = "avx2,fma")]
    fn fmas_256(rounds: usize) -> f32 {
        let (a, b) = std::hint::black_box((_mm256_set1_ps(1.0e-3), _mm256_set1_ps(0.5)));
        let mut acc = [_mm256_setzero_ps(); CHAINS_256];
        for _ in 0..rounds {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(a, b, *x);
            }
        }
        let sum = acc.iter().fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
        let mut lanes = [0.0f32; 8];
        // SAFETY: eight f32 lanes into an eight-f32 array.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        lanes.iter().sum()
    }

    /// The best of three runs (~0.1 s each at AVX-512, ~0.04 s at AVX2),
    /// in GFLOP per CPU second of this thread (the CPU clock leaves out
    /// time the thread did not run).
    pub fn gflops(avx512: bool) -> f64 {
        const ROUNDS: usize = 20_000_000;
        let (chains, lanes) = if avx512 { (CHAINS, 16) } else { (CHAINS_256, 8) };
        let flop = (ROUNDS * chains * lanes * 2) as f64;
        (0..3)
            .map(|_| {
                let c = super::thread_cpu_seconds();
                // SAFETY: called only at the AVX2 level or above, with
                // `avx512` only at the AVX-512 level, so the CPU has the
                // features of the function called.
                let sum = unsafe { if avx512 { fmas_512(ROUNDS) } else { fmas_256(ROUNDS) } };
                std::hint::black_box(sum);
                flop / (super::thread_cpu_seconds() - c) / 1e9
            })
            .fold(0.0, f64::max)
    }
}

/// The batch kernel as it was before the row prefetch (2 rows x 3 queries
/// x 4 accumulators per pair, AVX-512), kept here as the same-process peer
/// of the comparison.
#[cfg(target_arch = "x86_64")]
// Index loops over the register arrays, as the library kernel writes them.
#[allow(clippy::needless_range_loop)]
mod before {
    use std::arch::x86_64::*;

    use deltamem::bank::kernels::Rows;

    /// # Safety
    /// AVX-512F; `dim` f32 readable behind every pointer.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn tile<const R: usize, const Q: usize>(
        q: [*const f32; Q],
        v: [*const f32; R],
        dim: usize,
    ) -> [[f32; Q]; R] {
        const L: usize = 16;
        let mut acc = [[[_mm512_setzero_ps(); 4]; Q]; R];
        let mut x = [_mm512_setzero_ps(); R];
        let mut o = 0;
        while o + 4 * L <= dim {
            for j in 0..4 {
                for r in 0..R {
                    // SAFETY: o + (j+1)L <= dim.
                    x[r] = unsafe { _mm512_loadu_ps(v[r].add(o + j * L)) };
                }
                for b in 0..Q {
                    // SAFETY: as above.
                    let qb = unsafe { _mm512_loadu_ps(q[b].add(o + j * L)) };
                    for r in 0..R {
                        acc[r][b][j] = _mm512_fmadd_ps(qb, x[r], acc[r][b][j]);
                    }
                }
            }
            o += 4 * L;
        }
        for j in 0..3 {
            if o + L <= dim {
                for r in 0..R {
                    // SAFETY: o + L <= dim.
                    x[r] = unsafe { _mm512_loadu_ps(v[r].add(o)) };
                }
                for b in 0..Q {
                    // SAFETY: as above.
                    let qb = unsafe { _mm512_loadu_ps(q[b].add(o)) };
                    for r in 0..R {
                        acc[r][b][j] = _mm512_fmadd_ps(qb, x[r], acc[r][b][j]);
                    }
                }
                o += L;
            }
        }
        if o < dim {
            let mask = ((1u32 << (dim - o)) - 1) as __mmask16;
            for r in 0..R {
                // SAFETY: the masked load reads only the dim - o lanes left.
                x[r] = unsafe { _mm512_maskz_loadu_ps(mask, v[r].add(o)) };
            }
            for b in 0..Q {
                // SAFETY: as above.
                let qb = unsafe { _mm512_maskz_loadu_ps(mask, q[b].add(o)) };
                for r in 0..R {
                    acc[r][b][3] = _mm512_fmadd_ps(qb, x[r], acc[r][b][3]);
                }
            }
        }
        let mut out = [[0.0f32; Q]; R];
        for r in 0..R {
            for b in 0..Q {
                let a = &acc[r][b];
                out[r][b] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
            }
        }
        out
    }

    /// # Safety
    /// AVX-512F+BW; every row of `rows` inside its bytes, every query `dim` long.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn score(queries: &[&[f32]], dim: usize, rows: Rows<'_>, out: &mut [f32]) {
        let at = |i: usize| {
            let slot = rows.slots[i] as usize;
            rows.bytes
                .as_ptr()
                .wrapping_add(slot * rows.stride_bytes + rows.offset_bytes)
                .cast::<f32>()
        };
        let n = rows.slots.len();
        let mut i = 0;
        while i + 2 <= n {
            // SAFETY: the caller's guarantee.
            unsafe { row_tile::<2>(queries, dim, [at(i), at(i + 1)], &mut out[i * queries.len()..]) };
            i += 2;
        }
        if i < n {
            // SAFETY: as above.
            unsafe { row_tile::<1>(queries, dim, [at(i)], &mut out[i * queries.len()..]) };
        }
    }

    /// # Safety
    /// As `score`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn row_tile<const R: usize>(queries: &[&[f32]], dim: usize, v: [*const f32; R], out: &mut [f32]) {
        let nq = queries.len();
        let mut b = 0;
        while b + 3 <= nq {
            let q = std::array::from_fn(|k| queries[b + k].as_ptr());
            // SAFETY: as above.
            let s = unsafe { tile::<R, 3>(q, v, dim) };
            for r in 0..R {
                out[r * nq + b..r * nq + b + 3].copy_from_slice(&s[r]);
            }
            b += 3;
        }
        while b < nq {
            // SAFETY: as above.
            let s = unsafe { tile::<R, 1>([queries[b].as_ptr()], v, dim) };
            for r in 0..R {
                out[r * nq + b] = s[r][0];
            }
            b += 1;
        }
    }
}
