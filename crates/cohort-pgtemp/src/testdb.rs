//! A per-process shared cluster and fresh per-test databases cloned from
//! cross-process template databases.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _};
use tokio::sync::OnceCell;

use crate::cluster::Cluster;
use crate::error::{BoxError, Error, Result};

/// The future returned by a template setup function.
pub type SetupFuture<'a> = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>>;

type SetupFn = dyn for<'a> Fn(&'a PgPool) -> SetupFuture<'a> + Send + Sync;

/// Prefix of template database names.
const TEMPLATE_PREFIX: &str = "cohort_tpl_";
/// Prefix of per-test database names.
const TEST_DB_PREFIX: &str = "cohort_test_";
/// SQLSTATE `object_in_use`: e.g. "source database is being accessed by other users".
const OBJECT_IN_USE: &str = "55006";

/// How to build a template database that fresh test databases are cloned from.
///
/// The template is named `cohort_tpl_<key>` and is built at most once per
/// server, even when many test processes ask for it concurrently. Change the
/// key whenever the setup changes (e.g. use [`TemplateSpec::hashed_key`] over
/// your migration SQL), otherwise a long-lived server keeps the old template.
///
/// # Example
///
/// ```no_run
/// use cohort_pgtemp::{fresh_database, TemplateSpec};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let spec = TemplateSpec::new("demo_v1", |pool| {
///     Box::pin(async move {
///         sqlx::query("CREATE TABLE items (id bigint PRIMARY KEY)")
///             .execute(pool)
///             .await?;
///         Ok(())
///     })
/// });
/// let db = fresh_database(&spec).await?;
/// sqlx::query("INSERT INTO items VALUES (1)").execute(db.pool()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TemplateSpec {
    key: String,
    setup: Arc<SetupFn>,
}

impl fmt::Debug for TemplateSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TemplateSpec")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl TemplateSpec {
    /// A template identified by `key` (1 to 40 characters from `[a-z0-9_]`)
    /// and built by `setup`, which gets a pool connected to the template
    /// database while it is being built. Return the future with
    /// `Box::pin(async move { ... })`; errors convert with `?`.
    pub fn new<F>(key: impl Into<String>, setup: F) -> Self
    where
        F: for<'a> Fn(&'a PgPool) -> SetupFuture<'a> + Send + Sync + 'static,
    {
        Self {
            key: key.into(),
            setup: Arc::new(setup),
        }
    }

    /// A template built by running `sql` (may hold several statements) with
    /// [`sqlx::raw_sql`].
    pub fn from_sql(key: impl Into<String>, sql: &'static str) -> Self {
        Self::new(key, move |pool| {
            Box::pin(async move {
                sqlx::raw_sql(sql).execute(pool).await?;
                Ok(())
            })
        })
    }

    /// Builds a valid key `<label>_<16 hex digits>` from a label and a stable
    /// 64-bit FNV-1a hash of `content` (e.g. the concatenated migration SQL).
    /// `label` is lower-cased, other characters than `[a-z0-9_]` become `_`,
    /// and it is cut to 23 characters.
    pub fn hashed_key(label: &str, content: &[u8]) -> String {
        let label: String = label
            .chars()
            .map(|c| c.to_ascii_lowercase())
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(23)
            .collect();
        format!("{label}_{:016x}", fnv1a(content))
    }

    /// The caller-supplied key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The name of the template database: `cohort_tpl_<key>`.
    pub fn database_name(&self) -> String {
        format!("{TEMPLATE_PREFIX}{}", self.key)
    }

    fn validate(&self) -> Result<()> {
        let ok = !self.key.is_empty()
            && self.key.len() <= 40
            && self
                .key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidTemplateKey {
                key: self.key.clone(),
            })
        }
    }
}

/// A PostgreSQL server that hands out test databases: either an external
/// server named by a URL (`DATABASE_URL`) or a [`Cluster`] owned by the handle.
#[derive(Debug)]
pub struct ClusterHandle {
    url: String,
    admin: PgConnectOptions,
    cluster: Option<Cluster>,
}

impl From<Cluster> for ClusterHandle {
    fn from(cluster: Cluster) -> Self {
        Self {
            url: cluster.url().to_owned(),
            admin: cluster.connect_options(),
            cluster: Some(cluster),
        }
    }
}

impl ClusterHandle {
    /// Uses the server behind `DATABASE_URL` if that variable is set (and
    /// not empty), otherwise starts a new [`Cluster`].
    pub async fn from_env_or_start() -> Result<Self> {
        match std::env::var("DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => Self::from_url(&url),
            _ => Ok(Cluster::start().await?.into()),
        }
    }

    /// Uses an existing server. `url` may name any database on it; the
    /// connection is used as the administrative one (it needs `CREATEDB`).
    pub fn from_url(url: &str) -> Result<Self> {
        let admin: PgConnectOptions = url.parse().map_err(|source| Error::InvalidUrl {
            url: url.to_owned(),
            source,
        })?;
        Ok(Self {
            url: url.to_owned(),
            admin,
            cluster: None,
        })
    }

    /// The administrative connection URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connection options of the administrative connection.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.admin.clone()
    }

    /// The cluster owned by this handle, `None` for an external server.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// Whether this handle points at an external server (from a URL).
    pub fn is_external(&self) -> bool {
        self.cluster.is_none()
    }

    async fn admin_connection(&self) -> Result<PgConnection> {
        self.admin
            .clone()
            .disable_statement_logging()
            .connect()
            .await
            .map_err(|e| Error::sql("connecting to the admin database", e))
    }

    /// Makes sure the template database of `template` exists and returns its
    /// name. Concurrent callers in any number of processes are serialized by
    /// a PostgreSQL advisory lock; the setup runs once, on a database named
    /// `<name>_building` that is renamed to `<name>` only when complete.
    pub async fn ensure_template(&self, template: &TemplateSpec) -> Result<String> {
        let mut admin = self.admin_connection().await?;
        let name = self.ensure_template_on(&mut admin, template).await?;
        let _ = admin.close().await;
        Ok(name)
    }

    async fn ensure_template_on(
        &self,
        admin: &mut PgConnection,
        template: &TemplateSpec,
    ) -> Result<String> {
        template.validate()?;
        let name = template.database_name();
        if database_exists(admin, &name).await? {
            return Ok(name);
        }
        let lock_key = fnv1a(format!("cohort-pgtemp template {name}").as_bytes()) as i64;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(lock_key)
            .execute(&mut *admin)
            .await
            .map_err(|e| Error::sql("taking the template advisory lock", e))?;
        let result = self.build_template(admin, template, &name).await;
        let unlock = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(lock_key)
            .execute(&mut *admin)
            .await;
        if let Err(e) = unlock {
            tracing::warn!(error = %e, "releasing the template advisory lock failed");
        }
        result.map(|()| name)
    }

    async fn build_template(
        &self,
        admin: &mut PgConnection,
        template: &TemplateSpec,
        name: &str,
    ) -> Result<()> {
        if database_exists(admin, name).await? {
            return Ok(());
        }
        let building = format!("{name}_building");
        drop_database_force(admin, &building).await?;
        execute(admin, format!("CREATE DATABASE {}", quote_ident(&building)))
            .await
            .map_err(|e| Error::sql(format!("creating database {building}"), e))?;

        let started = std::time::Instant::now();
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(self.admin.clone().database(&building))
            .await
            .map_err(|e| Error::sql(format!("connecting to {building}"), e))?;
        let outcome = (template.setup)(&pool).await;
        pool.close().await;
        if let Err(source) = outcome {
            let _ = drop_database_force(admin, &building).await;
            return Err(Error::TemplateSetup {
                template: name.to_owned(),
                source,
            });
        }

        retry_in_use(admin, || {
            format!(
                "ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
                quote_ident(&building)
            )
        })
        .await
        .map_err(|e| Error::sql(format!("marking {building} as template"), e))?;
        retry_in_use(admin, || {
            format!(
                "ALTER DATABASE {} RENAME TO {}",
                quote_ident(&building),
                quote_ident(name)
            )
        })
        .await
        .map_err(|e| Error::sql(format!("renaming {building} to {name}"), e))?;
        tracing::info!(
            template = name,
            ms = started.elapsed().as_millis() as u64,
            "built template database"
        );
        Ok(())
    }

    /// Creates a new database `cohort_test_<uuid>` cloned from the template
    /// (building the template first if needed).
    pub async fn fresh_database(&self, template: &TemplateSpec) -> Result<TestDatabase> {
        let mut admin = self.admin_connection().await?;
        let tpl = self.ensure_template_on(&mut admin, template).await?;
        let db = self.create_test_database(&mut admin, Some(&tpl)).await;
        let _ = admin.close().await;
        db
    }

    /// Creates a new, empty database `cohort_test_<uuid>` (from `template1`).
    pub async fn fresh_empty_database(&self) -> Result<TestDatabase> {
        let mut admin = self.admin_connection().await?;
        let db = self.create_test_database(&mut admin, None).await;
        let _ = admin.close().await;
        db
    }

    async fn create_test_database(
        &self,
        admin: &mut PgConnection,
        template: Option<&str>,
    ) -> Result<TestDatabase> {
        let name = format!("{TEST_DB_PREFIX}{}", uuid::Uuid::new_v4().simple());
        retry_in_use(admin, || match template {
            Some(t) => format!(
                "CREATE DATABASE {} TEMPLATE {}",
                quote_ident(&name),
                quote_ident(t)
            ),
            None => format!("CREATE DATABASE {}", quote_ident(&name)),
        })
        .await
        .map_err(|e| Error::sql(format!("creating database {name}"), e))?;

        let options = self.admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with(options.clone())
            .await
            .map_err(|e| Error::sql(format!("connecting to {name}"), e))?;
        Ok(TestDatabase {
            url: url_with_database(&self.url, &options, &name),
            name,
            options,
            admin: self.admin.clone(),
            pool,
        })
    }
}

/// A fresh database for one test.
///
/// Dropping it closes nothing on the server: the database stays until the
/// (throw-away) cluster goes away. Call [`TestDatabase::drop_database`] to
/// remove it explicitly, e.g. on a long-lived `DATABASE_URL` server.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    options: PgConnectOptions,
    admin: PgConnectOptions,
    pool: PgPool,
}

impl TestDatabase {
    /// A pool (up to 10 connections) connected to this database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database name (`cohort_test_<uuid>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection URL for this database, e.g. to pass as `DATABASE_URL`
    /// to a spawned CLI process.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connection options for this database (to open extra connections).
    pub fn connect_options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// Opens an extra connection to this database, independent of the pool.
    pub async fn connect(&self) -> Result<PgConnection> {
        self.options
            .clone()
            .connect()
            .await
            .map_err(|e| Error::sql(format!("connecting to {}", self.name), e))
    }

    /// Closes the pool and drops the database (terminating other sessions).
    pub async fn drop_database(self) -> Result<()> {
        self.pool.close().await;
        let mut admin = self
            .admin
            .clone()
            .disable_statement_logging()
            .connect()
            .await
            .map_err(|e| Error::sql("connecting to the admin database", e))?;
        drop_database_force(&mut admin, &self.name).await?;
        let _ = admin.close().await;
        Ok(())
    }
}

static SHARED: OnceCell<ClusterHandle> = OnceCell::const_new();

/// The server shared by all tests of this process: `DATABASE_URL` if set,
/// otherwise a [`Cluster`] started on first use. A started cluster is never
/// dropped (it lives in a `static`); its watchdog stops it and removes its
/// directory when the process exits.
pub async fn test_cluster() -> Result<&'static ClusterHandle> {
    SHARED
        .get_or_try_init(ClusterHandle::from_env_or_start)
        .await
}

/// A fresh database cloned from `template` on the [`test_cluster`].
pub async fn fresh_database(template: &TemplateSpec) -> Result<TestDatabase> {
    test_cluster().await?.fresh_database(template).await
}

/// A fresh, empty database on the [`test_cluster`].
pub async fn fresh_empty_database() -> Result<TestDatabase> {
    test_cluster().await?.fresh_empty_database().await
}

/// Quotes an SQL identifier: wraps it in double quotes, doubling embedded ones.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

async fn execute(conn: &mut PgConnection, sql: String) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(sql))
        .execute(conn)
        .await
        .map(|_| ())
}

async fn database_exists(conn: &mut PgConnection, name: &str) -> Result<bool> {
    sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(conn)
        .await
        .map_err(|e| Error::sql("querying pg_database", e))
}

async fn drop_database_force(conn: &mut PgConnection, name: &str) -> Result<()> {
    execute(
        conn,
        format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(name)),
    )
    .await
    .map_err(|e| Error::sql(format!("dropping database {name}"), e))
}

/// Runs the statement, retrying with backoff while PostgreSQL reports
/// SQLSTATE 55006 (object in use, e.g. a template with connected sessions).
async fn retry_in_use(
    conn: &mut PgConnection,
    sql: impl Fn() -> String,
) -> Result<(), sqlx::Error> {
    let mut attempt = 0u32;
    loop {
        match execute(conn, sql()).await {
            Err(e)
                if attempt < 20
                    && e.as_database_error()
                        .and_then(|d| d.code())
                        .is_some_and(|c| c == OBJECT_IN_USE) =>
            {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(25 * u64::from(attempt.min(8)))).await;
            }
            other => return other,
        }
    }
}

/// 64-bit FNV-1a: stable across processes, platforms and Rust versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `base` with its database replaced by `db`: the path is replaced and any
/// `dbname=` query parameter dropped. Falls back to sqlx's own rendering.
fn url_with_database(base: &str, options: &PgConnectOptions, db: &str) -> String {
    let Some(scheme_end) = base.find("://") else {
        return options.to_url_lossy().to_string();
    };
    let rest = &base[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (tail, fragment) = match tail.find('#') {
        Some(i) => tail.split_at(i),
        None => (tail, ""),
    };
    let query = tail.find('?').map(|i| &tail[i + 1..]).unwrap_or("");
    let query: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("dbname="))
        .collect();
    let mut url = format!(
        "{}{}/{}",
        &base[..scheme_end + 3],
        authority,
        crate::cluster::percent_encode(db)
    );
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    url.push_str(fragment);
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> PgConnectOptions {
        PgConnectOptions::new_without_pgpass()
    }

    #[test]
    fn url_database_is_replaced() {
        assert_eq!(
            url_with_database(
                "postgres://postgres@localhost/postgres?host=%2Ftmp%2Fs&port=5432",
                &opts(),
                "db1"
            ),
            "postgres://postgres@localhost/db1?host=%2Ftmp%2Fs&port=5432"
        );
        assert_eq!(
            url_with_database("postgresql://u:p@h:5433", &opts(), "db1"),
            "postgresql://u:p@h:5433/db1"
        );
        assert_eq!(
            url_with_database("postgres://h/?dbname=x&sslmode=disable", &opts(), "db1"),
            "postgres://h/db1?sslmode=disable"
        );
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn keys_are_validated_and_hashed() {
        let k = TemplateSpec::hashed_key("My Schema!", b"CREATE TABLE t()");
        assert!(k.starts_with("my_schema__"));
        let spec = TemplateSpec::from_sql(k, "SELECT 1");
        assert!(spec.validate().is_ok());
        assert!(TemplateSpec::from_sql("Bad-Key", "SELECT 1")
            .validate()
            .is_err());
        assert!(TemplateSpec::from_sql("", "SELECT 1").validate().is_err());
        assert!(TemplateSpec::from_sql("a".repeat(41), "SELECT 1")
            .validate()
            .is_err());
    }
}
