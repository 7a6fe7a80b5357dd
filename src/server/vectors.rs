//! A faster parse of the bodies that carry one embedding (`POST
//! /v1/nodes`, `POST /v1/trees/{tree}/query`): their top-level
//! `"embedding"` array is most of the body (768 numbers of ~20 digits are
//! ~16 KB), and serde_json's digit-at-a-time number parsing was a fifth of
//! the CPU of a durable insert under load. Here the array is found by a
//! scan that skips blocks of digits, its numbers are read eight digits at a
//! time, and serde_json parses the rest of the body with the array cut out.
//! An embedding spelt as base64 is cut out the same way and decoded from
//! the body's bytes: serde_json would scan its 4 KB for escapes and check
//! it as UTF-8 before the decoder saw it.
//!
//! The result is the one serde_json gives, bit for bit: a number becomes
//! an f32 by serde_json's own steps (the digits as a u64, times or divided
//! by an exact power of ten in f64, then to f32; an integer straight from
//! u64 or i64). Anything else (more digits than a u64 holds, an exponent
//! beyond 10^22, a key written with escapes, the key twice, broken JSON)
//! takes serde_json's whole-body parse, whose errors name the field.

use std::ops::{ControlFlow, Range};

use serde::de::DeserializeOwned;

use super::body::{InsertRequest, TreeQuery};
use super::error::ApiResult;
use super::http::{parse_json, walk_structure};
use crate::api::ObjectOnly;

/// A request body with a top-level `embedding`.
pub trait WithEmbedding {
    fn embedding_mut(&mut self) -> &mut Vec<f32>;
}

impl WithEmbedding for InsertRequest {
    fn embedding_mut(&mut self) -> &mut Vec<f32> {
        &mut self.embedding
    }
}

impl WithEmbedding for TreeQuery {
    fn embedding_mut(&mut self) -> &mut Vec<f32> {
        &mut self.embedding
    }
}

/// Parses a body as `parse_json` does, the embedding by the fast path
/// when the body allows it.
pub fn parse_with_embedding<T: DeserializeOwned + WithEmbedding>(bytes: &[u8], max_depth: usize) -> ApiResult<T> {
    match fast_parse(bytes, max_depth) {
        Some(value) => Ok(value),
        None => parse_json(bytes, max_depth),
    }
}

/// The fast path; None sends the body to serde_json whole.
fn fast_parse<T: DeserializeOwned + WithEmbedding>(bytes: &[u8], max_depth: usize) -> Option<T> {
    let span = embedding_span(bytes, max_depth)?;
    let embedding = match bytes[span.start] {
        b'[' => parse_f32_array(&bytes[span.clone()])?,
        // A string with no backslash: its bytes are its text.
        _ => crate::api::embedding::decode_base64_f32(&bytes[span.start + 1..span.end - 1]).ok()?,
    };
    let mut rest = Vec::with_capacity(bytes.len() - span.len() + 2);
    rest.extend_from_slice(&bytes[..span.start]);
    rest.extend_from_slice(b"[]");
    rest.extend_from_slice(&bytes[span.end..]);
    let ObjectOnly(mut value): ObjectOnly<T> = serde_json::from_slice(&rest).ok()?;
    *value.embedding_mut() = embedding;
    Some(value)
}

/// Where the value of the top-level key `embedding` lies, from its `[` to
/// its `]` or quote to quote; None when it is neither an array nor a
/// string without escapes, the nesting goes beyond `max_depth`
/// (serde_json's path then names the offset), or the top level's keys
/// are not plain (one written with a backslash might spell
/// `embedding`; the key twice must be refused by serde_json). One walk
/// checks the nesting and finds the keys.
fn embedding_span(bytes: &[u8], max_depth: usize) -> Option<Range<usize>> {
    let mut keys = TopKeys::default();
    let walked = walk_structure(bytes, |state, at, b| {
        let (was_in_string, depth_before) = (state.in_string, state.depth);
        if state.step(b, max_depth) {
            return ControlFlow::Break(());
        }
        match (was_in_string, state.in_string) {
            (false, true) if state.depth == 1 => keys.string_opened(at),
            (true, true) => keys.escaped |= b == b'\\',
            (true, false) if state.depth == 1 && keys.string_closed(bytes, at).is_none() => {
                return ControlFlow::Break(());
            }
            _ => {}
        }
        if !was_in_string && depth_before == 2 && state.depth == 1 {
            keys.closed_at_depth_one(bytes, at);
        }
        ControlFlow::Continue(())
    });
    match walked {
        ControlFlow::Break(()) => None,
        ControlFlow::Continue(()) => keys.span,
    }
}

/// What `embedding_span` tracks of the top level's keys.
#[derive(Default)]
struct TopKeys {
    /// The opening quote of the string being read at depth 1.
    string_start: usize,
    /// That string has a backslash.
    escaped: bool,
    seen: bool,
    /// The `[` or `"` right after the `embedding` key, then the whole
    /// array or string.
    value_start: Option<usize>,
    span: Option<Range<usize>>,
}

impl TopKeys {
    fn string_opened(&mut self, at: usize) {
        self.string_start = at;
        self.escaped = false;
    }

    /// A depth-1 string ended at `at`: if a `:` follows it is a key. None
    /// when the keys are not plain, or the embedding is a string with an
    /// escape (serde_json reads those; a backslash is never base64, so
    /// this only skips a decode bound to fail).
    fn string_closed(&mut self, bytes: &[u8], at: usize) -> Option<()> {
        let colon = skip_ws(bytes, at + 1);
        if bytes.get(colon) != Some(&b':') {
            if self.value_start == Some(self.string_start) && self.span.is_none() {
                if self.escaped {
                    return None;
                }
                self.span = Some(self.string_start..at + 1);
            }
            return Some(());
        }
        if self.escaped || (self.seen && &bytes[self.string_start + 1..at] == b"embedding") {
            return None;
        }
        if &bytes[self.string_start + 1..at] == b"embedding" {
            self.seen = true;
            let value = skip_ws(bytes, colon + 1);
            self.value_start = matches!(bytes.get(value), Some(b'[' | b'"')).then_some(value);
        }
        Some(())
    }

    /// A bracket at `at` brought the depth back to 1.
    fn closed_at_depth_one(&mut self, bytes: &[u8], at: usize) {
        if let (Some(start), None) = (self.value_start, &self.span)
            && start < at
            && bytes[start] == b'['
        {
            self.span = Some(start..at + 1);
        }
    }
}

/// Exact powers of ten in f64 (10^22 is the largest one exact).
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

pub(super) fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while text.get(at).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// A JSON array of numbers as f32 (serde_json's values); None for
/// anything else, or a number outside the fast path.
fn parse_f32_array(text: &[u8]) -> Option<Vec<f32>> {
    let mut at = skip_ws(text, 0);
    if text.get(at) != Some(&b'[') {
        return None;
    }
    at = skip_ws(text, at + 1);
    // ~20 bytes a number when printed from f32 values.
    let mut out = Vec::with_capacity(text.len() / 16);
    if text.get(at) == Some(&b']') {
        return (skip_ws(text, at + 1) == text.len()).then_some(out);
    }
    loop {
        let (value, next) = parse_number(text, at)?;
        out.push(value);
        at = skip_ws(text, next);
        match text.get(at)? {
            b',' => at = skip_ws(text, at + 1),
            b']' => return (skip_ws(text, at + 1) == text.len()).then_some(out),
            _ => return None,
        }
    }
}

/// One JSON number at `at`: its f32 and the index after it.
fn parse_number(text: &[u8], mut at: usize) -> Option<(f32, usize)> {
    let negative = text.get(at) == Some(&b'-');
    at += usize::from(negative);
    // The integer part: "0" alone, or a non-zero digit and more.
    let (mut significand, _, next) = match text.get(at)? {
        b'0' => (0, 1, at + 1),
        b'1'..=b'9' => digits(text, at, 0)?,
        _ => return None,
    };
    at = next;
    let (mut exponent, mut float) = (0i32, false);
    if text.get(at) == Some(&b'.') {
        let (value, count, next) = digits(text, at + 1, significand)?;
        if count == 0 {
            return None;
        }
        (significand, exponent, at, float) = (value, -i32::try_from(count).ok()?, next, true);
    }
    if matches!(text.get(at), Some(b'e' | b'E')) {
        let negative_exp = text.get(at + 1) == Some(&b'-');
        at += 1 + usize::from(matches!(text.get(at + 1), Some(b'+' | b'-')));
        let (value, count, next) = digits(text, at, 0)?;
        let value = i32::try_from(value).ok().filter(|_| count > 0)?;
        exponent = if negative_exp {
            exponent.checked_sub(value)?
        } else {
            exponent.checked_add(value)?
        };
        (at, float) = (next, true);
    }
    let value = match float {
        true => from_parts(negative, significand, exponent)? as f32,
        false => integer(negative, significand),
    };
    Some((value, at))
}

/// A number with a fraction or an exponent as the f64 serde_json makes
/// of it (the f32 is cast from it): the digits as f64, times or divided by
/// one exact power of ten.
fn from_parts(negative: bool, significand: u64, exponent: i32) -> Option<f64> {
    let power = *POW10.get(exponent.unsigned_abs() as usize)?;
    let magnitude = match exponent >= 0 {
        true => significand as f64 * power,
        false => significand as f64 / power,
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// An integer as serde_json hands it to f32: from u64, from i64 when
/// negative, and through f64 for -0 and below i64's range.
fn integer(negative: bool, significand: u64) -> f32 {
    if !negative {
        return significand as f32;
    }
    match (significand as i64).wrapping_neg() {
        n if n >= 0 => -(significand as f64) as f32,
        n => n as f32,
    }
}

/// Digits from `at` appended to `value`: (value, digit count, index
/// after them); None when the value outgrows a u64.
fn digits(text: &[u8], mut at: usize, mut value: u64) -> Option<(u64, usize, usize)> {
    let start = at;
    while let Some(eight) = eight_digits(text, at) {
        value = value.checked_mul(100_000_000)?.checked_add(eight)?;
        at += 8;
    }
    while let Some(digit) = text.get(at).map(|b| b.wrapping_sub(b'0')).filter(|d| *d <= 9) {
        value = value.checked_mul(10)?.checked_add(u64::from(digit))?;
        at += 1;
    }
    Some((value, at - start, at))
}

/// The value of the eight bytes at `at` when all are ASCII digits, in a
/// few word operations instead of eight dependent multiply-adds.
fn eight_digits(text: &[u8], at: usize) -> Option<u64> {
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    const HIGH_NIBBLES: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    let chunk: [u8; 8] = text.get(at..at + 8)?.try_into().ok()?;
    let v = u64::from_le_bytes(chunk);
    // Each byte is 0x30..=0x39: high nibble 3, and still 3 after adding 6.
    if v & HIGH_NIBBLES != ZEROS || v.wrapping_add(0x0606_0606_0606_0606) & HIGH_NIBBLES != ZEROS {
        return None;
    }
    // The first digit is the lowest byte: pairs, then fours, then eight.
    let v = v - ZEROS;
    let v = (v * 10 + (v >> 8)) & 0x00FF_00FF_00FF_00FF;
    let v = (v * 100 + (v >> 16)) & 0x0000_FFFF_0000_FFFF;
    Some((v * 10_000 + (v >> 32)) & 0xFFFF_FFFF)
}

#[cfg(test)]
mod tests;
