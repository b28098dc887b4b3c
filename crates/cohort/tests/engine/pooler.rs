//! PgBouncer in front of the server (Debian's `pgbouncer`, installed by
//! `.ci/run`, started here on a loopback port): in transaction (and
//! statement) pooling Cohort's session advisory locks cannot work, and
//! Cohort refuses at startup with a message that says so; in session
//! pooling it works, sweeps included.

use crate::support;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::Duration;

use cohort::{Cohort, RunStatus, SweepRequest};
use cohort_pgtemp::Cluster;
use support::*;

/// A running pgbouncer; killed when dropped.
struct Bouncer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// pgbouncer in `mode` in front of `cluster`, as the cluster's own OS user
/// (pgbouncer, like PostgreSQL, will not run as root).
fn bouncer(cluster: &Cluster, mode: &str) -> Bouncer {
    let bin = std::env::var("COHORT_PGBOUNCER").unwrap_or_else(|_| "/usr/sbin/pgbouncer".into());
    assert!(
        std::path::Path::new(&bin).exists(),
        "{bin} not found: install Debian's pgbouncer package (.ci/run does), or set COHORT_PGBOUNCER"
    );
    let owner = std::fs::metadata(cluster.dir()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = format!(
        "[databases]\n* = host={socket} port={pgport}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {dir}/users.txt\npool_mode = {mode}\ndefault_pool_size = 4\nmax_client_conn = 50\nlogfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\nignore_startup_parameters = extra_float_digits,options\n",
        socket = cluster.socket_dir().display(),
        pgport = cluster.port(),
        dir = dir.path().display(),
    );
    std::fs::write(dir.path().join("pgbouncer.ini"), config).unwrap();
    std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
    for entry in ["", "pgbouncer.ini", "users.txt"] {
        std::os::unix::fs::chown(dir.path().join(entry), Some(owner.uid()), Some(owner.gid()))
            .unwrap();
    }
    let mut cmd = Command::new(&bin);
    cmd.arg(dir.path().join("pgbouncer.ini"));
    if nix_is_root() {
        cmd.uid(owner.uid()).gid(owner.gid());
    }
    let child = cmd.spawn().expect("start pgbouncer");
    let log = dir.path().join("pgbouncer.log");
    wait_until_blocking(
        &format!("pgbouncer to listen (its log: {})", log.display()),
        Duration::from_secs(10),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    Bouncer {
        child,
        port,
        _dir: dir,
    }
}

fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

async fn through(bouncer: &Bouncer) -> sqlx::PgPool {
    let options = sqlx::postgres::PgConnectOptions::new()
        .host("127.0.0.1")
        .port(bouncer.port)
        .username("postgres")
        .database("postgres")
        // Transaction pooling cannot keep server-side prepared statements.
        .statement_cache_capacity(0);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap()
}

async fn build(pool: sqlx::PgPool) -> Result<Cohort, cohort::Error> {
    let mut b = Cohort::builder(pool).config(test_config()).rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    b.build().await
}

/// RS-PGBOUNCER-001: transaction pooling is detected and refused at
/// startup, with the reason; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_is_refused_at_startup() {
    let cluster = Cluster::start().await.unwrap();
    let direct = sqlx::PgPool::connect(cluster.url()).await.unwrap();
    cohort::schema::migrate(&mut direct.acquire().await.unwrap(), "public")
        .await
        .unwrap();
    exec(&direct, ENGINE_TABLES).await;
    let bouncer = bouncer(&cluster, "transaction");
    let err = build(through(&bouncer).await).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, cohort::Error::Validation(_)), "{err}");
    assert!(text.contains("does not keep its session"), "{text}");
    assert!(text.contains("session mode"), "{text}");
    assert_eq!(ledger_rows(&direct, "public").await, 0);
    drop(bouncer);
    cluster.stop();
}

/// In session pooling Cohort works as on a direct connection: a sweep runs
/// and settles, and no advisory lock outlives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_works() {
    let cluster = Cluster::start().await.unwrap();
    let direct = sqlx::PgPool::connect(cluster.url()).await.unwrap();
    cohort::schema::migrate(&mut direct.acquire().await.unwrap(), "public")
        .await
        .unwrap();
    exec(&direct, ENGINE_TABLES).await;
    let bouncer = bouncer(&cluster, "session");
    let cohort = build(through(&bouncer).await).await.unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    assert!(r.affected() > 0);
    let locks: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
            .fetch_one(&direct)
            .await
            .unwrap();
    assert_eq!(locks, 0);
    drop(bouncer);
    cluster.stop();
}
