//! What `on_before` captures for `on_after`: typed values that round-trip
//! exactly through the queue's JSON (each value carries its type).

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One captured value. What comes back is equal and of the same variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", content = "v", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SnapshotValue {
    /// No value.
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer (any width up to 64 bits).
    Int(i64),
    /// A finite float (NaN and infinities cannot be captured).
    Float(f64),
    /// Text.
    Text(String),
    /// A uuid.
    Uuid(Uuid),
    /// An instant (UTC, microseconds as PostgreSQL keeps them).
    Timestamp(DateTime<Utc>),
    /// An exact decimal, as its canonical text (`-12.50`).
    Decimal(String),
    /// A value of an application enum: its type's name and the variant.
    Enum {
        /// The enum's name (e.g. `OrderStatus`).
        ty: String,
        /// The variant (e.g. `Shipped`).
        value: String,
    },
    /// A list of values.
    List(Vec<SnapshotValue>),
    /// A nested map.
    Map(BTreeMap<String, SnapshotValue>),
}

/// A value that cannot be captured; fails the capturing handler before
/// anything is mutated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotError(pub String);

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot capture into the snapshot: {}", self.0)
    }
}

impl std::error::Error for SnapshotError {}

impl SnapshotValue {
    /// An exact decimal from its text; refused unless it is one.
    pub fn decimal(text: &str) -> Result<Self, SnapshotError> {
        let t = text.trim();
        let digits = t.strip_prefix('-').unwrap_or(t);
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let ok = !int.is_empty()
            && int.chars().all(|c| c.is_ascii_digit())
            && frac.chars().all(|c| c.is_ascii_digit())
            && !(digits.contains('.') && frac.is_empty());
        if ok {
            Ok(SnapshotValue::Decimal(t.to_owned()))
        } else {
            Err(SnapshotError("a value that is not a decimal number".into()))
        }
    }

    /// An application enum value.
    pub fn enumerated(ty: impl Into<String>, value: impl Into<String>) -> Self {
        SnapshotValue::Enum {
            ty: ty.into(),
            value: value.into(),
        }
    }

    fn check(&self) -> Result<(), SnapshotError> {
        match self {
            SnapshotValue::Float(f) if !f.is_finite() => {
                Err(SnapshotError(format!("{f} is not a finite number")))
            }
            SnapshotValue::Text(s) | SnapshotValue::Decimal(s) if s.contains('\0') => Err(
                SnapshotError("text with a NUL character cannot be stored".into()),
            ),
            SnapshotValue::Enum { ty, value } if ty.contains('\0') || value.contains('\0') => Err(
                SnapshotError("text with a NUL character cannot be stored".into()),
            ),
            SnapshotValue::List(items) => items.iter().try_for_each(SnapshotValue::check),
            SnapshotValue::Map(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return Err(SnapshotError("a key with a NUL character".into()));
                }
                map.values().try_for_each(SnapshotValue::check)
            }
            _ => Ok(()),
        }
    }
}

macro_rules! from {
    ($($t:ty => $variant:ident $(as $conv:ty)?),* $(,)?) => {
        $(impl From<$t> for SnapshotValue {
            fn from(v: $t) -> Self {
                SnapshotValue::$variant(v $(as $conv)?)
            }
        })*
    };
}

from!(bool => Bool, i16 => Int as i64, i32 => Int as i64, i64 => Int, f64 => Float, String => Text, Uuid => Uuid, DateTime<Utc> => Timestamp);

impl From<&str> for SnapshotValue {
    fn from(v: &str) -> Self {
        SnapshotValue::Text(v.to_owned())
    }
}

impl<T: Into<SnapshotValue>> From<Option<T>> for SnapshotValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(SnapshotValue::Null, Into::into)
    }
}

impl<T: Into<SnapshotValue>> From<Vec<T>> for SnapshotValue {
    fn from(v: Vec<T>) -> Self {
        SnapshotValue::List(v.into_iter().map(Into::into).collect())
    }
}

/// The values one handler captured for one row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Snapshot(BTreeMap<String, SnapshotValue>);

impl Snapshot {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Captures a value under `key`; a value that cannot round-trip is
    /// refused (and fails the capturing handler).
    pub fn insert(
        &mut self,
        key: impl Into<String>,
        value: impl Into<SnapshotValue>,
    ) -> Result<(), SnapshotError> {
        let key = key.into();
        if key.contains('\0') {
            return Err(SnapshotError("a key with a NUL character".into()));
        }
        let value = value.into();
        value.check()?;
        self.0.insert(key, value);
        Ok(())
    }

    /// The value captured under `key`.
    pub fn get(&self, key: &str) -> Option<&SnapshotValue> {
        self.0.get(key)
    }

    /// Every captured value.
    pub fn values(&self) -> &BTreeMap<String, SnapshotValue> {
        &self.0
    }

    /// The stored form.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("checked snapshot values serialise")
    }

    /// Reads a stored form back; a tampered payload is an error, never a panic.
    pub(crate) fn from_json(value: serde_json::Value) -> Result<Self, String> {
        let snapshot: Snapshot =
            serde_json::from_value(value).map_err(|e| format!("unreadable payload: {e}"))?;
        for v in snapshot.0.values() {
            v.check().map_err(|e| e.to_string())?;
        }
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_value_round_trips_exactly() {
        let mut s = Snapshot::new();
        let when: DateTime<Utc> = "2026-06-01T12:34:56.123456Z".parse().unwrap();
        s.insert("null", SnapshotValue::Null).unwrap();
        s.insert("bool", true).unwrap();
        s.insert("int", i64::MIN).unwrap();
        s.insert("small", 7i16).unwrap();
        s.insert("float", 0.1f64).unwrap();
        s.insert("text", "Ada Lovelace").unwrap();
        s.insert("uuid", Uuid::from_u128(42)).unwrap();
        s.insert("at", when).unwrap();
        s.insert("amount", SnapshotValue::decimal("-12.50").unwrap())
            .unwrap();
        s.insert(
            "status",
            SnapshotValue::enumerated("OrderStatus", "Shipped"),
        )
        .unwrap();
        s.insert("list", vec![1i64, 2, 3]).unwrap();
        s.insert(
            "map",
            SnapshotValue::Map(BTreeMap::from([(
                "inner".to_string(),
                SnapshotValue::List(vec![SnapshotValue::Null, "x".into()]),
            )])),
        )
        .unwrap();
        let back = Snapshot::from_json(s.to_json()).unwrap();
        assert_eq!(back, s);
        // The same variant comes back: a decimal is not a float, a uuid not text.
        assert!(matches!(back.get("amount"), Some(SnapshotValue::Decimal(d)) if d == "-12.50"));
        assert!(matches!(back.get("uuid"), Some(SnapshotValue::Uuid(_))));
    }

    #[test]
    fn values_that_cannot_round_trip_are_refused() {
        let mut s = Snapshot::new();
        assert!(s.insert("nan", f64::NAN).is_err());
        assert!(s.insert("inf", vec![f64::INFINITY]).is_err());
        assert!(s.insert("nul", "a\0b").is_err());
        assert!(SnapshotValue::decimal("1e5").is_err());
        assert!(SnapshotValue::decimal("12.").is_err());
        assert!(s.values().is_empty());
    }

    #[test]
    fn tampered_payloads_are_errors_not_panics() {
        for bad in [
            serde_json::json!({"x": {"t": "uuid", "v": "not-a-uuid"}}),
            serde_json::json!({"x": {"t": "nonsense", "v": 1}}),
            serde_json::json!([1, 2, 3]),
            serde_json::json!({"x": {"t": "float", "v": "NaN"}}),
        ] {
            assert!(Snapshot::from_json(bad).is_err());
        }
    }
}

/// Hostile payloads (issue: reliability): whatever JSON a tampered queue
/// row holds, reading it is an error or a valid snapshot, never a panic;
/// every snapshot that can be captured reads back as itself.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| serde_json::json!(n)),
            any::<f64>().prop_map(|f| serde_json::json!(f)),
            ".{0,20}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn value() -> impl Strategy<Value = SnapshotValue> {
        let leaf = prop_oneof![
            Just(SnapshotValue::Null),
            any::<bool>().prop_map(SnapshotValue::Bool),
            any::<i64>().prop_map(SnapshotValue::Int),
            (-1e12f64..1e12).prop_map(SnapshotValue::Float),
            "[^\u{0}]{0,16}".prop_map(SnapshotValue::Text),
            any::<u128>().prop_map(|n| SnapshotValue::Uuid(Uuid::from_u128(n))),
            (0i64..4_000_000_000_000_000).prop_map(|us| SnapshotValue::Timestamp(
                DateTime::from_timestamp_micros(us).expect("in range")
            )),
            (-1_000_000i64..1_000_000, 0u32..100).prop_map(|(i, f)| {
                SnapshotValue::decimal(&format!("{i}.{f:02}")).expect("a decimal")
            }),
            ("[A-Za-z]{1,8}", "[A-Za-z]{1,8}").prop_map(|(t, v)| SnapshotValue::enumerated(t, v)),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(SnapshotValue::List),
                prop::collection::btree_map("[^\u{0}]{0,6}", inner, 0..5)
                    .prop_map(SnapshotValue::Map),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_json_payload_reads_or_errors_without_panicking(payload in json()) {
            let _ = Snapshot::from_json(payload);
        }

        #[test]
        fn captured_snapshots_round_trip(entries in prop::collection::btree_map("[^\u{0}]{1,10}", value(), 0..8)) {
            let mut s = Snapshot::new();
            for (k, v) in entries {
                s.insert(k, v).unwrap();
            }
            let back = Snapshot::from_json(s.to_json()).unwrap();
            prop_assert_eq!(back, s);
        }
    }
}
