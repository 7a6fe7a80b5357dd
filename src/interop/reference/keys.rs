//! The keys a reference file may hold. A key given twice anywhere in the
//! file is refused (a JSON parser keeps the last and drops the other
//! without a word: a second `"nodes": []` emptied a whole file), and so is
//! a key the reference does not write at the top level or in a node,
//! which the import would otherwise drop. Unknown keys inside `meta` and
//! `payload` are kept (`reference_meta`, `reference_payload`).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Keys of the document.
pub const TOP_KEYS: [&str; 2] = ["meta", "nodes"];

/// Keys of a node.
pub const NODE_KEYS: [&str; 6] = ["node_id", "parent_id", "children_ids", "meta", "index", "payload"];

/// Keys of a node's `index`.
pub const INDEX_KEYS: [&str; 1] = ["embedding"];

/// Reads a JSON document only to refuse a key given twice in any object;
/// the error (with serde_json's line and column) names the key.
pub fn refuse_duplicate_keys(bytes: &[u8]) -> Result<(), serde_json::Error> {
    serde_json::from_slice::<UniqueKeys>(bytes).map(drop)
}

/// The first key of `obj` not among `known`, if any.
pub fn unknown_key<'a>(obj: &'a Map<String, Value>, known: &[&str]) -> Option<&'a str> {
    obj.keys().map(String::as_str).find(|k| !known.contains(k))
}

/// Any JSON value, walked to check that no object repeats a key; numbers
/// and strings are skipped, not converted.
struct UniqueKeys;

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<UniqueKeys, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        // Bounded by the input: each step consumes one element.
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = HashSet::new();
        // Bounded by the input: each step consumes one entry.
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("key {key:?} is given twice in one object")));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_found_at_any_depth() {
        assert!(refuse_duplicate_keys(br#"{"a":[{"b":1,"c":{"d":2}}],"e":"x"}"#).is_ok());
        for twice in [
            r#"{"nodes":[1],"nodes":[]}"#,
            r#"{"a":[{"b":1},{"b":1,"b":2}]}"#,
            r#"{"a":{"index":{"embedding":[1],"embedding":[2]}}}"#,
        ] {
            let e = refuse_duplicate_keys(twice.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("given twice"), "{twice}: {e}");
        }
    }
}
