//! Field types shared by several requests and replies: node references,
//! attach modes, labels, node types and string maps that refuse a key
//! given twice.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::bank::{Attach, NodeRef};
use crate::format::row::{Label, NodeType};

/// A node named in JSON: an integer is its index, a string its external
/// id (external ids made only of digits are refused when written, so the
/// two never look alike on a command line or in a URL path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum NodeRefJson {
    Index(u32),
    External(String),
}

impl From<NodeRefJson> for NodeRef {
    fn from(r: NodeRefJson) -> NodeRef {
        match r {
            NodeRefJson::Index(i) => NodeRef::Index(i),
            NodeRefJson::External(s) => NodeRef::External(s),
        }
    }
}

impl From<NodeRef> for NodeRefJson {
    fn from(r: NodeRef) -> NodeRefJson {
        match r {
            NodeRef::Index(i) => NodeRefJson::Index(i),
            NodeRef::External(s) => NodeRefJson::External(s),
        }
    }
}

/// By hand rather than `untagged`: its error would not say what a node
/// reference is.
impl<'de> Deserialize<'de> for NodeRefJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NodeRefJson, D::Error> {
        struct RefVisitor;
        impl Visitor<'_> for RefVisitor {
            type Value = NodeRefJson;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a node index (integer) or an external id (string)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<NodeRefJson, E> {
                u32::try_from(v)
                    .map(NodeRefJson::Index)
                    .map_err(|_| E::custom(format!("{v} is not a valid node index")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<NodeRefJson, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("{v} is not a valid node index"))),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NodeRefJson, E> {
                Ok(NodeRefJson::External(v.to_string()))
            }
        }
        d.deserialize_any(RefVisitor)
    }
}

/// Where an inserted node goes: `"auto"`, `"root"` or `{"parent": ID}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum AttachJson {
    Auto,
    Root,
    Parent(NodeRefJson),
}

/// By hand, as the two enums below: serde_json refuses a derived enum
/// given a number, a list or null with "expected value", as if the JSON
/// were broken; this names the type given and the forms allowed.
impl<'de> Deserialize<'de> for AttachJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AttachJson, D::Error> {
        struct AttachVisitor;
        impl<'de> Visitor<'de> for AttachVisitor {
            type Value = AttachJson;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#""auto", "root" or {"parent": ID}"#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AttachJson, E> {
                match v {
                    "auto" => Ok(AttachJson::Auto),
                    "root" => Ok(AttachJson::Root),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AttachJson, A::Error> {
                let parent = match map.next_key::<String>()?.as_deref() {
                    Some("parent") => map.next_value::<NodeRefJson>()?,
                    Some(other) => return Err(de::Error::unknown_field(other, &["parent"])),
                    None => return Err(de::Error::invalid_length(0, &self)),
                };
                match map.next_key::<String>()? {
                    None => Ok(AttachJson::Parent(parent)),
                    Some(other) => Err(de::Error::custom(format!(
                        "a second key `{other}` beside `parent`: expected {{\"parent\": ID}} alone"
                    ))),
                }
            }
        }
        d.deserialize_any(AttachVisitor)
    }
}

/// A variant given by name, read through `deserialize_any` so that a
/// value of another type is named (see `AttachJson`'s `Deserialize`).
struct NamedVariant<T: 'static> {
    /// (name, variant), every name the JSON may give.
    names: &'static [(&'static str, T)],
}

impl<T: Copy> Visitor<'_> for NamedVariant<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<String> = self.names.iter().map(|(n, _)| format!("{n:?}")).collect();
        write!(f, "one of {}", names.join(", "))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        match self.names.iter().find(|(n, _)| *n == v) {
            Some((_, t)) => Ok(*t),
            None => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }
}

impl From<AttachJson> for Attach {
    fn from(a: AttachJson) -> Attach {
        match a {
            AttachJson::Auto => Attach::Auto,
            AttachJson::Root => Attach::Root,
            AttachJson::Parent(r) => Attach::Parent(r.into()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum LabelJson {
    #[serde(rename = "SUCCESS")]
    Success,
    #[serde(rename = "FAILURE")]
    Failure,
}

impl<'de> Deserialize<'de> for LabelJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LabelJson, D::Error> {
        const NAMES: &[(&str, LabelJson)] = &[("SUCCESS", LabelJson::Success), ("FAILURE", LabelJson::Failure)];
        d.deserialize_any(NamedVariant { names: NAMES })
    }
}

impl From<LabelJson> for Label {
    fn from(l: LabelJson) -> Label {
        match l {
            LabelJson::Success => Label::Success,
            LabelJson::Failure => Label::Failure,
        }
    }
}

impl From<Label> for LabelJson {
    fn from(l: Label) -> LabelJson {
        match l {
            Label::Success => LabelJson::Success,
            Label::Failure => LabelJson::Failure,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum NodeTypeJson {
    #[serde(rename = "ROOT")]
    Root,
    #[serde(rename = "RESIDUAL")]
    Residual,
}

impl<'de> Deserialize<'de> for NodeTypeJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NodeTypeJson, D::Error> {
        const NAMES: &[(&str, NodeTypeJson)] = &[("ROOT", NodeTypeJson::Root), ("RESIDUAL", NodeTypeJson::Residual)];
        d.deserialize_any(NamedVariant { names: NAMES })
    }
}

impl From<NodeType> for NodeTypeJson {
    fn from(t: NodeType) -> NodeTypeJson {
        match t {
            NodeType::Root => NodeTypeJson::Root,
            NodeType::Residual => NodeTypeJson::Residual,
        }
    }
}

/// A JSON object of string values (a payload's fields). Unlike a plain
/// map it refuses a key given twice instead of keeping the last value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct Fields(pub BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fields, D::Error> {
        struct FieldsVisitor;
        impl<'de> Visitor<'de> for FieldsVisitor {
            type Value = Fields;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of string values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut out = BTreeMap::new();
                // Bounded by the input: each step consumes one entry.
                while let Some(key) = map.next_key::<String>()? {
                    let value: String = map.next_value()?;
                    if out.contains_key(&key) {
                        return Err(de::Error::custom(format!("duplicate key \"{key}\"")));
                    }
                    out.insert(key, value);
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(FieldsVisitor)
    }
}

/// A `T` taken only from a JSON object. A derived struct also accepts a
/// positional array (`["task","root",..]` for `{"tree":..,"attach":..}`),
/// which no face documents: a body in another shape would be stored as
/// if it were well formed. The map is handed to `T` as it comes, so a
/// path-tracking deserializer still names the key at fault inside it.
#[derive(Debug)]
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ObjectOnly<T>, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(ObjectVisitor(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}

/// `deserialize_with` for a list of objects (`ObjectOnly` per item).
pub fn objects_only<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    let items = Vec::<ObjectOnly<T>>::deserialize(d)?;
    Ok(items.into_iter().map(|ObjectOnly(item)| item).collect())
}
