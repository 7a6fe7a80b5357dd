use super::*;
use crate::bank::{Attach, NewNode, NodeRef};
use crate::format::row::Label;

const GOOD: &str = r#"{"tree":"task","attach":{"parent":"abc"},"label":"FAILURE","scenario":"s","payload":{"k":"v"},"embedding":[1,0.5],"id":"x1"}"#;

fn refused<T: serde::de::DeserializeOwned + std::fmt::Debug>(text: &str) -> String {
    match parse_object::<T>(text) {
        Err(ApiError::Request(m)) => m,
        other => panic!("{text} not refused as a request: {other:?}"),
    }
}

#[test]
fn insert_request_becomes_a_new_node() {
    let node: NewNode = parse_object::<InsertRequest>(GOOD).unwrap().into();
    assert_eq!(node.tree, "task");
    assert_eq!(node.attach, Attach::Parent(NodeRef::External("abc".into())));
    assert_eq!(node.label, Label::Failure);
    assert_eq!(node.payload.fields.get("k").map(String::as_str), Some("v"));
    assert_eq!(node.embedding, vec![1.0, 0.5]);
    assert_eq!(node.external_id.as_deref(), Some("x1"));
    let by_index = GOOD.replace(r#"{"parent":"abc"}"#, r#"{"parent":7}"#);
    let node: NewNode = parse_object::<InsertRequest>(&by_index).unwrap().into();
    assert_eq!(node.attach, Attach::Parent(NodeRef::Index(7)));
}

#[test]
fn unknown_and_duplicate_keys_are_named() {
    let typo = GOOD.replace(r#""id":"x1""#, r#""ID":"x1""#);
    assert!(refused::<InsertRequest>(&typo).contains("unknown field `ID`"));
    let twice = GOOD.replace(r#""label":"FAILURE""#, r#""label":"FAILURE","label":"SUCCESS""#);
    assert!(refused::<InsertRequest>(&twice).contains("duplicate field `label`"));
    let payload_twice = GOOD.replace(r#"{"k":"v"}"#, r#"{"k":"v","k":"w"}"#);
    let m = refused::<InsertRequest>(&payload_twice);
    assert!(m.contains("duplicate key \"k\"") && m.contains("payload"), "{m}");
    let query = r#"{"tree":"t","embedding":[1],"tua":0.5}"#;
    assert!(refused::<QueryRequest>(query).contains("unknown field `tua`"));
}

#[test]
fn messages_name_the_value_at_fault() {
    let m = refused::<InsertRequest>(&GOOD.replace(r#"{"k":"v"}"#, r#"{"k":1}"#));
    assert!(m.starts_with("\"payload.k\": invalid type: integer `1`"), "{m}");
    let m = refused::<InsertRequest>(&GOOD.replace("[1,0.5]", r#"[1,"x"]"#));
    assert!(m.starts_with("\"embedding[1]\""), "{m}");
    let m = refused::<InsertRequest>(&GOOD.replace("\"FAILURE\"", "\"MAYBE\""));
    assert!(m.contains("label") && m.contains("SUCCESS"), "{m}");
    let m = refused::<InsertRequest>(&GOOD.replace(r#"{"parent":"abc"}"#, r#"{"parent":-1}"#));
    assert!(m.contains("-1 is not a valid node index"), "{m}");
    let m = refused::<InsertRequest>(r#"{"tree": NaN}"#);
    assert!(m.contains("column 10") && m.contains("NaN"), "{m}");
}

#[test]
fn only_objects_are_requests() {
    let positional = r#"["task", "root", "SUCCESS", "s", {}, [1]]"#;
    assert_eq!(
        refused::<InsertRequest>(positional),
        "expected a JSON object, got an array"
    );
    assert_eq!(refused::<QueryRequest>(" 12"), "expected a JSON object, got a number");
    let m = refused::<InsertRequest>(&format!("{GOOD} {{}}"));
    assert!(m.contains("trailing characters"), "{m}");
}

#[test]
fn query_options_follow_init_ranges() {
    let defaults = QueryDefaults {
        k: 3,
        include_consolidated: true,
    };
    let ok: QueryRequest = parse_object(r#"{"tree":"t","embedding":[1],"tau":-1,"eps":0}"#).unwrap();
    let (tree, query) = ok.into_parts();
    let options = query.options(defaults).unwrap();
    assert_eq!(tree, "t");
    assert_eq!((options.k, options.include_consolidated), (3, true));
    for (text, words) in [
        (r#""tau":1.5"#, "tau 1.5 outside -1..=1"),
        (r#""tau":1e39"#, "tau inf outside -1..=1"),
        (r#""eps":-0.1"#, "eps -0.1 must be finite and >= 0"),
        (r#""k":0"#, "k must be at least 1"),
    ] {
        let req: QueryRequest = parse_object(&format!(r#"{{"tree":"t","embedding":[1],{text}}}"#)).unwrap();
        let e = req.into_parts().1.options(defaults).unwrap_err().to_string();
        assert!(e.contains(words), "{text}: {e}");
    }
}

#[test]
fn replies_serialise_as_the_cli_always_printed() {
    let reply = InsertReply {
        id: 4,
        tree: "task".into(),
        node_type: NodeTypeJson::Residual,
        parent: Some(1),
        depth: 2,
        matched: Some(MatchedAt { id: 1, score: 0.5 }),
        external_id: None,
    };
    let text = serde_json::to_string(&reply).unwrap();
    assert_eq!(
        text,
        r#"{"id":4,"tree":"task","type":"RESIDUAL","parent":1,"depth":2,"match":{"id":1,"score":0.5}}"#
    );
    assert_eq!(serde_json::from_str::<InsertReply>(&text).unwrap(), reply);
    let error = LineError {
        line: 3,
        error: "x".into(),
    };
    assert_eq!(serde_json::to_string(&error).unwrap(), r#"{"line":3,"error":"x"}"#);
}

#[cfg(feature = "schema")]
#[test]
fn schemas_describe_the_strict_requests() {
    let schema = serde_json::to_value(schemars::schema_for!(InsertRequest)).unwrap();
    assert_eq!(schema["additionalProperties"], false, "{schema}");
    let required = schema["required"].as_array().unwrap();
    for key in ["tree", "attach", "label", "scenario", "payload", "embedding"] {
        assert!(required.contains(&key.into()), "{key} not required: {schema}");
    }
    assert!(!required.contains(&"id".into()));
    // Both spellings of an embedding are offered.
    assert_eq!(schema["properties"]["embedding"]["$ref"], "#/$defs/EmbeddingSchema");
    let spellings = schema["$defs"]["EmbeddingSchema"].to_string();
    assert!(
        spellings.contains(r#""type":"array""#) && spellings.contains(r#""type":"string""#),
        "{spellings}"
    );
    let query = serde_json::to_value(schemars::schema_for!(TreeQuery)).unwrap();
    assert!(query["properties"].get("tree").is_none() && query["properties"].get("tau").is_some());
}

#[test]
fn a_base64_embedding_reads_as_the_same_floats() {
    // Values no short decimal spells exactly, a negative zero and a subnormal.
    let values = [0.1f32, -0.0, f32::MIN_POSITIVE / 4.0, 1.0e30, -3.25];
    let text = embedding::encode_base64_f32(&values);
    let insert = GOOD.replace("[1,0.5]", &format!("\"{text}\""));
    let node = parse_object::<InsertRequest>(&insert).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&node.embedding), bits(&values));
    let query: QueryRequest = parse_object(&format!(r#"{{"tree":"t","embedding":"{text}"}}"#)).unwrap();
    assert_eq!(bits(&query.embedding), bits(&values));
    let tree_query: TreeQuery = parse_object(&format!(r#"{{"embedding":"{text}","k":2}}"#)).unwrap();
    assert_eq!(bits(&tree_query.embedding), bits(&values));
    // The little-endian layout, spelled out: 1.0f32 is 00 00 80 3f.
    let one: QueryRequest = parse_object(r#"{"tree":"t","embedding":"AACAPw=="}"#).unwrap();
    assert_eq!(one.embedding, vec![1.0]);
}

#[test]
fn a_bad_base64_embedding_is_named() {
    let m = refused::<InsertRequest>(&GOOD.replace("[1,0.5]", "\"AACAP\""));
    assert!(m.starts_with("\"embedding\"") && m.contains("base64"), "{m}");
    // Valid base64 of 6 bytes: not whole f32 values.
    let m = refused::<QueryRequest>(r#"{"tree":"t","embedding":"AACAPwAA"}"#);
    assert!(m.starts_with("\"embedding\"") && m.contains("6 bytes"), "{m}");
    let m = refused::<QueryRequest>(r#"{"tree":"t","embedding":{"a":1}}"#);
    assert!(m.contains("base64 string"), "{m}");
}

/// Bytes over base64's alphabet, its padding and a few bytes outside it
/// (non-ASCII too), long enough for the SIMD engine's blocks, or a real
/// encoding with one byte changed: the near misses where two decoders
/// could differ (padding, trailing bits, length).
fn base64_like() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let symbols = proptest::sample::select(b"AQgw/+9zB=\n -*\xe9\x80".to_vec());
    let loose = proptest::collection::vec(symbols, 0..120);
    let bytes = proptest::collection::vec(any::<u8>(), 0..120);
    let mutated =
        (bytes, any::<usize>(), proptest::sample::select(b"A=/_\n\xff".to_vec())).prop_map(|(b, at, with)| {
            let mut text = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b).into_bytes();
            if !text.is_empty() {
                let i = at % text.len();
                text[i] = with;
            }
            text
        });
    let whole = proptest::collection::vec(any::<u8>(), 0..120)
        .prop_map(|b| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b).into_bytes());
    // The symbol before the padding replaced: most carry bits the value
    // has no room for (non-canonical), which a lax decoder would drop.
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".to_vec();
    let tail = (
        proptest::collection::vec(any::<u8>(), 1..120),
        proptest::sample::select(alphabet),
    )
        .prop_map(|(b, with)| {
            let mut text = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b).into_bytes();
            let last = text.iter().rposition(|c| *c != b'=').unwrap();
            text[last] = with;
            text
        });
    prop_oneof![loose, mutated, whole, tail]
}

proptest::proptest! {
    /// `decode_base64_f32` decodes with the SIMD engine; the scalar engine
    /// words its refusals and is what the schema describes. It must take
    /// and refuse the same strings, to the same bytes, and say why.
    #[test]
    fn the_simd_engine_decodes_as_the_scalar_one(text in base64_like()) {
        use base64::Engine as _;
        let scalar = base64::engine::general_purpose::STANDARD.decode(&text).ok();
        let floats = embedding::decode_base64_f32(&text);
        match scalar {
            Some(bytes) if bytes.len() % 4 == 0 => {
                let want: Vec<u32> = bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
                let got: Vec<u32> = floats.unwrap().iter().map(|x| x.to_bits()).collect();
                proptest::prop_assert_eq!(got, want);
            }
            Some(bytes) => {
                let said = format!("decodes to {} bytes", bytes.len());
                proptest::prop_assert!(floats.unwrap_err().contains(&said));
            }
            None => proptest::prop_assert!(floats.unwrap_err().starts_with("not standard base64 (")),
        }
    }
}

#[test]
fn a_mode_label_or_type_of_the_wrong_json_type_is_named_not_called_malformed() {
    let with = |from: &str, to: &str| GOOD.replace(from, to);
    let attach = r#""attach":{"parent":"abc"}"#;
    for (given, named) in [
        ("5", "integer `5`"),
        ("null", "null"),
        ("[]", "sequence"),
        ("true", "boolean `true`"),
    ] {
        let m = refused::<InsertRequest>(&with(attach, &format!(r#""attach":{given}"#)));
        assert!(
            m.contains(named) && m.contains(r#""auto", "root" or {"parent": ID}"#),
            "{m}"
        );
        let m = refused::<InsertRequest>(&with(r#""label":"FAILURE""#, &format!(r#""label":{given}"#)));
        assert!(m.contains(named) && m.contains(r#"one of "SUCCESS", "FAILURE""#), "{m}");
    }
    let m = refused::<InsertRequest>(&with(attach, r#""attach":"roots""#));
    assert!(m.contains(r#"invalid value: string "roots""#), "{m}");
    let m = refused::<InsertRequest>(&with(attach, r#""attach":{"paren":1}"#));
    assert!(m.contains("unknown field `paren`"), "{m}");
    let m = refused::<InsertRequest>(&with(attach, r#""attach":{"parent":1,"root":2}"#));
    assert!(m.contains("second key `root`"), "{m}");
    let m = refused::<InsertRequest>(&with(attach, r#""attach":{}"#));
    assert!(m.contains("invalid length 0"), "{m}");
    let m = refused::<InsertRequest>(&with(attach, r#""attach":{"parent":[1]}"#));
    assert!(m.contains("a node index (integer) or an external id (string)"), "{m}");
    for (text, mode) in [(r#""auto""#, Attach::Auto), (r#""root""#, Attach::Root)] {
        let node: NewNode = parse_object::<InsertRequest>(&with(attach, &format!(r#""attach":{text}"#)))
            .unwrap()
            .into();
        assert_eq!(node.attach, mode);
    }
    for (text, t) in [("ROOT", NodeTypeJson::Root), ("RESIDUAL", NodeTypeJson::Residual)] {
        assert_eq!(serde_json::from_str::<NodeTypeJson>(&format!("{text:?}")).unwrap(), t);
    }
    let e = serde_json::from_str::<NodeTypeJson>("0").unwrap_err().to_string();
    assert!(e.contains(r#"integer `0`, expected one of "ROOT", "RESIDUAL""#), "{e}");
}
