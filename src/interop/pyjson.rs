//! JSON text byte-for-byte as Python's `json.dumps(obj, indent=N)` writes
//! it (default `ensure_ascii=True`, `float.__repr__` for floats, keys in
//! insertion order). Files we export for the reference implementation then
//! look exactly like files it wrote itself, which keeps diffs between the
//! two meaningful. Written by hand because serde_json prints floats and
//! non-ASCII text differently (`1e-5` vs Python's `1e-05`, raw UTF-8 vs
//! `\uXXXX`); both parse the same, but only this output is canonical.

use std::io::{self, Write};

use serde_json::Value;

/// A JSON value whose objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    List(Vec<PyValue>),
    Dict(Vec<(String, PyValue)>),
}

impl PyValue {
    pub fn str(text: impl Into<String>) -> PyValue {
        PyValue::Str(text.into())
    }

    pub fn opt_str(text: Option<&String>) -> PyValue {
        text.map_or(PyValue::Null, |t| PyValue::Str(t.clone()))
    }
}

impl From<&Value> for PyValue {
    fn from(v: &Value) -> PyValue {
        match v {
            Value::Null => PyValue::Null,
            Value::Bool(b) => PyValue::Bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => PyValue::UInt(u),
                (_, Some(i), _) => PyValue::Int(i),
                (_, _, f) => PyValue::Float(f.unwrap_or(f64::NAN)),
            },
            Value::String(s) => PyValue::Str(s.clone()),
            Value::Array(items) => PyValue::List(items.iter().map(PyValue::from).collect()),
            Value::Object(map) => PyValue::Dict(map.iter().map(|(k, v)| (k.clone(), PyValue::from(v))).collect()),
        }
    }
}

/// `repr(x)` for a Python float: the shortest digits that round-trip,
/// correctly rounded (an exact tie to even, as CPython does), laid out
/// fixed when the decimal exponent is in -4..16 and as `d.ddde+XX`
/// otherwise.
pub fn float_repr(x: f64) -> String {
    let mut out = Vec::with_capacity(24);
    write_float(&mut out, x).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("float_repr writes ASCII")
}

/// Writes `float_repr(x)` with no allocation. The digits are ryu's (its
/// shortest digits round ties to even, as CPython's repr does; Rust's
/// `{:e}` rounds them up). An export writes 768 of these a node: with
/// `{:e}`, an exact re-rounding and the strings of each, it wrote ~1,200
/// nodes a second.
pub fn write_float(out: &mut impl Write, x: f64) -> io::Result<()> {
    if x.is_nan() {
        return out.write_all(b"NaN");
    }
    if x.is_infinite() {
        return out.write_all(if x > 0.0 { b"Infinity" } else { b"-Infinity" });
    }
    let mut buffer = ryu::Buffer::new();
    let shortest = buffer.format_finite(x).as_bytes();
    // ryu lays out numbers from 1e-4 up to 1e16 as Python does (digits,
    // a point, at least one digit after it), and those are most of an
    // embedding's values.
    if !shortest.contains(&b'e') && x.abs() >= 1e-4 {
        return out.write_all(shortest);
    }
    let mut digits = Digits::default();
    let exp = digits.read(shortest);
    if x.is_sign_negative() {
        out.write_all(b"-")?;
    }
    lay_out(out, &digits.bytes[..digits.len], exp)
}

/// Python's layout of digits `d1 d2 ...` times 10^exp (after the sign).
fn lay_out(out: &mut impl Write, digits: &[u8], exp: i32) -> io::Result<()> {
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.write_all(b"0.")?;
            for _ in 0..(-exp - 1) {
                out.write_all(b"0")?;
            }
            return out.write_all(digits);
        }
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.write_all(digits)?;
            for _ in 0..int_len - digits.len() {
                out.write_all(b"0")?;
            }
            return out.write_all(b".0");
        }
        out.write_all(&digits[..int_len])?;
        out.write_all(b".")?;
        return out.write_all(&digits[int_len..]);
    }
    out.write_all(&digits[..1])?;
    if digits.len() > 1 {
        out.write_all(b".")?;
        out.write_all(&digits[1..])?;
    }
    let exp_sign = if exp < 0 { '-' } else { '+' };
    write!(out, "e{exp_sign}{:02}", exp.abs())
}

/// A number's significant digits (no leading or trailing zeros; "0" for
/// zero), on the stack.
struct Digits {
    bytes: [u8; 40],
    len: usize,
}

impl Default for Digits {
    fn default() -> Digits {
        Digits { bytes: [0; 40], len: 0 }
    }
}

impl Digits {
    /// Reads the digits of a number written as `[-]int[.frac][e[-]N]`
    /// (as ryu and `{:e}` write them); returns its decimal exponent (of
    /// its first significant digit).
    fn read(&mut self, text: &[u8]) -> i32 {
        let e_at = text.iter().position(|&b| b == b'e' || b == b'E').unwrap_or(text.len());
        let exp_part: i32 = std::str::from_utf8(text.get(e_at + 1..).unwrap_or(&[]))
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        let mantissa = text[..e_at].strip_prefix(b"-").unwrap_or(&text[..e_at]);
        let point_at = mantissa.iter().position(|&b| b == b'.').unwrap_or(mantissa.len());
        self.len = 0;
        let mut first_at = None;
        for (at, &b) in mantissa.iter().enumerate().filter(|(_, b)| b.is_ascii_digit()) {
            if first_at.is_none() && b == b'0' {
                continue;
            }
            first_at.get_or_insert(at);
            if self.len < self.bytes.len() {
                self.bytes[self.len] = b;
                self.len += 1;
            }
        }
        while self.len > 1 && self.bytes[self.len - 1] == b'0' {
            self.len -= 1;
        }
        let Some(first_at) = first_at else {
            self.bytes[0] = b'0';
            self.len = 1;
            return 0;
        };
        // Places between the first significant digit and the point.
        let places = match first_at < point_at {
            true => (point_at - first_at - 1) as i32,
            false => -((first_at - point_at) as i32),
        };
        places + exp_part
    }
}

/// A JSON string literal with Python's `ensure_ascii` escaping.
pub fn write_str(out: &mut impl Write, text: &str) -> io::Result<()> {
    let mut buf = String::with_capacity(text.len() + 2);
    buf.push('"');
    for c in text.chars() {
        match c {
            '"' => buf.push_str("\\\""),
            '\\' => buf.push_str("\\\\"),
            '\n' => buf.push_str("\\n"),
            '\r' => buf.push_str("\\r"),
            '\t' => buf.push_str("\\t"),
            '\u{8}' => buf.push_str("\\b"),
            '\u{c}' => buf.push_str("\\f"),
            ' '..='~' => buf.push(c),
            other => {
                let mut units = [0u16; 2];
                for unit in other.encode_utf16(&mut units) {
                    buf.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    buf.push('"');
    out.write_all(buf.as_bytes())
}

/// Layout: `Some(n)` is `json.dumps(indent=n)`; `None` is the compact
/// `separators=(",", ":")` form used for JSON Lines.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub indent: Option<usize>,
}

impl Layout {
    fn newline(self, out: &mut impl Write, level: usize) -> io::Result<()> {
        if let Some(n) = self.indent {
            out.write_all(b"\n")?;
            out.write_all(" ".repeat(n * level).as_bytes())?;
        }
        Ok(())
    }

    fn colon(self) -> &'static [u8] {
        if self.indent.is_some() { b": " } else { b":" }
    }
}

/// Writes `value` at nesting `level` (the caller has already indented the
/// first line).
pub fn write_value(out: &mut impl Write, value: &PyValue, layout: Layout, level: usize) -> io::Result<()> {
    match value {
        PyValue::Null => out.write_all(b"null"),
        PyValue::Bool(b) => out.write_all(if *b { b"true" } else { b"false" }),
        PyValue::Int(i) => write!(out, "{i}"),
        PyValue::UInt(u) => write!(out, "{u}"),
        PyValue::Float(f) => write_float(out, *f),
        PyValue::Str(s) => write_str(out, s),
        PyValue::List(items) if items.is_empty() => out.write_all(b"[]"),
        PyValue::Dict(items) if items.is_empty() => out.write_all(b"{}"),
        PyValue::List(items) => {
            out.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                layout.newline(out, level + 1)?;
                write_value(out, item, layout, level + 1)?;
            }
            layout.newline(out, level)?;
            out.write_all(b"]")
        }
        PyValue::Dict(items) => {
            out.write_all(b"{")?;
            for (i, (key, item)) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                layout.newline(out, level + 1)?;
                write_str(out, key)?;
                out.write_all(layout.colon())?;
                write_value(out, item, layout, level + 1)?;
            }
            layout.newline(out, level)?;
            out.write_all(b"}")
        }
    }
}

/// The whole document as a string (tests, small values).
pub fn to_string(value: &PyValue, layout: Layout) -> String {
    let mut out = Vec::new();
    write_value(&mut out, value, layout, 0).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("the writer emits ASCII only")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_match_python_repr() {
        // Each right-hand side is what CPython's repr() prints.
        let cases: [(f64, &str); 15] = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (123.0, "123.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-5, "1.5e-05"),
            (-0.012345678, "-0.012345678"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (f64::from(0.1f32), "0.10000000149011612"),
            (2.5e-300, "2.5e-300"),
            (1773056512.0, "1773056512.0"),
            // -0.089145660400390625 exactly: a tie at 16 digits, which
            // CPython rounds to even.
            (-93476.0 / 1048576.0, "-0.08914566040039062"),
        ];
        for (x, want) in cases {
            assert_eq!(float_repr(x), want, "{x:e}");
        }
    }

    /// `repr` as first written here: Rust's shortest digit count, those
    /// digits re-rounded exactly (so a tie goes to even), laid out as
    /// Python does. Slow (two `format!`s and several strings a float),
    /// kept as the model.
    fn repr_model(x: f64) -> String {
        let shortest = format!("{x:e}");
        let digit_count = shortest
            .split('e')
            .next()
            .unwrap()
            .chars()
            .filter(char::is_ascii_digit)
            .count();
        let sci = format!("{x:.*e}", digit_count.saturating_sub(1));
        let (mantissa, exp_text) = sci.split_once('e').unwrap();
        let exp: i32 = exp_text.parse().unwrap();
        let sign = if mantissa.starts_with('-') { "-" } else { "" };
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        if (-4..16).contains(&exp) {
            if exp < 0 {
                return format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize));
            }
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                return format!("{sign}{digits}{}.0", "0".repeat(int_len - digits.len()));
            }
            return format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..]);
        }
        let mantissa = match digits.len() {
            1 => digits.clone(),
            _ => format!("{}.{}", &digits[..1], &digits[1..]),
        };
        format!("{sign}{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }

    /// The fast `repr` (ryu's digits, and ryu's own text where it is
    /// Python's) equals the model on f32 values of every exponent, as
    /// embeddings hold them, on f64 values, and on multiples of 2^-20,
    /// among which are exact ties.
    #[test]
    fn fast_repr_equals_the_model() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..300_000u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = match i % 3 {
                0 => f64::from(f32::from_bits((state >> 32) as u32)),
                1 => f64::from_bits(state),
                _ => (i as f64 - 1.5e5) / 1048576.0,
            };
            if x.is_finite() {
                assert_eq!(float_repr(x), repr_model(x), "{x:e}");
            }
        }
    }

    #[test]
    fn strings_are_ascii_escaped_like_python() {
        let mut out = Vec::new();
        write_str(&mut out, "a\"b\\c\nd\té\u{7f}\u{1}😀").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#""a\"b\\c\nd\t\u00e9\u007f\u0001\ud83d\ude00""#
        );
    }

    #[test]
    fn indent_layout_matches_json_dumps() {
        let v = PyValue::Dict(vec![
            ("a".into(), PyValue::List(vec![PyValue::Int(1), PyValue::Float(2.5)])),
            ("b".into(), PyValue::List(vec![])),
            ("c".into(), PyValue::Dict(vec![])),
            ("d".into(), PyValue::Null),
        ]);
        // json.dumps({"a": [1, 2.5], "b": [], "c": {}, "d": None}, indent=2)
        let want = "{\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"b\": [],\n  \"c\": {},\n  \"d\": null\n}";
        assert_eq!(to_string(&v, Layout { indent: Some(2) }), want);
        assert_eq!(
            to_string(&v, Layout { indent: None }),
            r#"{"a":[1,2.5],"b":[],"c":{},"d":null}"#
        );
    }
}
