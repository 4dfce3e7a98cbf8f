//! Payload generators for the fuzz targets (property tests) of every crate: random bytes,
//! random JSON, and valid samples mutated the way a hostile or buggy publisher would
//! (absurd numbers, subject wildcards in names, control characters, unknown fields, missing
//! fields, truncation).
//!
//! Built only for tests (the `fuzzing` feature, which the services enable as a
//! dev-dependency), so proptest never reaches a release binary. `scripts/fuzz.sh` runs the
//! targets with many more cases (`PROPTEST_CASES`).

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value, json};

/// Values that have broken parsers and arithmetic before: negatives, extremes, fractions,
/// huge floats, subject wildcards, control characters, long strings, wrong types.
pub fn hostile_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(-0.5)),
        Just(json!(0.3333333)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(u32::MAX)),
        Just(json!(1e300)),
        Just(json!(-1e300)),
        Just(json!(3_153_600_000u64)), // 100 years in seconds
        Just(json!(null)),
        Just(json!(true)),
        Just(json!("")),
        Just(json!("a.b")),
        Just(json!("*")),
        Just(json!(">")),
        Just(json!("with space")),
        Just(json!("nul\u{0}byte")),
        Just(json!("esc\u{1b}[2Jape")),
        Just(json!("line\nbreak")),
        Just(json!("NaN")),
        Just(json!("9999-12-31T23:59:59Z")),
        Just(json!("-262143-01-01T00:00:00Z")),
        Just(json!("x".repeat(70_000))),
        Just(json!([])),
        Just(json!({})),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
    ]
}

/// Arbitrary JSON, a few levels deep.
pub fn arb_json() -> impl Strategy<Value = Value> {
    hostile_scalar().prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One change to a JSON document.
#[derive(Clone, Debug)]
enum Mutation {
    /// Replace the value at a path.
    Replace(Index, Value),
    /// Remove an object member (a missing required field).
    Remove(Index),
    /// Add a member nobody knows (must be refused where unknown fields are denied).
    AddUnknown(Index, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => (any::<Index>(), arb_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        2 => any::<Index>().prop_map(Mutation::Remove),
        1 => (any::<Index>(), hostile_scalar()).prop_map(|(i, v)| Mutation::AddUnknown(i, v)),
    ]
}

/// Every JSON pointer into `value` (the root included).
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                pointers(
                    child,
                    format!("{at}/{}", key.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

fn apply(doc: &mut Value, mutation: &Mutation) {
    let mut all = Vec::new();
    pointers(doc, String::new(), &mut all);
    match mutation {
        Mutation::Replace(i, v) => {
            if let Some(slot) = doc.pointer_mut(i.get(all.as_slice()).as_str()) {
                *slot = v.clone();
            }
        }
        Mutation::Remove(i) => {
            let path = i.get(all.as_slice()).clone();
            if let Some((parent, key)) = path.rsplit_once('/')
                && let Some(Value::Object(map)) = doc.pointer_mut(parent)
            {
                map.remove(&key.replace("~1", "/").replace("~0", "~"));
            }
        }
        Mutation::AddUnknown(i, v) => {
            if let Some(Value::Object(map)) = doc.pointer_mut(i.get(all.as_slice()).as_str()) {
                map.insert("unexpected_field".into(), v.clone());
            }
        }
    }
}

/// `sample` with one to four mutations, serialised; sometimes also cut short or with one
/// byte changed (JSON that no longer parses).
pub fn mutated(sample: Value) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(mutation(), 1..4),
        any::<Option<(Index, u8)>>(),
        any::<Option<Index>>(),
    )
        .prop_map(move |(mutations, flip, cut)| {
            let mut doc = sample.clone();
            for m in &mutations {
                apply(&mut doc, m);
            }
            let mut bytes = serde_json::to_vec(&doc).unwrap_or_default();
            if !bytes.is_empty() {
                if let Some((at, byte)) = flip {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
                if let Some(at) = cut {
                    bytes.truncate(at.index(bytes.len()));
                }
            }
            bytes
        })
}

/// What a fuzz target is fed: random bytes, random JSON, the valid sample itself, or (most
/// often) a mutation of it.
pub fn payloads(sample: Value) -> impl Strategy<Value = Vec<u8>> {
    let exact = serde_json::to_vec(&sample).unwrap_or_default();
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..512),
        1 => arb_json().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => Just(exact),
        6 => mutated(sample),
    ]
}
