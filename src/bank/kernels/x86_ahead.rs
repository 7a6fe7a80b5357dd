//! The prefetch of a step's next rows by the first-pass kernels
//! (`x86_bf16`, `x86_fixed16`): while a step's rows are scored, the cache
//! lines of the rows the next step will round or scale are asked for, a
//! few per iteration of a tile's loop over the lines, so that step finds
//! them in cache instead of waiting on memory.

use std::arch::x86_64::*;

/// Cache lines to ask for while a tile is scored: `per_line` of them
/// from `start` for each line the tile's loop takes.
#[derive(Clone, Copy)]
pub(super) struct Ahead {
    start: *const u8,
    per_line: usize,
    /// Lines in all, from `start`.
    count: usize,
}

impl Ahead {
    pub(super) const NONE: Ahead = Ahead {
        start: std::ptr::null(),
        per_line: 0,
        count: 0,
    };

    /// Every cache line of `bytes`, not yet spread over a loop.
    pub(super) fn whole(bytes: &[u8]) -> Ahead {
        Ahead {
            start: bytes.as_ptr(),
            per_line: 0,
            count: bytes.len().div_ceil(64),
        }
    }

    /// Part `part` of `parts` equal parts of these lines, spread over a
    /// loop of `lines` iterations.
    pub(super) fn share(self, part: usize, parts: usize, lines: usize) -> Ahead {
        let per_part = self.count.div_ceil(parts.max(1));
        let first = (part * per_part).min(self.count);
        Ahead {
            start: self.start.wrapping_add(first * 64),
            per_line: per_part.div_ceil(lines.max(1)),
            count: per_part.min(self.count - first),
        }
    }

    /// Asks for the lines of loop iteration `l`.
    #[inline]
    #[target_feature(enable = "sse")]
    pub(super) fn fetch(self, l: usize) {
        for k in l * self.per_line..((l + 1) * self.per_line).min(self.count) {
            // A prefetch reads nothing architecturally and never faults:
            // any address will do.
            _mm_prefetch::<_MM_HINT_T1>(self.start.wrapping_add(k * 64).cast());
        }
    }
}
