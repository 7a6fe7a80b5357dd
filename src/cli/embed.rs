//! A toy text embedder for the demo: feature hashing of words and
//! character trigrams into a small vector. It has no notion of meaning,
//! only of shared spelling, which is enough to show the tree mechanics
//! deterministically without a model. Real embeddings come from the
//! caller (or, later, from the `agent` feature).

/// Dimension of the toy vectors.
pub const TOY_DIM_COUNT: usize = 64;

/// Words that every sentence shares; hashing them would make unrelated
/// texts look alike.
const STOP_WORDS: [&str; 12] = [
    "a", "an", "the", "in", "on", "of", "to", "and", "with", "it", "is", "then",
];

/// Trigrams count less than whole words: they only smooth over
/// inflections ("boil" / "boiling").
const TRIGRAM_WEIGHT: f32 = 0.35;

/// FNV-1a: tiny, stable across platforms and Rust versions (unlike the
/// standard hasher), so the demo prints the same numbers everywhere.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Adds a feature: one bucket, with a hashed sign so that collisions
/// cancel out on average instead of piling up.
fn add_feature(v: &mut [f32], feature: &[u8], weight: f32) {
    let h = fnv1a(feature);
    let bucket = (h % TOY_DIM_COUNT as u64) as usize;
    let sign = if (h >> 63) == 0 { 1.0 } else { -1.0 };
    v[bucket] += sign * weight;
}

/// Embeds `text` into a unit vector of `TOY_DIM_COUNT` floats. Text with
/// no usable word gets a fixed non-zero vector (the bank rejects zero).
pub fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; TOY_DIM_COUNT];
    let lower = text.to_lowercase();
    let words = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !STOP_WORDS.contains(w));
    for word in words {
        let mut tagged = b"w:".to_vec();
        tagged.extend_from_slice(word.as_bytes());
        add_feature(&mut v, &tagged, 1.0);
        let padded = format!(" {word} ");
        let bytes = padded.as_bytes();
        for gram in bytes.windows(3) {
            add_feature(&mut v, gram, TRIGRAM_WEIGHT);
        }
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm < 1e-6 {
        v[0] = 1.0;
        return v;
    }
    v.iter().map(|x| x / norm).collect()
}

/// Cosine of two unit vectors.
#[cfg(test)]
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_unit_and_discriminating() {
        let a = embed("boil water in the kitchen");
        assert_eq!(a, embed("Boil water in the kitchen!"));
        assert!((cosine(&a, &a) - 1.0).abs() < 1e-5);
        let near = embed("boil water in the kitchen using the stove");
        let far = embed("grow an orange plant in the greenhouse");
        assert!(cosine(&a, &near) > cosine(&a, &far));
        assert_eq!(embed("").len(), TOY_DIM_COUNT);
    }
}
