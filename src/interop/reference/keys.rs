//! The keys a reference file may hold. A key given twice anywhere in the
//! file is refused (a JSON parser keeps the last and drops the other
//! without a word: a second `"nodes": []` emptied a whole file), and so is
//! a key the reference does not write at the top level or in a node,
//! which the import would otherwise drop. Unknown keys inside `meta` and
//! `payload` are kept (`reference_meta`, `reference_payload`).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Keys of the document.
pub const TOP_KEYS: [&str; 2] = ["meta", "nodes"];

/// Keys of a node.
pub const NODE_KEYS: [&str; 6] = ["node_id", "parent_id", "children_ids", "meta", "index", "payload"];

/// Keys of a node's `index`.
pub const INDEX_KEYS: [&str; 1] = ["embedding"];

/// Parses a JSON document as `serde_json::from_slice::<Value>` does, and
/// refuses a key given twice in any object; the error (with serde_json's
/// line and column) names the key. One pass: the check is made as each
/// object is built.
pub fn parse_unique_keys(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<UniqueKeys>(bytes).map(|v| v.0)
}

/// The first key of `obj` not among `known`, if any.
pub fn unknown_key<'a>(obj: &'a Map<String, Value>, known: &[&str]) -> Option<&'a str> {
    obj.keys().map(String::as_str).find(|k| !known.contains(k))
}

/// A JSON value in which no object repeats a key.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<UniqueKeys, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

/// Built as serde_json builds its own `Value` (a float that is not finite
/// cannot come from JSON text; it would be null, as there).
impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Number::from_f64(v).map_or(Value::Null, Value::Number)))
    }
    fn visit_str<E>(self, v: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::String(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        let mut items = Vec::new();
        // Bounded by the input: each step consumes one element.
        while let Some(item) = seq.next_element::<UniqueKeys>()? {
            items.push(item.0);
        }
        Ok(UniqueKeys(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut object = Map::new();
        // Bounded by the input: each step consumes one entry.
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("key {key:?} is given twice in one object")));
            }
            let value = map.next_value::<UniqueKeys>()?;
            object.insert(key, value.0);
        }
        Ok(UniqueKeys(Value::Object(object)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_found_at_any_depth() {
        let text = r#"{"a":[{"b":1,"c":{"d":-2.5e3,"f":null}}],"e":"x\u00e9","g":[true,18446744073709551615]}"#;
        let plain: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            parse_unique_keys(text.as_bytes()).unwrap(),
            plain,
            "the same value as serde_json's"
        );
        for twice in [
            r#"{"nodes":[1],"nodes":[]}"#,
            r#"{"a":[{"b":1},{"b":1,"b":2}]}"#,
            r#"{"a":{"index":{"embedding":[1],"embedding":[2]}}}"#,
        ] {
            let e = parse_unique_keys(twice.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("given twice"), "{twice}: {e}");
        }
    }
}
