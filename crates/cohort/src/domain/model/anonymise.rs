//! How an anonymised column is scrubbed: the methods, the values a custom
//! anonymiser returns, and custom anonymisers in their three modes (per
//! row from the value, per row with context, once per run).

use std::fmt;
use std::sync::Arc;

/// A value produced by a custom anonymiser, bound as a query parameter.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AnonymisedValue {
    /// SQL NULL.
    Null,
    /// Text.
    Text(String),
    /// A 64-bit integer.
    Int(i64),
    /// A UUID.
    Uuid(uuid::Uuid),
    /// A boolean.
    Bool(bool),
    /// A JSON document.
    Json(serde_json::Value),
}

macro_rules! anonymised_from {
    ($($ty:ty => $variant:ident $(as $conv:ty)?),* $(,)?) => {$(
        impl From<$ty> for AnonymisedValue {
            fn from(v: $ty) -> Self { AnonymisedValue::$variant(v $(as $conv)?) }
        }
    )*};
}
anonymised_from!(String => Text, i64 => Int, i32 => Int as i64, i16 => Int as i64, uuid::Uuid => Uuid, bool => Bool, serde_json::Value => Json);

impl AnonymisedValue {
    /// The value as JSON, from which PostgreSQL converts it to the
    /// column's type.
    pub fn into_json(self) -> serde_json::Value {
        match self {
            AnonymisedValue::Null => serde_json::Value::Null,
            AnonymisedValue::Text(s) => serde_json::Value::String(s),
            AnonymisedValue::Int(n) => serde_json::Value::from(n),
            AnonymisedValue::Uuid(u) => serde_json::Value::String(u.hyphenated().to_string()),
            AnonymisedValue::Bool(b) => serde_json::Value::Bool(b),
            AnonymisedValue::Json(v) => v,
        }
    }
}

impl From<&str> for AnonymisedValue {
    fn from(v: &str) -> Self {
        AnonymisedValue::Text(v.to_owned())
    }
}

impl<T: Into<AnonymisedValue>> From<Option<T>> for AnonymisedValue {
    fn from(v: Option<T>) -> Self {
        v.map_or(AnonymisedValue::Null, Into::into)
    }
}

/// What a custom anonymiser knows besides the original value: the entity
/// and column it scrubs, the run's tenant and logical time, and (per row)
/// the row's record id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AnonymiseContext<'a> {
    /// The entity's display name.
    pub entity: &'a str,
    /// The entity's durable id.
    pub entity_id: uuid::Uuid,
    /// The column being scrubbed.
    pub column: &'a str,
    /// The pass's tenant (canonical text); `None` for tenantless entities.
    pub tenant: Option<&'a str>,
    /// The run's logical time (what its cutoffs count back from).
    pub now: chrono::DateTime<chrono::Utc>,
    /// The row's record id (canonical text); `None` for an anonymiser
    /// computed once per run ([`CustomAnonymiser::per_run`]), which sees
    /// no row.
    pub record_id: Option<&'a str>,
}

/// The type-erased form of a per-row custom anonymiser: reads the original
/// value of its column from the row (in its Rust type) and returns the
/// replacement.
pub(crate) trait ErasedAnonymiser: Send + Sync + 'static {
    /// Computes the replacement for `column` of `row`.
    fn anonymise(
        &self,
        cx: &AnonymiseContext<'_>,
        row: &sqlx::postgres::PgRow,
    ) -> Result<AnonymisedValue, sqlx::Error>;
}

struct TypedAnonymiser<T, F> {
    f: F,
    _marker: std::marker::PhantomData<fn(&T)>,
}

impl<T, R, F> ErasedAnonymiser for TypedAnonymiser<T, F>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + 'static,
    R: Into<AnonymisedValue>,
    F: Fn(&AnonymiseContext<'_>, &T) -> R + Send + Sync + 'static,
{
    fn anonymise(
        &self,
        cx: &AnonymiseContext<'_>,
        row: &sqlx::postgres::PgRow,
    ) -> Result<AnonymisedValue, sqlx::Error> {
        use sqlx::Row;
        let original: T = row.try_get(cx.column)?;
        Ok((self.f)(cx, &original).into())
    }
}

type PerRun = dyn Fn(&AnonymiseContext<'_>) -> AnonymisedValue + Send + Sync;

#[derive(Clone)]
enum Mode {
    /// Called for each row with its original value (in Rust).
    PerRow(Arc<dyn ErasedAnonymiser>),
    /// Called once per run and column; the value is applied to every row
    /// of the run in SQL.
    PerRun(Arc<PerRun>),
}

/// A named custom anonymiser, in one of three modes (as .NET Cohort's
/// Static, PerRow and PerRowWithOriginalValue):
/// - [`CustomAnonymiser::new`]: `fn(&T) -> R`, per row, from the original
///   value;
/// - [`CustomAnonymiser::with_context`]: `fn(&AnonymiseContext, &T) -> R`,
///   per row, also seeing the entity, column, tenant, run time and record
///   id;
/// - [`CustomAnonymiser::per_run`]: `fn(&AnonymiseContext) -> R`, computed
///   once per run and column and applied to the whole batch in SQL, with
///   no row read into Rust.
///
/// The output is bound as a parameter and converted to the column's type
/// by PostgreSQL (never interpolated into SQL). `#[anonymise(with = f)]`
/// accepts a function of any of the three shapes.
#[derive(Clone)]
pub struct CustomAnonymiser {
    name: String,
    mode: Mode,
}

/// The shapes of function `#[anonymise(with = f)]` accepts; `M` tells them
/// apart (not part of the public API).
#[doc(hidden)]
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot anonymise a field of type `{T}`",
    label = "not an anonymiser of `{T}`",
    note = "an anonymiser is `fn(&{T}) -> R`, `fn(&AnonymiseContext, &{T}) -> R`, or `fn(&AnonymiseContext) -> R` (computed once per run), with `R: Into<AnonymisedValue>`"
)]
pub trait AnonymiserFn<T, M>: Send + Sync + 'static {
    /// The anonymiser named `name` calling this function.
    fn into_anonymiser(self, name: String) -> CustomAnonymiser;
}

#[doc(hidden)]
pub struct ByValue<R>(std::marker::PhantomData<R>);
#[doc(hidden)]
pub struct ByContextAndValue<R>(std::marker::PhantomData<R>);
#[doc(hidden)]
pub struct ByRun<R>(std::marker::PhantomData<R>);

impl<T, R, F> AnonymiserFn<T, ByValue<R>> for F
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + 'static,
    R: Into<AnonymisedValue> + 'static,
    F: Fn(&T) -> R + Send + Sync + 'static,
{
    fn into_anonymiser(self, name: String) -> CustomAnonymiser {
        CustomAnonymiser::new::<T, R, F>(name, self)
    }
}

impl<T, R, F> AnonymiserFn<T, ByContextAndValue<R>> for F
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + 'static,
    R: Into<AnonymisedValue> + 'static,
    F: Fn(&AnonymiseContext<'_>, &T) -> R + Send + Sync + 'static,
{
    fn into_anonymiser(self, name: String) -> CustomAnonymiser {
        CustomAnonymiser::with_context::<T, R, F>(name, self)
    }
}

impl<T, R, F> AnonymiserFn<T, ByRun<R>> for F
where
    R: Into<AnonymisedValue> + 'static,
    F: Fn(&AnonymiseContext<'_>) -> R + Send + Sync + 'static,
{
    fn into_anonymiser(self, name: String) -> CustomAnonymiser {
        CustomAnonymiser::per_run(name, self)
    }
}

impl CustomAnonymiser {
    /// Per row, from the original value: `fn(&T) -> R`.
    pub fn new<T, R, F>(name: impl Into<String>, f: F) -> Self
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + 'static,
        R: Into<AnonymisedValue>,
        F: Fn(&T) -> R + Send + Sync + 'static,
    {
        Self::with_context::<T, R, _>(name, move |_: &AnonymiseContext<'_>, v: &T| f(v))
    }

    /// Per row, from the original value and the row's context (entity,
    /// column, tenant, the run's `now`, the record id):
    /// `fn(&AnonymiseContext, &T) -> R`.
    pub fn with_context<T, R, F>(name: impl Into<String>, f: F) -> Self
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + 'static,
        R: Into<AnonymisedValue>,
        F: Fn(&AnonymiseContext<'_>, &T) -> R + Send + Sync + 'static,
    {
        Self {
            name: name.into(),
            mode: Mode::PerRow(Arc::new(TypedAnonymiser {
                f,
                _marker: std::marker::PhantomData,
            })),
        }
    }

    /// Once per run and column, from the run's context (its `record_id`
    /// is `None`): `fn(&AnonymiseContext) -> R`. The value is applied to
    /// every row of the run in SQL, so no row is read into Rust for it.
    pub fn per_run<R, F>(name: impl Into<String>, f: F) -> Self
    where
        R: Into<AnonymisedValue>,
        F: Fn(&AnonymiseContext<'_>) -> R + Send + Sync + 'static,
    {
        Self {
            name: name.into(),
            mode: Mode::PerRun(Arc::new(move |cx: &AnonymiseContext<'_>| f(cx).into())),
        }
    }

    /// The anonymiser of `f`, whichever of the three shapes it has (what
    /// the derive's `with = f` calls).
    #[doc(hidden)]
    pub fn from_fn<T, M, F: AnonymiserFn<T, M>>(name: impl Into<String>, f: F) -> Self {
        f.into_anonymiser(name.into())
    }

    /// The anonymiser's name (the function path, for messages and audit).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is computed once per run ([`CustomAnonymiser::per_run`]).
    pub fn is_per_run(&self) -> bool {
        matches!(self.mode, Mode::PerRun(_))
    }

    /// Runs a per-row anonymiser on a row read from the entity's table
    /// (`cx.column` names the column).
    pub(crate) fn apply(
        &self,
        cx: &AnonymiseContext<'_>,
        row: &sqlx::postgres::PgRow,
    ) -> Result<AnonymisedValue, sqlx::Error> {
        match &self.mode {
            Mode::PerRow(f) => f.anonymise(cx, row),
            Mode::PerRun(f) => Ok(f(cx)),
        }
    }

    /// Computes a per-run anonymiser's value for one run (`None` for a
    /// per-row one).
    pub(crate) fn once(&self, cx: &AnonymiseContext<'_>) -> Option<AnonymisedValue> {
        match &self.mode {
            Mode::PerRun(f) => Some(f(cx)),
            Mode::PerRow(_) => None,
        }
    }
}

impl fmt::Debug for CustomAnonymiser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomAnonymiser")
            .field("name", &self.name)
            .field("per_run", &self.is_per_run())
            .finish_non_exhaustive()
    }
}

impl PartialEq for CustomAnonymiser {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && match (&self.mode, &other.mode) {
                (Mode::PerRow(a), Mode::PerRow(b)) => Arc::ptr_eq(a, b),
                (Mode::PerRun(a), Mode::PerRun(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

/// How one column is scrubbed.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AnonymiseMethod {
    /// Set to NULL (the column must be nullable).
    Null,
    /// Set to the empty string (text columns).
    Empty,
    /// Set to a text computed once per run (text columns), applied in SQL
    /// to the whole batch: the template's `{now}` becomes the run's
    /// logical time (RFC 3339, UTC, whole seconds), `{tenant}` the pass's
    /// tenant id (empty for the tenantless pass); `{{` and `}}` write
    /// braces. Any other `{...}` is refused when the model is validated.
    Literal(String),
    /// Replace with a one-way hash of the original value (text columns),
    /// computed in SQL from the row's own value.
    Hash,
    /// Replace with the output of a Rust function: per row (from the
    /// original value, optionally with its context) or once per run (see
    /// [`CustomAnonymiser`]).
    Custom(CustomAnonymiser),
}

/// Renders a literal's template (see [`AnonymiseMethod::Literal`]) for one
/// run; the error names what is wrong with the template.
pub(crate) fn render_literal(
    template: &str,
    now: chrono::DateTime<chrono::Utc>,
    tenant: Option<&str>,
) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push('}');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{now}") {
            out.push_str(&now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{tenant}") {
            out.push_str(tenant.unwrap_or(""));
            rest = after;
        } else {
            let shown: String = tail.chars().take(12).collect();
            return Err(format!(
                "unknown placeholder at {shown:?}: a literal may use {{now}} and {{tenant}}; write {{{{ and }}}} for braces"
            ));
        }
    }
    out.push_str(rest);
    Ok(out)
}

impl AnonymiseMethod {
    /// A short name for messages (`null`, `empty`, `literal`, `hash`, `custom`).
    pub fn kind(&self) -> &'static str {
        match self {
            AnonymiseMethod::Null => "null",
            AnonymiseMethod::Empty => "empty",
            AnonymiseMethod::Literal(_) => "literal",
            AnonymiseMethod::Hash => "hash",
            AnonymiseMethod::Custom(_) => "custom",
        }
    }
}
