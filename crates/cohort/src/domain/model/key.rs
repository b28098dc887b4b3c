//! Typed keys: record ids, tenants and subjects are parsed and canonicalised
//! in Rust according to their column's type (pure; binding and decoding
//! live in `sql::key`).

use uuid::Uuid;

/// The store type of a key-like column (record id, tenant, subject).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyType {
    Uuid,
    Int2,
    Int4,
    Int8,
    /// text, varchar, char(n): compared exactly, never trimmed or case-folded.
    Text,
    /// citext: compared case-insensitively, in SQL in the column's own type;
    /// canonical text is lower case.
    CiText,
}

impl KeyType {
    /// The PostgreSQL type's name, for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            KeyType::Uuid => "uuid",
            KeyType::Int2 => "smallint",
            KeyType::Int4 => "integer",
            KeyType::Int8 => "bigint",
            KeyType::Text => "text",
            KeyType::CiText => "citext",
        }
    }

    /// From a catalog base-type name; `None` for unsupported types.
    pub(crate) fn from_type_name(name: &str) -> Option<Self> {
        Some(match name {
            "uuid" => KeyType::Uuid,
            "int2" => KeyType::Int2,
            "int4" => KeyType::Int4,
            "int8" => KeyType::Int8,
            "text" | "varchar" | "bpchar" => KeyType::Text,
            "citext" => KeyType::CiText,
            _ => return None,
        })
    }

    /// Parses user input into a typed, canonical key.
    pub(crate) fn parse(self, text: &str) -> Result<KeyValue, String> {
        let trimmed = text.trim();
        let int = |min: i64, max: i64, what: &str| -> Result<i64, String> {
            let n: i64 = trimmed
                .parse()
                .map_err(|_| format!("{text:?} is not a valid {what}"))?;
            if (min..=max).contains(&n) {
                Ok(n)
            } else {
                Err(format!("{text:?} is out of range for {what}"))
            }
        };
        Ok(match self {
            KeyType::Uuid => KeyValue::Uuid(
                Uuid::parse_str(trimmed).map_err(|_| format!("{text:?} is not a valid uuid"))?,
            ),
            KeyType::Int2 => {
                KeyValue::Int2(int(i16::MIN.into(), i16::MAX.into(), "smallint")? as i16)
            }
            KeyType::Int4 => {
                KeyValue::Int4(int(i32::MIN.into(), i32::MAX.into(), "integer")? as i32)
            }
            KeyType::Int8 => KeyValue::Int8(int(i64::MIN, i64::MAX, "bigint")?),
            KeyType::Text | KeyType::CiText => {
                if text.is_empty() || text.contains('\0') {
                    return Err(format!("{text:?} is not a valid text key"));
                }
                if self == KeyType::CiText {
                    // citext folds case by the database's locale; only ASCII
                    // folds the same in Rust and in every locale.
                    if !text.is_ascii() {
                        return Err(format!(
                            "{text:?} is not ASCII; case-insensitive (citext) ids must be, since case folding of other letters depends on the database's locale"
                        ));
                    }
                    KeyValue::Text(text.to_ascii_lowercase())
                } else {
                    KeyValue::Text(text.to_owned())
                }
            }
        })
    }

    /// The canonical text of `text` read as this type, if it is valid.
    pub(crate) fn canonical_text(self, text: &str) -> Option<String> {
        self.parse(text).ok().map(|k| k.canonical())
    }

    /// Whether two key types give every spelling the same meaning (the
    /// integer widths agree; uuid, exact text and citext all differ).
    pub(crate) fn same_identity(self, other: KeyType) -> bool {
        let class = |t: KeyType| match t {
            KeyType::Int2 | KeyType::Int4 | KeyType::Int8 => KeyType::Int8,
            t => t,
        };
        class(self) == class(other)
    }
}

/// The way a column of a key type holds a subject, and so which of a
/// subject hold's stored forms it compares with (a hold stores the
/// subject once per form it can take).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SubjectForm {
    /// text, varchar, char(n): the subject exactly as given.
    Text,
    /// citext: lower case (ASCII only, as every citext key).
    CiText,
    /// uuid: lower-case hyphenated.
    Uuid,
    /// Any integer width: decimal.
    Int,
}

impl SubjectForm {
    /// Every form, in the order of the hold table's columns.
    pub(crate) const ALL: [SubjectForm; 4] = [
        SubjectForm::Text,
        SubjectForm::CiText,
        SubjectForm::Uuid,
        SubjectForm::Int,
    ];

    /// The hold table's column storing the subject in this form.
    pub(crate) fn hold_column(self) -> &'static str {
        match self {
            SubjectForm::Text => "subject_text",
            SubjectForm::CiText => "subject_citext",
            SubjectForm::Uuid => "subject_uuid",
            SubjectForm::Int => "subject_int",
        }
    }

    /// A key type that parses this form (the widest, for integers).
    fn key_type(self) -> KeyType {
        match self {
            SubjectForm::Text => KeyType::Text,
            SubjectForm::CiText => KeyType::CiText,
            SubjectForm::Uuid => KeyType::Uuid,
            SubjectForm::Int => KeyType::Int8,
        }
    }

    /// The subject's canonical text in this form, if it can take it.
    pub(crate) fn canonical(self, subject: &str) -> Option<String> {
        self.key_type().canonical_text(subject)
    }
}

impl KeyType {
    /// How a column of this type holds a subject.
    pub(crate) fn subject_form(self) -> SubjectForm {
        match self {
            KeyType::Uuid => SubjectForm::Uuid,
            KeyType::Int2 | KeyType::Int4 | KeyType::Int8 => SubjectForm::Int,
            KeyType::Text => SubjectForm::Text,
            KeyType::CiText => SubjectForm::CiText,
        }
    }
}

/// A typed key value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum KeyValue {
    Uuid(Uuid),
    Int2(i16),
    Int4(i32),
    Int8(i64),
    Text(String),
}

impl KeyValue {
    /// The canonical text form stored in Cohort's tables (what
    /// PostgreSQL's `::text` cast prints).
    pub(crate) fn canonical(&self) -> String {
        match self {
            KeyValue::Uuid(u) => u.hyphenated().to_string(),
            KeyValue::Int2(n) => n.to_string(),
            KeyValue::Int4(n) => n.to_string(),
            KeyValue::Int8(n) => n.to_string(),
            KeyValue::Text(s) => s.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_takes_every_form_it_parses_as() {
        let forms = |s: &str| -> Vec<Option<String>> {
            SubjectForm::ALL.iter().map(|f| f.canonical(s)).collect()
        };
        assert_eq!(
            forms("A3F467FE-C5D0-4F17-9897-83C373CC1DC8"),
            vec![
                Some("A3F467FE-C5D0-4F17-9897-83C373CC1DC8".into()),
                Some("a3f467fe-c5d0-4f17-9897-83c373cc1dc8".into()),
                Some("a3f467fe-c5d0-4f17-9897-83c373cc1dc8".into()),
                None,
            ]
        );
        assert_eq!(
            forms(" 042"),
            vec![
                Some(" 042".into()),
                Some(" 042".into()),
                None,
                Some("42".into())
            ]
        );
        assert_eq!(
            forms("Zoë@Example.com"),
            vec![Some("Zoë@Example.com".into()), None, None, None]
        );
        assert_eq!(forms(""), vec![None, None, None, None]);
        assert_eq!(KeyType::Int2.subject_form(), SubjectForm::Int);
        assert_eq!(KeyType::CiText.subject_form(), SubjectForm::CiText);
    }

    #[test]
    fn canonicalisation_table() {
        let cases = [
            (
                KeyType::Uuid,
                "A3F467FE-C5D0-4F17-9897-83C373CC1DC8",
                Ok("a3f467fe-c5d0-4f17-9897-83c373cc1dc8"),
            ),
            (
                KeyType::Uuid,
                "a3f467fec5d04f17989783c373cc1dc8",
                Ok("a3f467fe-c5d0-4f17-9897-83c373cc1dc8"),
            ),
            (KeyType::Uuid, "not-a-uuid", Err(())),
            (KeyType::Int8, "0042", Ok("42")),
            (KeyType::Int8, " -7 ", Ok("-7")),
            (KeyType::Int4, "2147483648", Err(())),
            (KeyType::Int2, "32767", Ok("32767")),
            (KeyType::Int8, "1e3", Err(())),
            (KeyType::Text, "Case-Sensitive ", Ok("Case-Sensitive ")),
            (KeyType::Text, "", Err(())),
            (KeyType::Text, " ACME", Ok(" ACME")),
            (KeyType::CiText, "AcMe", Ok("acme")),
            (KeyType::CiText, "École", Err(())),
        ];
        for (ty, input, expected) in cases {
            let got = ty.parse(input).map(|k| k.canonical()).map_err(|_| ());
            assert_eq!(got, expected.map(str::to_owned), "{ty:?} {input:?}");
        }
    }

    #[test]
    fn type_names() {
        assert_eq!(KeyType::from_type_name("varchar"), Some(KeyType::Text));
        assert_eq!(KeyType::from_type_name("int4"), Some(KeyType::Int4));
        assert_eq!(KeyType::from_type_name("jsonb"), None);
    }
}
