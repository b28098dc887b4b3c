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

use crate::base::ident::SqlText;

/// A query being bound: each parameter struct binds its values onto it,
/// `$1` first (a value that fails to encode is reported when it runs).
pub(crate) type Args = Query<'static, Postgres, PgArguments>;

/// The values of one statement, bound in the order its text numbers them.
pub(crate) trait Params {
    /// Binds every value, `$1` first.
    fn bind(self, args: Args) -> Args;
}

/// Parameter types that bind nothing (so a statement can be sent raw).
pub(crate) trait NoParams {}

impl NoParams for () {}

/// A statement without parameters.
impl Params for () {
    fn bind(self, args: Args) -> Args {
        args
    }
}

/// Numbers a statement's parameters in the order they are declared:
/// the first [`Numbering::next`] is `$1`. A builder asks it for each
/// value's position instead of computing one, so the positions follow
/// from the order alone.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Numbering {
    last: usize,
}

impl Numbering {
    /// The next parameter's position.
    pub(crate) fn next(&mut self) -> usize {
        self.last += 1;
        self.last
    }

    /// The next parameter's position when `present`; nothing is taken
    /// otherwise.
    pub(crate) fn next_if(&mut self, present: bool) -> Option<usize> {
        present.then(|| self.next())
    }

    /// `count` consecutive parameters: the first's position (where the
    /// next would be, when `count` is 0).
    pub(crate) fn many(&mut self, count: usize) -> usize {
        let first = self.last + 1;
        self.last += count;
        first
    }
}

/// Statement text and its parameters.
#[derive(Debug)]
pub(crate) struct Statement<P> {
    text: SqlText,
    params: P,
    /// Whether the server keeps it prepared; off for text that names a
    /// table of one run only (a partition), which would never be reused.
    persistent: bool,
}

impl<P: Params> Statement<P> {
    pub(crate) fn new(text: SqlText, params: P) -> Self {
        Self {
            text,
            params,
            persistent: true,
        }
    }

    /// Not kept prepared on the server (see the field).
    pub(crate) fn not_persistent(mut self) -> Self {
        self.persistent = false;
        self
    }

    /// The text (for snapshots, and for SeaORM connections, which bind
    /// their own values); never the values.
    #[cfg_attr(not(any(test, feature = "sea-orm")), allow(dead_code))]
    pub(crate) fn text(&self) -> &str {
        self.text.as_str()
    }

    /// The query with every value bound (rows as `PgRow`).
    pub(crate) fn query(self) -> Args {
        let persistent = self.persistent;
        self.params
            .bind(sqlx::query(self.text.into_sql()))
            .persistent(persistent)
    }

    /// A statement without parameters sent as simple-protocol text (DDL and
    /// `LOCK`, which cannot be prepared).
    pub(crate) fn raw(self) -> sqlx::RawSql
    where
        P: NoParams,
    {
        sqlx::raw_sql(self.text.into_sql())
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

/// A query whose text is built per entity (the sweep's statements, bound
/// by hand for their key arrays), each row read as `O`.
pub(crate) type Typed<'q, O> = Map<'q, Postgres, fn(PgRow) -> Result<O, sqlx::Error>, PgArguments>;

/// Reads each row of `query` as the row type `O` (declared in `sql/`).
pub(crate) fn typed<'q, O>(query: Query<'q, Postgres, PgArguments>) -> Typed<'q, O>
where
    O: for<'r> FromRow<'r, PgRow> + Send + Unpin,
{
    query.try_map(from_row::<O> as fn(PgRow) -> Result<O, sqlx::Error>)
}

fn from_row<O: for<'r> FromRow<'r, PgRow>>(row: PgRow) -> Result<O, sqlx::Error> {
    O::from_row(&row)
}

/// Tuples bind their elements in order: for statements whose parameters
/// are few and plainly named by the function that builds them (catalog
/// lookups by schema and name, say).
macro_rules! tuple_params {
    ($($name:ident),+) => {
        impl<$($name),+> Params for ($($name,)+)
        where
            $($name: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send + 'static,)+
        {
            #[allow(non_snake_case)]
            fn bind(self, q: Args) -> Args {
                let ($($name,)+) = self;
                q$(.bind($name))+
            }
        }
    };
}

tuple_params!(A);
tuple_params!(A, B);
tuple_params!(A, B, C);
