//! Throw-away PostgreSQL servers and fresh per-test databases for Cohort's tests.
//!
//! # Design
//!
//! **Finding the server binaries** ([`PgBinaries::find`]): the `PG_BIN`
//! environment variable (a directory with `initdb` and `postgres`), then
//! `pg_config --bindir` (only if that directory really contains `initdb` and
//! `postgres`), then the newest `/usr/lib/postgresql/<version>/bin` (numeric
//! version sort, the Debian/Ubuntu layout), then `PATH`. If nothing is found
//! the error says how to install PostgreSQL or to set `PG_BIN` / `DATABASE_URL`.
//!
//! **A cluster** ([`Cluster::start`]) lives in a temporary directory:
//! `initdb --no-sync` into `<dir>/data`, then `postgres` listening only on a
//! unix socket in `<dir>/sock` (`listen_addresses=''`), with `fsync`,
//! `synchronous_commit` and `full_page_writes` off (in postgresql.conf,
//! before any setting of the environment's or the cluster's own, which
//! win) and `max_connections=200`.
//! Everything else keeps PostgreSQL's defaults (notably
//! `max_locks_per_transaction = 64`) so tests prove things work on a
//! default-configured server. `COHORT_PGTEMP_SETTINGS` adds settings to a
//! new cluster's `postgresql.conf` (`name=value` pairs separated by `;`,
//! e.g. `shared_buffers=2GB` for a benchmark; an unusable value stops
//! start-up with an error). Start-up takes well under a second to a few
//! seconds and is logged with `tracing`.
//!
//! **Root**: PostgreSQL refuses to run as root. When the effective uid
//! (from `/proc/self/status`, else `id -u`) is 0, `initdb` and `postgres` run
//! as the `postgres` user from `/etc/passwd` (else `nobody`) through std's
//! safe `CommandExt::uid`/`gid`; the cluster directory is chowned to that user
//! and created under a base directory whose ancestors it can traverse
//! (falling back to `/tmp`). No `sudo`, no `unsafe`.
//!
//! **Watchdog**: the server is started by a small `/bin/sh` supervisor whose
//! stdin is a pipe written only by the owning process. A watchdog subshell
//! blocks reading it; end-of-file means the owner dropped the [`Cluster`] or
//! died (including `kill -9`, or a cluster kept in a `static` that is never
//! dropped). The watchdog then stops the server (immediate shutdown) and the
//! supervisor removes the directory. `Drop` uses the very same path and then
//! waits for the supervisor, so the two never race.
//!
//! **Templates** ([`fresh_database`], [`TemplateSpec`]): tests get their own
//! database `cohort_test_<uuid>`, created with `CREATE DATABASE ... TEMPLATE
//! cohort_tpl_<key>`. The template is built once per server *across
//! processes* (cargo-nextest runs each test in its own process): under a
//! `pg_advisory_lock`, the setup closure runs on `cohort_tpl_<key>_building`,
//! which is then marked `IS_TEMPLATE true ALLOW_CONNECTIONS false` and renamed,
//! so a half-built template is never cloned. `CREATE DATABASE` is retried
//! while PostgreSQL reports the template busy (SQLSTATE 55006).
//!
//! **One cluster per test run**: [`test_cluster`] uses `DATABASE_URL` if set,
//! otherwise starts one cluster per process. The `cohort-pgtemp` binary starts
//! one cluster for a whole run and exports its URL:
//!
//! ```text
//! cargo run -q -p cohort-pgtemp -- exec -- cargo test --workspace
//! cohort-pgtemp serve > pg.env &   # writes DATABASE_URL=...; stop it with kill (SIGTERM)
//! ```

mod binaries;
mod cluster;
mod error;
mod privileges;
mod testdb;

pub use binaries::PgBinaries;
pub use cluster::Cluster;
pub use error::{BoxError, Error, Result};
pub use testdb::{
    fresh_database, fresh_empty_database, quote_ident, test_cluster, ClusterHandle, SetupFuture,
    TemplateSpec, TestDatabase,
};
