//! Integration tests for the throw-away PostgreSQL harness.
//!
//! They work both without `DATABASE_URL` (a cluster per test process) and
//! with it (shared-database tests use that server), and when run as root.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cohort_pgtemp::{fresh_database, fresh_empty_database, Cluster, Error, TemplateSpec};
use sqlx::postgres::PgConnection;
use sqlx::{ConnectOptions as _, Connection as _};

const BIN: &str = env!("CARGO_BIN_EXE_cohort-pgtemp");

/// A template key unique to this test run, so a long-lived `DATABASE_URL`
/// server never hands us a template from an earlier run.
fn unique_key(label: &str) -> String {
    format!(
        "{label}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

async fn show(conn: &mut PgConnection, setting: &'static str) -> String {
    let sql = match setting {
        "max_locks_per_transaction" => "SHOW max_locks_per_transaction",
        "fsync" => "SHOW fsync",
        "max_connections" => "SHOW max_connections",
        "synchronous_commit" => "SHOW synchronous_commit",
        "full_page_writes" => "SHOW full_page_writes",
        other => panic!("unexpected setting {other}"),
    };
    sqlx::query_scalar(sql).fetch_one(conn).await.unwrap()
}

#[tokio::test]
async fn cluster_starts_with_default_lock_settings_and_fast_io() {
    let cluster = Cluster::start().await.expect("cluster starts");
    assert!(cluster.startup_time() > std::time::Duration::ZERO);
    eprintln!("cluster start took {:?}", cluster.startup_time());

    let mut conn = cluster.connect_options().connect().await.unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);
    assert_eq!(show(&mut conn, "max_locks_per_transaction").await, "64");
    assert_eq!(show(&mut conn, "fsync").await, "off");
    assert_eq!(show(&mut conn, "max_connections").await, "200");
    conn.close().await.unwrap();

    // The URL form (unix socket via ?host=) works too, as the superuser.
    let mut via_url = PgConnection::connect(cluster.url()).await.unwrap();
    let is_super: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&mut via_url)
            .await
            .unwrap();
    assert!(is_super);
    via_url.close().await.unwrap();
}

/// A cluster's own settings win over the speed settings every cluster
/// runs with (they once sat on the server's command line, where they
/// silently overrode `synchronous_commit=on` asked by a crash test).
#[tokio::test]
async fn a_clusters_own_settings_win_over_the_speed_settings() {
    let default = Cluster::start().await.unwrap();
    let mut conn = default.connect_options().connect().await.unwrap();
    assert_eq!(show(&mut conn, "synchronous_commit").await, "off");
    assert_eq!(show(&mut conn, "full_page_writes").await, "off");
    conn.close().await.unwrap();
    default.stop();

    let durable = Cluster::start_with_settings("synchronous_commit=on;full_page_writes=on")
        .await
        .unwrap();
    let mut conn = durable.connect_options().connect().await.unwrap();
    assert_eq!(show(&mut conn, "synchronous_commit").await, "on");
    assert_eq!(show(&mut conn, "full_page_writes").await, "on");
    assert_eq!(show(&mut conn, "fsync").await, "off", "the rest stays fast");
    conn.close().await.unwrap();
}

#[tokio::test]
async fn dropping_a_cluster_stops_the_server_and_removes_its_directory() {
    let cluster = Cluster::start().await.unwrap();
    let dir = cluster.dir().to_path_buf();
    let options = cluster.connect_options();
    assert!(cluster.data_dir().join("PG_VERSION").exists());
    let conn = options.connect().await.unwrap();
    drop(conn);

    drop(cluster);
    assert!(!dir.exists(), "{} still exists", dir.display());
    let err = options.connect().await;
    assert!(err.is_err(), "server still accepts connections");
}

#[tokio::test]
async fn fresh_databases_from_one_template_are_independent() {
    let spec = TemplateSpec::new(unique_key("indep"), |pool| {
        Box::pin(async move {
            sqlx::query("CREATE TABLE items (id int PRIMARY KEY)")
                .execute(pool)
                .await?;
            sqlx::query("INSERT INTO items VALUES (1)")
                .execute(pool)
                .await?;
            Ok(())
        })
    });
    let a = fresh_database(&spec).await.unwrap();
    let b = fresh_database(&spec).await.unwrap();
    assert_ne!(a.name(), b.name());
    assert!(a.name().starts_with("cohort_test_"));

    sqlx::query("INSERT INTO items VALUES (2), (3)")
        .execute(a.pool())
        .await
        .unwrap();
    let count_a: i64 = sqlx::query_scalar("SELECT count(*) FROM items")
        .fetch_one(a.pool())
        .await
        .unwrap();
    let count_b: i64 = sqlx::query_scalar("SELECT count(*) FROM items")
        .fetch_one(b.pool())
        .await
        .unwrap();
    assert_eq!((count_a, count_b), (3, 1));

    // url() and connect() reach the same database as the pool.
    let mut by_url = PgConnection::connect(b.url()).await.unwrap();
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut by_url)
        .await
        .unwrap();
    assert_eq!(db, b.name());
    let mut extra = a.connect().await.unwrap();
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&mut extra)
        .await
        .unwrap();
    assert_eq!(db, a.name());

    by_url.close().await.unwrap();
    extra.close().await.unwrap();
    a.drop_database().await.unwrap();
    b.drop_database().await.unwrap();
}

static CONCURRENT_SETUP_RUNS: AtomicUsize = AtomicUsize::new(0);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrently_requested_template_is_built_once() {
    let spec = Arc::new(TemplateSpec::new(unique_key("conc"), |pool| {
        Box::pin(async move {
            CONCURRENT_SETUP_RUNS.fetch_add(1, Ordering::SeqCst);
            // Make the build slow enough that the other tasks pile up on the lock.
            sqlx::query("SELECT pg_sleep(0.3)").execute(pool).await?;
            sqlx::query("CREATE TABLE marker (x int)")
                .execute(pool)
                .await?;
            Ok(())
        })
    }));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let spec = Arc::clone(&spec);
            tokio::spawn(async move { fresh_database(&spec).await })
        })
        .collect();
    let mut names = Vec::new();
    for task in tasks {
        let db = task.await.unwrap().unwrap();
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM marker")
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(n, 0);
        names.push(db.name().to_owned());
        db.drop_database().await.unwrap();
    }
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 6);
    assert_eq!(CONCURRENT_SETUP_RUNS.load(Ordering::SeqCst), 1);

    // The finished template is a real template that nobody can connect to.
    let cluster = cohort_pgtemp::test_cluster().await.unwrap();
    let mut admin = cluster.connect_options().connect().await.unwrap();
    let (is_template, allow_conn): (bool, bool) =
        sqlx::query_as("SELECT datistemplate, datallowconn FROM pg_database WHERE datname = $1")
            .bind(spec.database_name())
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(is_template);
    assert!(!allow_conn);
    let building: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(format!("{}_building", spec.database_name()))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(building, 0);
    admin.close().await.unwrap();
}

#[tokio::test]
async fn failing_template_setup_is_reported_and_leaves_no_template() {
    let spec = TemplateSpec::from_sql(unique_key("broken"), "CREATE TABLE (");
    let err = fresh_database(&spec).await.unwrap_err();
    assert!(matches!(err, Error::TemplateSetup { .. }), "{err}");

    let cluster = cohort_pgtemp::test_cluster().await.unwrap();
    let mut admin = cluster.connect_options().connect().await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname LIKE $1")
        .bind(format!("{}%", spec.database_name()))
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(left, 0);
    admin.close().await.unwrap();
}

#[tokio::test]
async fn invalid_template_key_is_rejected() {
    let spec = TemplateSpec::from_sql("Not-Valid", "SELECT 1");
    let err = fresh_database(&spec).await.unwrap_err();
    assert!(matches!(err, Error::InvalidTemplateKey { .. }), "{err}");
}

#[tokio::test]
async fn empty_database_is_empty_and_can_be_dropped() {
    let db = fresh_empty_database().await.unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(tables, 0);

    let name = db.name().to_owned();
    let cluster = cohort_pgtemp::test_cluster().await.unwrap();
    db.drop_database().await.unwrap();
    let mut admin = cluster.connect_options().connect().await.unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(!exists);
    admin.close().await.unwrap();
}

#[test]
fn exec_forwards_the_exit_code_and_sets_database_url() {
    let status = Command::new(BIN)
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            r#"test -n "$DATABASE_URL" || exit 3; exit 7"#,
        ])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));

    let status = Command::new(BIN)
        .args(["exec", "--", "false"])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
}

#[test]
fn exec_starts_its_own_server_without_database_url() {
    let out = Command::new(BIN)
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            r#"printf '%s\n%s\n' "$PG_TEMP_STARTED" "$DATABASE_URL""#,
        ])
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("1"));
    let url = lines.next().unwrap();
    assert!(
        url.starts_with("postgres://postgres@localhost/postgres?host=%2F"),
        "{url}"
    );
    // The cluster is gone once exec returns: its socket directory was removed.
    let host = url
        .split("host=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    let sock_dir = host.replace("%2F", "/");
    assert!(
        !std::path::Path::new(&sock_dir).exists(),
        "{sock_dir} left behind"
    );
}

#[test]
fn serve_prints_a_working_url_and_stops_when_stdin_closes() {
    let mut child = Command::new(BIN)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim_end()
        .strip_prefix("DATABASE_URL=")
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
        .to_owned();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let v: i32 = sqlx::query_scalar("SELECT 40 + 2")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(v, 42);
        conn.close().await.unwrap();
    });

    let mut stdin = child.stdin.take().unwrap();
    stdin.flush().unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success());
    rt.block_on(async {
        assert!(PgConnection::connect(&url).await.is_err());
    });
}
