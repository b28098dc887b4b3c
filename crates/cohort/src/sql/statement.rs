//! A statement: its text together with the values it binds.
//!
//! Every statement function in `sql/` returns a [`Statement`] whose
//! parameter struct binds its fields in the order the text numbers them
//! (`$1`, `$2`, …), written once beside the text. Callers fill a struct of
//! typed fields, so a missing, extra or mistyped bind is a compile error
//! rather than a comment to keep in step; this is the check sqlx's
//! `query!` gives static SQL, for statements whose identifiers are chosen
//! at run time (the schema, the retained tables).

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::{Map, Query};
use sqlx::{FromRow, Postgres, Row};

use crate::ident::SqlText;

/// A query being bound: each parameter struct binds its values onto it,
/// `$1` first (a value that fails to encode is reported when it runs).
pub(crate) type Args = Query<'static, Postgres, PgArguments>;

/// The values of one statement, bound in the order its text numbers them.
pub(crate) trait Params {
    /// Binds every value, `$1` first.
    fn bind(self, args: Args) -> Args;
}

/// A statement without parameters.
impl Params for () {
    fn bind(self, args: Args) -> Args {
        args
    }
}

/// Statement text and its parameters.
#[derive(Debug)]
pub(crate) struct Statement<P> {
    text: SqlText,
    params: P,
}

impl<P: Params> Statement<P> {
    pub(crate) fn new(text: SqlText, params: P) -> Self {
        Self { text, params }
    }

    /// The text, for snapshots (never values).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn text(&self) -> &str {
        self.text.as_str()
    }

    /// The query with every value bound (rows as `PgRow`).
    pub(crate) fn query(self) -> Args {
        self.params.bind(sqlx::query(self.text.into_sql()))
    }

    /// The query, each row read as `O` (a tuple or a `FromRow` type).
    pub(crate) fn query_as<O>(
        self,
    ) -> Map<'static, Postgres, impl FnMut(PgRow) -> Result<O, sqlx::Error> + Send, PgArguments>
    where
        O: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        self.query().try_map(|row: PgRow| O::from_row(&row))
    }

    /// The query, each row's first column read as `O`.
    pub(crate) fn query_scalar<O>(
        self,
    ) -> Map<'static, Postgres, impl FnMut(PgRow) -> Result<O, sqlx::Error> + Send, PgArguments>
    where
        O: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres> + Send + Unpin,
    {
        self.query().try_map(|row: PgRow| row.try_get::<O, _>(0))
    }
}
