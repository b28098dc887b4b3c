//! Composite record keys: the parts' types, and a key given as a JSON
//! array read into its canonical text (pure; the SQL that unpacks and
//! prints keys lives in `sql::record_key`).
//!
//! A composite key travels as one text, the JSON array of its parts in
//! key order, exactly as PostgreSQL's `jsonb` prints the array that
//! `sql::record_key` builds from a row: integers as numbers, uuid lower
//! case, text as it is, citext lower case, timestamps in UTC with six
//! fractional digits (`2026-01-05T00:00:00.000000Z`), dates `YYYY-MM-DD`.
//! That one text is what the ledger's details and holds store, what the
//! CLI prints and takes, and what the statements bind (unpacked in SQL
//! into each part's own type, so every part is compared in its type).

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

use super::KeyType;

/// The type of one part of a composite record key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartType {
    /// A key-like type (uuid, integers, text, citext).
    Key(KeyType),
    /// `timestamptz`: printed in UTC.
    Timestamptz,
    /// `timestamp` without time zone.
    Timestamp,
    /// `date`.
    Date,
}

impl PartType {
    /// From a catalog base-type name; `None` for unsupported types.
    pub(crate) fn from_type_name(name: &str) -> Option<Self> {
        Some(match name {
            "timestamptz" => PartType::Timestamptz,
            "timestamp" => PartType::Timestamp,
            "date" => PartType::Date,
            other => PartType::Key(KeyType::from_type_name(other)?),
        })
    }

    /// The part's canonical JSON value, from a JSON value given by a user.
    fn canonical(self, value: &serde_json::Value) -> Result<String, String> {
        let quoted = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
        let text = match value {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            other => return Err(format!("{other} is neither a string nor a number")),
        };
        match self {
            PartType::Key(ty @ (KeyType::Int2 | KeyType::Int4 | KeyType::Int8)) => {
                Ok(ty.parse(&text)?.canonical())
            }
            PartType::Key(ty) => {
                if !value.is_string() {
                    return Err(format!("{value} is not a string ({})", ty.name()));
                }
                Ok(quoted(&ty.parse(&text)?.canonical()))
            }
            PartType::Timestamptz => {
                let t = text.trim();
                if t == "infinity" || t == "-infinity" {
                    return Ok(quoted(t));
                }
                let at = DateTime::parse_from_rfc3339(t).map_err(|_| {
                    format!("{text:?} is not a timestamp with a time zone (RFC 3339, e.g. 2026-01-05T00:00:00Z)")
                })?;
                Ok(quoted(
                    &at.with_timezone(&Utc)
                        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
                        .to_string(),
                ))
            }
            PartType::Timestamp => {
                let t = text.trim();
                if t == "infinity" || t == "-infinity" {
                    return Ok(quoted(t));
                }
                let at = NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f")
                    .or_else(|_| NaiveDateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f"))
                    .map_err(|_| {
                        format!("{text:?} is not a timestamp without time zone (e.g. 2026-01-05T00:00:00)")
                    })?;
                Ok(quoted(&at.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()))
            }
            PartType::Date => {
                let d = NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d")
                    .map_err(|_| format!("{text:?} is not a date (YYYY-MM-DD)"))?;
                Ok(quoted(&d.format("%Y-%m-%d").to_string()))
            }
        }
    }
}

/// Reads a composite key given as a JSON array (`[42, "2026-01-05T00:00:00Z"]`)
/// into its canonical text, each part parsed in its own type.
pub(crate) fn parse_composite(parts: &[PartType], raw: &str) -> Result<String, String> {
    let value: serde_json::Value = serde_json::from_str(raw.trim()).map_err(|_| {
        format!(
            "{raw:?} is not a JSON array; a composite record key is given as the array of its {} parts in key order",
            parts.len()
        )
    })?;
    let items = value.as_array().ok_or_else(|| {
        format!(
            "{raw:?} is not a JSON array; a composite record key is given as the array of its {} parts in key order",
            parts.len()
        )
    })?;
    if items.len() != parts.len() {
        return Err(format!(
            "{raw:?} has {} part(s); the record key has {}",
            items.len(),
            parts.len()
        ));
    }
    let canonical = parts
        .iter()
        .zip(items)
        .enumerate()
        .map(|(i, (ty, v))| {
            ty.canonical(v)
                .map_err(|why| format!("part {}: {why}", i + 1))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // jsonb prints an array's elements separated by ", ".
    Ok(format!("[{}]", canonical.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_composite_key_reads_each_part_in_its_type() {
        let parts = [PartType::Key(KeyType::Int8), PartType::Timestamptz];
        assert_eq!(
            parse_composite(&parts, r#"[42, "2026-01-05T01:00:00+01:00"]"#),
            Ok(r#"[42, "2026-01-05T00:00:00.000000Z"]"#.to_owned())
        );
        assert_eq!(
            parse_composite(&parts, r#"["0042", "2026-01-05T00:00:00.5Z"]"#),
            Ok(r#"[42, "2026-01-05T00:00:00.500000Z"]"#.to_owned())
        );
        for bad in [
            "42",
            "[42]",
            r#"[42, "2026-01-05"]"#,
            r#"[42, "2026-01-05T00:00:00"]"#,
            r#"["x", "2026-01-05T00:00:00Z"]"#,
            r#"[null, "2026-01-05T00:00:00Z"]"#,
            r#"[42, "2026-01-05T00:00:00Z", 1]"#,
        ] {
            assert!(parse_composite(&parts, bad).is_err(), "{bad}");
        }
        let texts = [
            PartType::Key(KeyType::Text),
            PartType::Key(KeyType::CiText),
            PartType::Key(KeyType::Uuid),
            PartType::Date,
            PartType::Timestamp,
        ];
        assert_eq!(
            parse_composite(
                &texts,
                r#"["A \"b\"", "AcMe", "A3F467FE-C5D0-4F17-9897-83C373CC1DC8", "2026-01-05", "2026-01-05 10:00:00"]"#
            ),
            Ok(r#"["A \"b\"", "acme", "a3f467fe-c5d0-4f17-9897-83c373cc1dc8", "2026-01-05", "2026-01-05T10:00:00.000000"]"#.to_owned())
        );
        // A text part is a string: a number is another spelling of another value.
        assert!(parse_composite(&texts[..1], "[7]").is_err());
    }
}
