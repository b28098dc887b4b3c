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

use crate::base::ident::SqlText;
use crate::domain::model::{EntityDescriptor, KeyType, PartType};
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
        let columns = self.key.iter().map(|p| {
            let mut c = SqlText::default();
            c.col(&p.column);
            c
        });
        self.composite_text(columns)
    }

    /// A composite key's text from its parts' values, `columns` in key
    /// order (the row's columns, or what a CTE carried of them).
    ///
    /// Written out by concatenation, the text `jsonb` prints for the
    /// array (`[42, "2026-01-05T00:00:00.000000Z"]`): numbers and the
    /// fixed-form strings need no escaping, text parts go through
    /// `to_json`, whose escaping is `jsonb`'s. Half the cost of building
    /// the `jsonb` and printing it, which per-row audit pays per row.
    pub(crate) fn composite_text(&self, columns: impl Iterator<Item = SqlText>) -> SqlText {
        let mut s = SqlText::new("('[' || ");
        for (i, (part, column)) in self.key.iter().zip(columns).enumerate() {
            if i > 0 {
                s.push(" || ', ' || ");
            }
            s.append(&part_text(part, &column));
        }
        s.push(" || ']')");
        s
    }

    /// `c.k`, or a composite key's parts as a CTE carries them,
    /// `c.k0, c.k1`: the key columns of the fused statement's CTEs.
    pub(crate) fn carried_key(&self, alias: &'static str) -> SqlText {
        let mut s = SqlText::new(alias);
        if !self.composite() {
            s.push(".k");
            return s;
        }
        for i in 0..self.key.len() {
            if i > 0 {
                s.push(", ").push(alias);
            }
            s.push(".k").number(i);
        }
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

    /// The key's parts a sweep orders by after the anchor: every part but
    /// the anchor itself when the key includes it (a partitioned table's
    /// `(id, created_at)`), so the order is `(anchor, id)` and no bound
    /// timestamp is re-read per row. `(anchor, parts)` stays unique.
    fn after_anchor<'k>(&'k self, e: &'k EntityDescriptor) -> Vec<(usize, &'k str)> {
        let all: Vec<(usize, &str)> = e
            .record_key
            .iter()
            .map(String::as_str)
            .enumerate()
            .collect();
        if !self.composite() {
            return all;
        }
        let rest: Vec<(usize, &str)> = all
            .iter()
            .copied()
            .filter(|(_, c)| *c != e.anchor)
            .collect();
        if rest.is_empty() {
            all
        } else {
            rest
        }
    }

    /// [`Casts::key_columns`] after the anchor (see `after_anchor`), for
    /// `ORDER BY anchor, …` and the keyset's row comparison.
    pub(crate) fn order_columns(&self, e: &EntityDescriptor) -> SqlText {
        let mut s = SqlText::default();
        for (i, (_, c)) in self.after_anchor(e).into_iter().enumerate() {
            if i > 0 {
                s.push(", ");
            }
            s.col(c);
        }
        s
    }

    /// The key bound as `$n`, as values matching [`Casts::order_columns`].
    pub(crate) fn order_params(&self, e: &EntityDescriptor, n: usize) -> SqlText {
        if !self.composite() {
            return self.key_params(e, n);
        }
        let mut json = SqlText::new("(");
        json.param(n).push("::pg_catalog.jsonb)");
        let mut s = SqlText::default();
        for (i, (part, _)) in self.after_anchor(e).into_iter().enumerate() {
            if i > 0 {
                s.push(", ");
            }
            s.append(&unpack(&json, part, &self.key[part]));
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

    /// A record hold on the row of a composite key, alive by `life`: the
    /// entity's live holds are read once per statement (the `OFFSET 0`
    /// keeps the subquery whole), their keys unpacked into typed parts,
    /// and the row's own columns compared with them. The row's key text is
    /// never built: built per row and per hold, as a nested loop would,
    /// it halved a sweep's speed (`cohort-keys-bench`). A hold whose
    /// stored key is not a JSON array fails the statement rather than
    /// protect nothing (Cohort writes only canonical keys; docs/holds.md).
    pub(crate) fn composite_hold(
        &self,
        e: &EntityDescriptor,
        cohort_schema: &str,
        life: &'static str,
    ) -> SqlText {
        let mut s = SqlText::new("EXISTS (SELECT 1 FROM (SELECT ");
        s.append(&self.parts_of(&SqlText::new("x.j")))
            .push(" FROM (SELECT h.record_id::pg_catalog.jsonb AS j FROM ")
            .table(&crate::sql::tables::CohortTable::Hold.qualified(cohort_schema))
            .push(" h WHERE h.retention_entity_id = $1 AND ")
            .push(life)
            .push(" OFFSET 0) x) AS k(");
        for i in 0..self.key.len() {
            if i > 0 {
                s.push(", ");
            }
            s.push("k").number(i);
        }
        s.push(") WHERE (")
            .append(&self.key_columns(e))
            .push(") = (");
        for i in 0..self.key.len() {
            if i > 0 {
                s.push(", ");
            }
            s.push("k.k").number(i);
        }
        s.push("))");
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

/// A part as the JSON array holds it (see `model::composite`), from the
/// part's value `c`, as JSON text.
fn part_text(part: &KeyPart, c: &SqlText) -> SqlText {
    let mut s = SqlText::default();
    // '"' || shown || '"', or the infinity's own text, quoted too.
    let quoted_finite = |s: &mut SqlText, shown: &SqlText| {
        s.push("('\"' || CASE WHEN pg_catalog.isfinite(")
            .append(c)
            .push(") THEN ")
            .append(shown)
            .push(" ELSE ")
            .append(c)
            .push("::text END || '\"')");
    };
    match part.ty {
        PartType::Key(KeyType::Int2 | KeyType::Int4 | KeyType::Int8) => {
            s.append(c).push("::text");
        }
        PartType::Key(KeyType::Uuid) => {
            s.push("('\"' || ").append(c).push("::text || '\"')");
        }
        PartType::Key(KeyType::Text) => {
            s.push("pg_catalog.to_json(")
                .append(c)
                .push("::text)::text");
        }
        PartType::Key(KeyType::CiText) => {
            s.push("pg_catalog.to_json(pg_catalog.lower(")
                .append(c)
                .push("::text))::text");
        }
        PartType::Timestamptz => {
            let mut shown = SqlText::new("pg_catalog.to_char(");
            shown
                .append(c)
                .push(" AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')");
            quoted_finite(&mut s, &shown);
        }
        PartType::Timestamp => {
            let mut shown = SqlText::new("pg_catalog.to_char(");
            shown.append(c).push(", 'YYYY-MM-DD\"T\"HH24:MI:SS.US')");
            quoted_finite(&mut s, &shown);
        }
        PartType::Date => {
            let mut shown = SqlText::new("pg_catalog.to_char(");
            shown.append(c).push(", 'YYYY-MM-DD')");
            quoted_finite(&mut s, &shown);
        }
    }
    s
}
