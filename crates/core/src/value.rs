//! [`Value`]: a value any language can store and read (null, booleans, integers, floats,
//! text, bytes, lists, maps keyed by text), stored under the standard name `value`.
//!
//! Its encoding is the one every stored value has: MessagePack, structs as maps of their field
//! names. So a value converts to and from any serde type by those rules ([`Value::from_typed`],
//! [`Value::to`]): a map written by a program in another language reads into a Rust struct
//! whose field names match (missing fields take their defaults where the struct gives them,
//! fields the struct lacks are left out), and a struct's value reads as a map.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use crate::object::{Object, StoredName};

/// A dynamically typed value. Integers that fit an `i64` are [`Value::Int`]; only larger ones
/// are [`Value::UInt`], so two equal numbers are always the same variant.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Value {
    /// Nothing (MessagePack nil; Python's `None`, C's null).
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer from `i64::MIN` to `i64::MAX`.
    Int(i64),
    /// An integer above `i64::MAX`.
    UInt(u64),
    /// A floating-point number.
    Float(f64),
    /// UTF-8 text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<Value>),
    /// A map keyed by text, in key order.
    Map(BTreeMap<String, Value>),
}

/// Why a value did not convert to or from a typed one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// The typed value's `Serialize` failed, or made something a [`Value`] cannot hold (a map
    /// with keys other than text).
    #[error("cannot make a value of it: {0}")]
    From(String),
    /// The value does not have the shape the type expects (a missing field without a default,
    /// text where a number is expected, ...).
    #[error("the value does not read as the type: {0}")]
    To(String),
}

impl Object for Value {
    const NAME: StoredName = StoredName::standard("value", &[]);
}

impl Value {
    /// The value of `typed`, by the stored-value rules (a struct is a map of its field names).
    pub fn from_typed<T: Serialize>(typed: &T) -> Result<Value, ValueError> {
        let bytes = rmp_serde::to_vec_named(typed).map_err(|e| ValueError::From(e.to_string()))?;
        rmp_serde::from_slice(&bytes).map_err(|e| ValueError::From(e.to_string()))
    }

    /// This value read as a `T`, by the stored-value rules: the same as reading a value of `T`
    /// that another program stored with this shape.
    pub fn to<T: DeserializeOwned>(&self) -> Result<T, ValueError> {
        let bytes = rmp_serde::to_vec_named(self).map_err(|e| ValueError::To(e.to_string()))?;
        rmp_serde::from_slice(&bytes).map_err(|e| ValueError::To(e.to_string()))
    }

    /// The entry `key` of a map (`None` for another key or another kind of value).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(map) => map.get(key),
            _ => None,
        }
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Int(n)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Value {
        i64::try_from(n).map_or(Value::UInt(n), Value::Int)
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Value {
        Value::Float(x)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Text(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Text(s)
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(n) => s.serialize_i64(*n),
            Value::UInt(n) => s.serialize_u64(*n),
            Value::Float(x) => s.serialize_f64(*x),
            Value::Text(t) => s.serialize_str(t),
            Value::Bytes(b) => s.serialize_bytes(b),
            Value::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null, a boolean, a number, text, bytes, a list or a map keyed by text")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Int(n))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_f64<E: de::Error>(self, x: f64) -> Result<Value, E> {
        Ok(Value::Float(x))
    }

    fn visit_str<E: de::Error>(self, t: &str) -> Result<Value, E> {
        Ok(Value::Text(t.to_string()))
    }

    fn visit_string<E: de::Error>(self, t: String) -> Result<Value, E> {
        Ok(Value::Text(t))
    }

    fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<Value, E> {
        Ok(Value::Bytes(b.to_vec()))
    }

    fn visit_byte_buf<E: de::Error>(self, b: Vec<u8>) -> Result<Value, E> {
        Ok(Value::Bytes(b))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        // The length comes from the bytes: it bounds nothing, so it only hints.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = BTreeMap::new();
        while let Some(key) = access.next_key::<MapKey>()? {
            let value = access.next_value()?;
            map.insert(key.0, value);
        }
        Ok(Value::Map(map))
    }
}

/// A map's key: text only, with a clear refusal of any other kind.
struct MapKey(String);

impl<'de> Deserialize<'de> for MapKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MapKey, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = MapKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map key that is text")
            }
            fn visit_str<E: de::Error>(self, t: &str) -> Result<MapKey, E> {
                Ok(MapKey(t.to_string()))
            }
            fn visit_string<E: de::Error>(self, t: String) -> Result<MapKey, E> {
                Ok(MapKey(t))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Account {
        owner: String,
        balance: i64,
        #[serde(default)]
        frozen: bool,
    }

    fn map(entries: &[(&str, Value)]) -> Value {
        Value::Map(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn a_map_reads_as_a_struct_whose_field_names_match_and_back() {
        // As another language would write it: a field the struct lacks, one it defaults.
        let written = map(&[
            ("owner", "ada".into()),
            ("balance", 40i64.into()),
            ("note", Value::Null),
        ]);
        let account: Account = written.to().unwrap();
        assert_eq!(
            account,
            Account {
                owner: "ada".into(),
                balance: 40,
                frozen: false
            }
        );
        assert_eq!(
            Value::from_typed(&account).unwrap(),
            map(&[
                ("owner", "ada".into()),
                ("balance", 40i64.into()),
                ("frozen", false.into()),
            ])
        );
        // A missing field without a default, or a field of another kind, is a typed refusal.
        assert!(matches!(
            map(&[("owner", "ada".into())]).to::<Account>(),
            Err(ValueError::To(_))
        ));
        assert!(matches!(
            map(&[("owner", 1i64.into()), ("balance", 2i64.into())]).to::<Account>(),
            Err(ValueError::To(_))
        ));
    }

    #[test]
    fn every_kind_round_trips_through_the_stored_encoding() {
        let value = Value::List(vec![
            Value::Null,
            true.into(),
            (-3i64).into(),
            u64::MAX.into(),
            Value::Float(1.5),
            "text".into(),
            Value::Bytes(vec![0, 255]),
            map(&[("nested", Value::List(vec![7i64.into()]))]),
        ]);
        let bytes = rmp_serde::to_vec_named(&value).unwrap();
        assert_eq!(rmp_serde::from_slice::<Value>(&bytes).unwrap(), value);
        // Small unsigned numbers read as the signed kind: one number, one variant.
        assert_eq!(Value::from(5u64), Value::Int(5));
        let five: Value = rmp_serde::from_slice(&rmp_serde::to_vec(&5u8).unwrap()).unwrap();
        assert_eq!(five, Value::Int(5));
    }

    #[test]
    fn bytes_nested_past_the_decoders_depth_are_refused_not_a_crash() {
        // 200,000 lists each holding the next: from another program, or damaged.
        let mut bytes = vec![0x91u8; 200_000];
        bytes.push(0xc0);
        assert!(rmp_serde::from_slice::<Value>(&bytes).is_err());
    }

    #[test]
    fn maps_keyed_by_anything_but_text_are_refused() {
        let mut by_number = BTreeMap::new();
        by_number.insert(1u32, "one");
        assert!(matches!(
            Value::from_typed(&by_number),
            Err(ValueError::From(_))
        ));
    }
}
