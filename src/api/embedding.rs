//! The two spellings of an embedding in a request: a JSON array of
//! numbers, or a string holding the standard base64 (RFC 4648, padded) of
//! the vector's f32 values, 4 little-endian bytes each.
//!
//! Why a second spelling: a 768-float vector written as decimal text is
//! 8-16 KB and parsing it was the largest single cost of a durable insert
//! over HTTP; as base64 it is 4 KB, decoded at memory speed, and every
//! value arrives bit for bit as the client held it. numpy writes it with
//! `base64.b64encode(v.astype("<f4").tobytes())`.
//!
//! Replies always spell embeddings as arrays.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// What the schema documents for an embedding field (the field itself is
/// a `Vec<f32>` read by [`embedding`]).
#[cfg(feature = "schema")]
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum EmbeddingSchema {
    /// The values as JSON numbers.
    Numbers(Vec<f32>),
    /// Standard base64, with padding, of the values as 4-byte
    /// little-endian f32.
    Base64(#[schemars(regex(pattern = r"^[A-Za-z0-9+/]*={0,2}$"))] String),
}

/// Reads one embedding in either spelling (`deserialize_with`).
pub fn embedding<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
    d.deserialize_any(EmbeddingVisitor)
}

/// Reads a list of embeddings, each in either spelling.
pub fn embeddings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<f32>>, D::Error> {
    Ok(Vec::<OneEmbedding>::deserialize(d)?.into_iter().map(|e| e.0).collect())
}

struct OneEmbedding(Vec<f32>);

impl<'de> Deserialize<'de> for OneEmbedding {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OneEmbedding, D::Error> {
        embedding(d).map(OneEmbedding)
    }
}

struct EmbeddingVisitor;

impl<'de> Visitor<'de> for EmbeddingVisitor {
    type Value = Vec<f32>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of numbers or a base64 string of little-endian f32 values")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<f32>, A::Error> {
        // The hint comes from the request; capped so a lying one cannot
        // reserve much before the values arrive.
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(x) = seq.next_element::<f32>()? {
            values.push(x);
        }
        Ok(values)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<f32>, E> {
        decode_base64_f32(text.as_bytes()).map_err(E::custom)
    }
}

/// The f32 values a base64 string holds; the message says what is wrong.
///
/// Decoded by the `base64` crate's SIMD engine straight into the vector's
/// memory: on a 768-float embedding ~7x its scalar engine, whose decode
/// was the largest single user-space cost of a durable insert. The SIMD
/// engine takes and refuses the strings the scalar one does
/// (`tests::the_simd_engine_decodes_as_the_scalar_one`); a refused string
/// is decoded again by the scalar engine only for its message.
pub fn decode_base64_f32(text: &[u8]) -> Result<Vec<f32>, String> {
    // Padded base64 is whole groups of 4; the last may end in 1 or 2 `=`.
    let padding = text.iter().rev().take(2).take_while(|b| **b == b'=').count();
    let bytes_len = (text.len() / 4 * 3).saturating_sub(padding);
    if !text.len().is_multiple_of(4) || !bytes_len.is_multiple_of(4) {
        return Err(refusal(text));
    }
    let mut values = vec![0f32; bytes_len / 4];
    match simd_engine().decode_slice(text, bytemuck::cast_slice_mut::<f32, u8>(&mut values)) {
        Ok(written) if written == bytes_len => {}
        _ => return Err(refusal(text)),
    }
    // The bytes are little-endian: a no-op on little-endian hosts.
    for x in &mut values {
        *x = f32::from_bits(u32::from_le(x.to_bits()));
    }
    Ok(values)
}

/// The standard padded engine with the best instructions the CPU has,
/// detected once.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn simd_engine() -> &'static base64::engine::Simd {
    static ENGINE: std::sync::LazyLock<base64::engine::Simd> =
        std::sync::LazyLock::new(|| base64::engine::Simd::standard(base64::engine::general_purpose::PAD));
    &ENGINE
}

/// Targets without a SIMD engine use the scalar one.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd_engine() -> &'static base64::engine::GeneralPurpose {
    &STANDARD
}

/// Why `text` is refused, in the `base64` crate's words: not standard
/// padded base64, or not whole f32 values.
fn refusal(text: &[u8]) -> String {
    match STANDARD.decode(text) {
        Err(e) => format!("not standard base64 ({e}); expected an array of numbers or base64 of f32 values"),
        Ok(bytes) => format!(
            "base64 decodes to {} bytes, not a whole number of 4-byte f32 values",
            bytes.len()
        ),
    }
}

/// The base64 spelling of `values` (tests and load generators).
pub fn encode_base64_f32(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    STANDARD.encode(bytes)
}
