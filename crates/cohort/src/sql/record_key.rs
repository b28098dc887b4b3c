//! The record key in SQL: one column, or a composite key of several.
//!
//! Every statement names a row's key through these fragments, so a
//! composite key works wherever a one-column key does. A one-column key
//! is the column itself, bound in its own type (what every statement did
//! before composite keys; their text is unchanged). A composite key is
//! printed as the JSON array of its parts (`model::composite` reads the
//! same text from users) and bound as that text: one parameter per key
//! (or a `text[]` of them), unpacked in SQL into each part's own type,
//! so the comparisons use the key's index and never compare text.

use crate::ident::SqlText;
use crate::model::{EntityDescriptor, KeyType, PartType};
use crate::sql::fragments::{Casts, KeyPart};

impl Casts {
    /// Whether the record key has several columns.
    pub(crate) fn composite(&self) -> bool {
        !self.key.is_empty()
    }

    /// The row's record key as Cohort stores it (holds, row details):
    /// `t."id"::text`, or the JSON array of a composite key's parts.
    pub(crate) fn key_text(&self, e: &EntityDescriptor) -> SqlText {
        let mut s = SqlText::default();
        if !self.composite() {
            s.col(&e.record_id).push("::text");
            return s;
        }
        s.push("pg_catalog.jsonb_build_array(");
        for (i, part) in self.key.iter().enumerate() {
            if i > 0 {
                s.push(", ");
            }
            s.append(&part_text(part));
        }
        s.push(")::text");
        s
    }

    /// The record key as selected for decoding: the column (as text when
    /// it has a cast), or a composite key's text.
    pub(crate) fn key_select(&self, s: &mut SqlText, e: &EntityDescriptor) {
        if self.composite() {
            s.append(&self.key_text(e));
        } else {
            self.select(s, &e.record_id);
        }
    }

    /// The key's columns, for `ORDER BY` and row comparisons:
    /// `t."id"`, or `t."a", t."b"`.
    pub(crate) fn key_columns(&self, e: &EntityDescriptor) -> SqlText {
        let mut s = SqlText::default();
        for (i, c) in e.record_key.iter().enumerate() {
            if i > 0 {
                s.push(", ");
            }
            s.col(c);
        }
        s
    }

    /// The key as one comparable value: `t."id"`, or the row `(t."a", t."b")`.
    pub(crate) fn key_value(&self, e: &EntityDescriptor) -> SqlText {
        if !self.composite() {
            let mut s = SqlText::default();
            s.col(&e.record_id);
            return s;
        }
        let mut s = SqlText::new("(");
        s.append(&self.key_columns(e)).push(")");
        s
    }

    /// The key bound as `$n`, as values matching [`Casts::key_columns`]:
    /// `$n` (cast when the column needs it), or each part of the JSON
    /// array in its own type.
    pub(crate) fn key_params(&self, e: &EntityDescriptor, n: usize) -> SqlText {
        let mut s = SqlText::default();
        if !self.composite() {
            self.param(&mut s, &e.record_id, n);
            return s;
        }
        let mut json = SqlText::new("(");
        json.param(n).push("::pg_catalog.jsonb)");
        s.append(&self.parts_of(&json));
        s
    }

    /// A composite key's parts from the JSON array `json`, each in its
    /// own type: `(json ->> 0)::int8, (json ->> 1)::timestamptz`.
    fn parts_of(&self, json: &SqlText) -> SqlText {
        let mut s = SqlText::default();
        for (i, part) in self.key.iter().enumerate() {
            if i > 0 {
                s.push(", ");
            }
            s.append(&unpack(json, i, part));
        }
        s
    }

    /// The row whose key is `v.k`, a value of [`Casts::key_array`]'s
    /// array: `t."id" = v.k`, or the parts of the JSON `v.k`.
    pub(crate) fn key_matches_v(&self, e: &EntityDescriptor) -> SqlText {
        let mut s = SqlText::default();
        if !self.composite() {
            s.col(&e.record_id).push(" = v.k");
            return s;
        }
        s.push("(")
            .append(&self.key_columns(e))
            .push(") = (")
            .append(&self.parts_of(&SqlText::new("v.k")))
            .push(")");
        s
    }

    /// `moved."id" = v.k`: [`Casts::key_matches_v`] for the rows a
    /// mutation returned as `moved`.
    pub(crate) fn moved_matches_v(&self, e: &EntityDescriptor) -> SqlText {
        let mut s = SqlText::default();
        if !self.composite() {
            s.push("moved.").ident(&e.record_id).push(" = v.k");
            return s;
        }
        s.push("(");
        for (i, c) in e.record_key.iter().enumerate() {
            if i > 0 {
                s.push(", ");
            }
            s.push("moved.").ident(c);
        }
        s.push(") = (")
            .append(&self.parts_of(&SqlText::new("v.k")))
            .push(")");
        s
    }

    /// `$n` as an array of keys: of the column's type (when it needs a
    /// cast), or of a composite key's JSON.
    pub(crate) fn key_array(&self, s: &mut SqlText, e: &EntityDescriptor, n: usize) {
        if self.composite() {
            s.param(n).push("::pg_catalog.jsonb[]");
        } else {
            self.array(s, &e.record_id, n);
        }
    }

    /// `t.key = $n` in the key's own types.
    pub(crate) fn key_eq(&self, e: &EntityDescriptor, n: usize) -> SqlText {
        if !self.composite() {
            let mut s = SqlText::default();
            s.col(&e.record_id).push(" = ");
            self.param(&mut s, &e.record_id, n);
            return s;
        }
        let mut s = SqlText::new("(");
        s.append(&self.key_columns(e))
            .push(") = (")
            .append(&self.key_params(e, n))
            .push(")");
        s
    }

    /// `t.key > $n` in the key's own types (a composite key compared as
    /// a row, part by part).
    pub(crate) fn key_after(&self, e: &EntityDescriptor, n: usize) -> SqlText {
        let mut s = SqlText::default();
        if !self.composite() {
            s.col(&e.record_id).push(" > ");
            self.param(&mut s, &e.record_id, n);
            return s;
        }
        s.push("(")
            .append(&self.key_columns(e))
            .push(") > (")
            .append(&self.key_params(e, n))
            .push(")");
        s
    }

    /// `t.key = ANY($n)`: the rows whose key is one of the array bound
    /// as `$n`, in the key's own types.
    pub(crate) fn key_any(&self, e: &EntityDescriptor, n: usize) -> SqlText {
        if !self.composite() {
            return self.any(&e.record_id, n);
        }
        let mut s = SqlText::new("(");
        s.append(&self.key_columns(e))
            .push(") IN (SELECT ")
            .append(&self.parts_of(&SqlText::new("k.j")))
            .push(" FROM pg_catalog.unnest(");
        self.key_array(&mut s, e, n);
        s.push(") AS k(j))");
        s
    }
}

/// Part `i` of a JSON key `json`, in the part's own type.
fn unpack(json: &SqlText, i: usize, part: &KeyPart) -> SqlText {
    let mut s = SqlText::new("(");
    s.append(json)
        .push(" ->> ")
        .number(i)
        .push(")::")
        .table(&part.sql_type);
    s
}

/// A part as the JSON array holds it (see `model::composite`).
fn part_text(part: &KeyPart) -> SqlText {
    let mut s = SqlText::default();
    let c = &part.column;
    match part.ty {
        PartType::Key(KeyType::Int2 | KeyType::Int4 | KeyType::Int8 | KeyType::Uuid) => {
            s.col(c);
        }
        PartType::Key(KeyType::Text) => {
            s.col(c).push("::text");
        }
        PartType::Key(KeyType::CiText) => {
            s.push("pg_catalog.lower(").col(c).push("::text)");
        }
        PartType::Timestamptz => {
            s.push("CASE WHEN pg_catalog.isfinite(")
                .col(c)
                .push(") THEN pg_catalog.to_char(")
                .col(c)
                .push(" AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') ELSE ")
                .col(c)
                .push("::text END");
        }
        PartType::Timestamp => {
            s.push("CASE WHEN pg_catalog.isfinite(")
                .col(c)
                .push(") THEN pg_catalog.to_char(")
                .col(c)
                .push(", 'YYYY-MM-DD\"T\"HH24:MI:SS.US') ELSE ")
                .col(c)
                .push("::text END");
        }
        PartType::Date => {
            s.push("CASE WHEN pg_catalog.isfinite(")
                .col(c)
                .push(") THEN pg_catalog.to_char(")
                .col(c)
                .push(", 'YYYY-MM-DD') ELSE ")
                .col(c)
                .push("::text END");
        }
    }
    s
}
