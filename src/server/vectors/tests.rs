use proptest::prelude::*;

use super::*;

const DEPTH: usize = 32;

fn body(embedding: &str) -> String {
    format!(
        r#"{{"tree":"task","attach":"root","label":"SUCCESS","scenario":"s \"q\" [x]","payload":{{"k":"v"}},"embedding":{embedding}}}"#
    )
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The fast path's answer and serde_json's whole-body parse agree: the
/// same request (embedding bit for bit) or the same error.
fn agrees(text: &str) {
    let ours = parse_with_embedding::<InsertRequest>(text.as_bytes(), DEPTH);
    let theirs = parse_json::<InsertRequest>(text.as_bytes(), DEPTH);
    match (ours, theirs) {
        (Ok(mut a), Ok(mut b)) => {
            assert_eq!(bits(&a.embedding), bits(&b.embedding), "{text}");
            a.embedding.clear();
            b.embedding.clear();
            assert_eq!(a, b, "{text}");
        }
        (Err(a), Err(b)) => assert_eq!((a.message, a.field), (b.message, b.field), "{text}"),
        (a, b) => panic!("{text}: fast path {:?}, serde_json {:?}", a.map(|_| ()), b.map(|_| ())),
    }
}

/// The fast path itself takes the body (not serde_json behind it).
fn fast(text: &str) -> Vec<f32> {
    fast_parse::<InsertRequest>(text.as_bytes(), DEPTH)
        .unwrap_or_else(|| panic!("the fast path refused {text}"))
        .embedding
}

#[test]
fn numbers_become_the_f32_serde_json_makes() {
    let numbers = [
        "0",
        "-0",
        "1",
        "-1",
        "0.5",
        "-0.0",
        "1e3",
        "1E+3",
        "2e-3",
        "1.5e-3",
        "-7.25E2",
        "0.1",
        "0.30000000000000004",
        "-0.027329500764608383",
        "0.0000012345678901234567",
        "9007199254740993",
        "123456789012345678",
        "-9223372036854775808",
        "-9223372036854775809",
        "18446744073709551615",
        "1e22",
        "1e-22",
        "3.4028235e38",
        "16777217",
        "-16777217",
        "0.000000059604645",
        "1.00000005960464477539",
        // 2^60 + 2^36 + 1: just above halfway between two f32, but exactly
        // halfway once rounded to f64 (serde_json goes straight from u64).
        "1152921573326323713",
        "-1152921573326323713",
    ];
    for n in numbers {
        agrees(&body(&format!("[{n}]")));
        agrees(&body(&format!("[ 1 , {n} ,\n\t{n}\r]")));
    }
    assert_eq!(bits(&fast(&body("[-0]"))), bits(&[-0.0]));
    assert_eq!(fast(&body("[16777217, -1.5e-3, 0.25]")), [16777216.0, -0.0015, 0.25]);
}

/// Outside the fast path (too many digits for a u64, exponents beyond
/// 10^22) or not JSON numbers at all: serde_json decides.
#[test]
fn other_numbers_and_broken_arrays_go_to_serde_json() {
    let others = [
        "18446744073709551616",
        "0.12345678901234567890123",
        "1e23",
        "4e-50",
        "1e39",
        "1e400",
        "01",
        "1.",
        ".5",
        "+1",
        "1e",
        "1e+",
        "--1",
        "-",
        "NaN",
        "1.5.5",
        "0x10",
        "1 2",
        "\"1\"",
        "[1]",
        "{}",
        "null",
        "1,",
        ",1",
        "1]",
        "true",
    ];
    for n in others {
        agrees(&body(&format!("[{n}]")));
        assert!(
            fast_parse::<InsertRequest>(body(&format!("[{n}]")).as_bytes(), DEPTH).is_none(),
            "{n}"
        );
    }
    for array in ["[]", "[ ]", "[1,2", "1", "null", "\"[1]\"", "[1]]"] {
        agrees(&body(array));
    }
    let e = parse_with_embedding::<InsertRequest>(body("[1,\"x\"]").as_bytes(), DEPTH).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("embedding[1]"), "{}", e.message);
}

/// Only the top level's plain `embedding` key is cut out: a key spelt
/// with an escape, the key twice, the word in a string or in a nested
/// object leave the body to serde_json or to the right array.
#[test]
fn only_the_top_level_key_is_taken() {
    let cases = [
        r#"{"tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{},"embedd\u0069ng":[1,2]}"#,
        r#"{"tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{},"embedding":[1],"embedding":[2]}"#,
        r#"{"embedding" : [3,4] ,"tree":"t","attach":"root","label":"SUCCESS","scenario":"\"embedding\":[9]","payload":{"embedding":"[5]"}}"#,
        r#"{"tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{"embedding":"[5]"},"embedding":[6]}"#,
        r#"{"tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{"embedding":[5]},"embedding":[6]}"#,
        r#"{"tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{},"embedding":[1],"extra":1}"#,
        r#"["embedding",[1]]"#,
        r#"{"tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{},"embedding":[1]} x"#,
    ];
    for text in cases {
        agrees(text);
    }
    assert!(fast_parse::<InsertRequest>(cases[0].as_bytes(), DEPTH).is_none());
    assert_eq!(fast(cases[2]), [3.0, 4.0]);
    assert_eq!(fast(cases[3]), [6.0]);
}

/// A body nested beyond the limit is refused as by `parse_json`.
#[test]
fn the_nesting_limit_holds() {
    let deep = body(&format!("{}1{}", "[".repeat(40), "]".repeat(40)));
    agrees(&deep);
    let e = parse_with_embedding::<InsertRequest>(deep.as_bytes(), DEPTH).unwrap_err();
    assert!(e.message.contains("nested deeper"), "{}", e.message);
}

/// A base64 embedding is decoded from the body's bytes when its string
/// has no escape; anything else (escapes, bad base64, not whole floats,
/// not a string, the key twice) is serde_json's to read or refuse.
#[test]
fn a_base64_string_is_cut_out_and_decoded() {
    assert_eq!(fast(&body("\"AACAPw==\"")), [1.0]);
    assert_eq!(fast(&body(" \"AACAPwAAAMA=\" ")), [1.0, -2.0]);
    assert_eq!(fast(&body("\"\"")), Vec::<f32>::new());
    let escaped = [r#""AACAPw\u003d\u003d""#, r#""AAC\/PwAAAMA=""#];
    for text in escaped {
        agrees(&body(text));
        assert!(
            fast_parse::<InsertRequest>(body(text).as_bytes(), DEPTH).is_none(),
            "{text}"
        );
    }
    assert_eq!(
        parse_with_embedding::<InsertRequest>(body(escaped[0]).as_bytes(), DEPTH)
            .unwrap()
            .embedding,
        [1.0]
    );
    let refused = [
        "\"AACAP\"",
        "\"AACAPwAA\"",
        r#""AACA\u00e9w==""#,
        "\"AACA\u{e9}w==\"",
        "\"AACAPw== \"",
        "\"AACAPw==\" \"x\"",
    ];
    for text in refused {
        agrees(&body(text));
        assert!(
            parse_with_embedding::<InsertRequest>(body(text).as_bytes(), DEPTH).is_err(),
            "{text}"
        );
    }
    let twice = r#"{"tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{},"embedding":"AACAPw==","embedding":[2]}"#;
    agrees(twice);
    assert!(fast_parse::<InsertRequest>(twice.as_bytes(), DEPTH).is_none());
    let nested = r#"{"embedding":"AAAAQA==","tree":"t","attach":"root","label":"SUCCESS","scenario":"s","payload":{"embedding":"AACAPw=="}}"#;
    agrees(nested);
    assert_eq!(fast(nested), [2.0]);
}

/// How a client may print a float: Rust's shortest f32 and f64 forms,
/// exponent forms, fixed digits, integers.
fn printed(x: f32, style: u8) -> String {
    match style % 6 {
        0 => serde_json::to_string(&f64::from(x)).unwrap(),
        1 => serde_json::to_string(&x).unwrap(),
        2 => format!("{x:e}"),
        3 => format!("{:.12}", f64::from(x)),
        4 => format!("{:E}", f64::from(x)),
        _ => format!("{}", (x * 1000.0).round() as i64),
    }
}

proptest! {
    /// Digits and an exponent make serde_json's f64 bit for bit (the f32
    /// is one cast from it; a cast of a 1-ulp different f64 seldom shows).
    #[test]
    fn parts_make_serde_json_s_f64(significand in any::<u64>(), exponent in -22i32..=22, negative in any::<bool>()) {
        let text = format!("{}{significand}e{exponent}", if negative { "-" } else { "" });
        let theirs: f64 = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(from_parts(negative, significand, exponent).map(f64::to_bits), Some(theirs.to_bits()), "{}", text);
    }

    /// Random vectors printed every way agree with serde_json bit for bit,
    /// and the fast path takes them (a fast path that always fell back
    /// would agree too).
    #[test]
    fn printed_vectors_agree_with_serde_json(
        values in prop::collection::vec(prop_oneof![-1.0f32..1.0, -1e-6f32..1e-6, -1e6f32..1e6], 0..40),
        style in any::<u8>(),
        spaced in any::<bool>(),
    ) {
        let sep = if spaced { " ,\n " } else { "," };
        let items: Vec<String> = values.iter().enumerate().map(|(i, x)| printed(*x, style.wrapping_add(i as u8))).collect();
        let text = body(&format!("[{}]", items.join(sep)));
        agrees(&text);
        let ours = fast_parse::<InsertRequest>(text.as_bytes(), DEPTH);
        let theirs = parse_json::<InsertRequest>(text.as_bytes(), DEPTH).unwrap();
        // Every printed form here fits the fast path but for long
        // fixed-point tails of tiny numbers (more digits than a u64 holds).
        if let Some(ours) = ours {
            prop_assert_eq!(bits(&ours.embedding), bits(&theirs.embedding));
        } else {
            prop_assert!(items.iter().any(|i| i.len() > 20 || i.contains("e-") || i.contains("E-")), "{}", text);
        }
    }

    /// Any f32 bits spelt as base64 arrive bit for bit through the fast
    /// path, as serde_json reads them.
    #[test]
    fn base64_vectors_agree_with_serde_json(raw in prop::collection::vec(any::<u32>(), 0..40)) {
        let values: Vec<f32> = raw.iter().map(|b| f32::from_bits(*b)).collect();
        let text = body(&format!("\"{}\"", crate::api::embedding::encode_base64_f32(&values)));
        agrees(&text);
        let ours = fast_parse::<InsertRequest>(text.as_bytes(), DEPTH).expect("the fast path takes plain base64");
        prop_assert_eq!(bits(&ours.embedding), raw);
    }
}
