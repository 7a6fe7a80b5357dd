//! The keys a reference file may hold. A key given twice anywhere in the
//! file is refused (a JSON parser keeps the last and drops the other
//! without a word: a second `"nodes": []` emptied a whole file), and so is
//! a key the reference does not write at the top level or in a node,
//! which the import would otherwise drop. Unknown keys inside `meta` and
//! `payload` are kept (`reference_meta`, `reference_payload`).

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Keys of the document.
pub const TOP_KEYS: [&str; 2] = ["meta", "nodes"];

/// Keys of a node.
pub const NODE_KEYS: [&str; 6] = ["node_id", "parent_id", "children_ids", "meta", "index", "payload"];

/// Keys of a node's `index`.
pub const INDEX_KEYS: [&str; 1] = ["embedding"];

/// A reference document in which no object repeats a key (a JSON parser
/// would keep the last; the error, with serde_json's line and column,
/// names the key; checked as each object is built), each node's
/// `index.embedding` array read into f32s beside it (keyed by the node's
/// position in `nodes`; the document holds null in its place). As a JSON
/// value an embedding takes 32 bytes a number, 8x its f32s: most of a
/// large file's parse.
pub struct Document {
    pub value: Value,
    pub embeddings: HashMap<usize, Embedding>,
}

/// A node's embedding array as read: its values up to the first that is
/// not a finite f32, which is kept (with its position) for the message.
#[derive(Debug, Default)]
pub struct Embedding {
    pub values: Vec<f32>,
    pub len: usize,
    pub first_bad: Option<(usize, Value)>,
}

/// Parses a reference document from `de` (a file read as it is parsed,
/// or bytes in memory), trailing characters refused.
pub fn parse_document<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> Result<Document, serde_json::Error> {
    let mut embeddings = HashMap::new();
    let value = Walk {
        place: Place::Top,
        embeddings: &mut embeddings,
    }
    .deserialize(&mut *de)?;
    de.end()?;
    Ok(Document { value, embeddings })
}

/// The first key of `obj` not among `known`, if any.
pub fn unknown_key<'a>(obj: &'a Map<String, Value>, known: &[&str]) -> Option<&'a str> {
    obj.keys().map(String::as_str).find(|k| !known.contains(k))
}

/// A JSON value in which no object repeats a key.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<UniqueKeys, D::Error> {
        let mut unused = HashMap::new();
        Walk {
            place: Place::Other,
            embeddings: &mut unused,
        }
        .deserialize(d)
        .map(UniqueKeys)
    }
}

/// Where in a reference document a value lies: the path down to node
/// embeddings is followed; anything else is `Other`.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    Top,
    Nodes,
    Node(usize),
    Index(usize),
    Embedding(usize),
    Other,
}

impl Place {
    fn entry(self, key: &str) -> Place {
        match (self, key) {
            (Place::Top, "nodes") => Place::Nodes,
            (Place::Node(i), "index") => Place::Index(i),
            (Place::Index(i), "embedding") => Place::Embedding(i),
            _ => Place::Other,
        }
    }
}

/// Builds a value as serde_json builds its own `Value` (a float that is
/// not finite cannot come from JSON text; it would be null, as there),
/// except for a node's embedding array (see [`Document`]).
struct Walk<'s> {
    place: Place,
    embeddings: &'s mut HashMap<usize, Embedding>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if let Place::Embedding(node) = self.place {
            let embedding = embedding(&mut seq)?;
            self.embeddings.insert(node, embedding);
            return Ok(Value::Null);
        }
        let mut items = Vec::new();
        // Bounded by the input: each step consumes one element.
        loop {
            let place = match self.place {
                Place::Nodes => Place::Node(items.len()),
                _ => Place::Other,
            };
            match seq.next_element_seed(Walk {
                place,
                embeddings: &mut *self.embeddings,
            })? {
                Some(item) => items.push(item),
                None => return Ok(Value::Array(items)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        // Bounded by the input: each step consumes one entry.
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("key {key:?} is given twice in one object")));
            }
            let place = self.place.entry(&key);
            let value = map.next_value_seed(Walk {
                place,
                embeddings: &mut *self.embeddings,
            })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// An embedding array read element by element, each narrowed to f32 as it
/// comes (values are f32s printed as Python floats: the f64 read back
/// narrows to exactly the f32 that was written).
fn embedding<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<Embedding, A::Error> {
    let mut out = Embedding::default();
    // Bounded by the input: each step consumes one element.
    while let Some(UniqueKeys(v)) = seq.next_element::<UniqueKeys>()? {
        let narrowed = v.as_f64().map(|x| x as f32).filter(|x| x.is_finite());
        match (narrowed, &out.first_bad) {
            (Some(x), None) => out.values.push(x),
            (None, None) => out.first_bad = Some((out.len, v)),
            (_, Some(_)) => {}
        }
        out.len += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Document, serde_json::Error> {
        parse_document(&mut serde_json::Deserializer::from_str(text))
    }

    #[test]
    fn a_key_given_twice_is_found_at_any_depth() {
        let text = r#"{"a":[{"b":1,"c":{"d":-2.5e3,"f":null}}],"e":"x\u00e9","g":[true,18446744073709551615]}"#;
        let plain: Value = serde_json::from_str(text).unwrap();
        assert_eq!(parse(text).unwrap().value, plain, "the same value as serde_json's");
        for twice in [
            r#"{"nodes":[1],"nodes":[]}"#,
            r#"{"a":[{"b":1},{"b":1,"b":2}]}"#,
            r#"{"nodes":[{"index":{"embedding":[1],"embedding":[2]}}]}"#,
            r#"{"nodes":[{"index":{"embedding":[{"x":1,"x":2}]}}]}"#,
        ] {
            let e = parse(twice).err().expect(twice).to_string();
            assert!(e.contains("given twice"), "{twice}: {e}");
        }
        assert!(parse(r#"{"nodes":[]} x"#).is_err(), "trailing characters");
    }

    #[test]
    fn node_embeddings_are_read_beside_the_document() {
        let text = r#"{"meta":{"index":{"embedding":[9]}},"nodes":[
            {"node_id":"a","index":{"embedding":[0.5,-1e-3,2]}},
            {"node_id":"b","index":{"embedding":[1,1e39,"x",3]}},
            {"node_id":"c","index":{"embedding":"no"}},
            7,
            {"node_id":"e","index":{"other":[1]},"embedding":[4]}]}"#;
        let doc = parse(text).unwrap();
        let mut positions: Vec<usize> = doc.embeddings.keys().copied().collect();
        positions.sort_unstable();
        assert_eq!(positions, vec![0, 1], "only node arrays at nodes[i].index.embedding");
        let a = &doc.embeddings[&0];
        assert_eq!(
            (a.values.clone(), a.len, a.first_bad.clone()),
            (vec![0.5, -1e-3, 2.0], 3, None)
        );
        let b = &doc.embeddings[&1];
        assert_eq!((b.values.clone(), b.len), (vec![1.0], 4));
        assert_eq!(
            b.first_bad.as_ref().map(|(k, v)| (*k, v.to_string())),
            Some((1, serde_json::json!(1e39).to_string()))
        );
        let plain: Value = serde_json::from_str(text).unwrap();
        assert_eq!(doc.value["nodes"][0]["index"]["embedding"], Value::Null);
        for kept in [
            "/meta/index/embedding",
            "/nodes/2/index/embedding",
            "/nodes/3",
            "/nodes/4",
        ] {
            assert_eq!(doc.value.pointer(kept), plain.pointer(kept), "{kept}");
        }
    }
}
