//! A throw-away PostgreSQL cluster living in a temporary directory.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions as _, Connection as _};
use tempfile::TempDir;

use crate::binaries::PgBinaries;
use crate::error::{Error, Result};
use crate::privileges::{server_user, RunAs};

/// Port the server listens on. Only a unix socket in a private directory
/// is used, so a fixed port number cannot clash with other clusters.
const PORT: u16 = 5432;
/// `max_connections` of the throw-away server: room for many parallel test processes.
const MAX_CONNECTIONS: u32 = 200;
/// How long to wait for the server to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `Drop` waits for the supervisor to stop the server.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Supervisor script, run with `/bin/sh -c` (as the server user when we are root).
///
/// It starts `postgres` in the background and a watchdog subshell that blocks
/// reading its stdin, a pipe whose only writer is the owning process. The pipe
/// reaches EOF when the owner drops the [`Cluster`] *or* dies in any way
/// (even `kill -9`, or a cluster in a never-dropped `static`), whereupon the
/// watchdog marks the stop as intended and shuts the server down with SIGQUIT
/// (immediate shutdown). Once `postgres` exits after such a requested stop the
/// script removes the cluster directory; after an unexpected exit it leaves
/// the directory (and the log) for the owner to report and clean up.
///
/// Positional arguments: postgres binary, data dir, socket dir, log file,
/// cluster dir, port, max_connections.
const SUPERVISOR_SCRIPT: &str = r#"
PG="$1"; DATA="$2"; SOCK="$3"; LOG="$4"; DIR="$5"; PORT="$6"; MAXCONN="$7"
exec 3<&0
"$PG" -D "$DATA" -k "$SOCK" -p "$PORT" \
  -c listen_addresses= \
  -c max_connections="$MAXCONN" \
  </dev/null 3<&- >>"$LOG" 2>&1 &
PGPID=$!
(
  cat >/dev/null 2>&1
  : >"$DIR/stop-requested" 2>/dev/null
  kill -QUIT "$PGPID" 2>/dev/null
) <&3 &
WATCHDOG=$!
exec 3<&- 0</dev/null
wait "$PGPID"
CODE=$?
kill "$WATCHDOG" 2>/dev/null
if [ -e "$DIR/stop-requested" ]; then
  rm -rf "$DIR" 2>/dev/null
fi
exit "$CODE"
"#;

/// What every throw-away cluster runs with, for speed: nothing it holds
/// must outlive a crash of the machine. A cluster's own settings (or the
/// environment's) come after these in postgresql.conf and so win: a crash
/// test that needs commits to survive an immediate shutdown starts its
/// cluster with `synchronous_commit=on`.
const SPEED_SETTINGS: &str = "
# cohort-pgtemp: speed over durability
fsync = off
synchronous_commit = off
full_page_writes = off
";

/// Extra server settings for new clusters: `name=value` pairs separated by
/// `;` (e.g. `shared_buffers=2GB;work_mem=64MB`).
pub(crate) const SETTINGS_ENV: &str = "COHORT_PGTEMP_SETTINGS";

/// Turns `name=value;name=value` into postgresql.conf lines, refusing names
/// that are not setting names and values that would need quoting.
fn parse_settings(text: &str) -> std::result::Result<String, String> {
    let mut lines = String::from("\n# COHORT_PGTEMP_SETTINGS\n");
    for pair in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, value)) = pair.split_once('=') else {
            return Err(format!("{pair:?} is not name=value"));
        };
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
        {
            return Err(format!("{name:?} is not a server setting name"));
        }
        if value.is_empty()
            || !value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(format!(
                "the value of {name} ({value:?}) may hold only letters, digits, '.', '_' and '-'"
            ));
        }
        lines.push_str(&format!("{name} = '{value}'\n"));
    }
    Ok(lines)
}

/// A running, throw-away PostgreSQL server.
///
/// The server listens only on a unix socket in a private temporary
/// directory, runs with `fsync=off` and friends for speed, allows
/// 200 connections and otherwise uses PostgreSQL's default settings
/// (e.g. `max_locks_per_transaction = 64`). The superuser is `postgres`
/// with trust authentication.
///
/// Dropping the `Cluster` stops the server and removes its directory. If the
/// owning process dies without running `Drop`, a watchdog shell process
/// stops the server and removes the directory anyway.
#[derive(Debug)]
pub struct Cluster {
    dir: Option<TempDir>,
    root: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_path: PathBuf,
    url: String,
    options: PgConnectOptions,
    supervisor: Option<Child>,
    binaries: PgBinaries,
    run_as: Option<RunAs>,
    startup_time: Duration,
    /// postgresql.conf lines this cluster was started with beside the
    /// environment's (see [`Cluster::start_with_settings`]).
    settings: Option<String>,
}

impl Cluster {
    /// Finds the PostgreSQL binaries (see [`PgBinaries::find`]) and starts a
    /// new cluster, waiting until it accepts connections.
    pub async fn start() -> Result<Cluster> {
        let binaries = PgBinaries::find()?;
        Self::start_with(binaries).await
    }

    /// Starts a new cluster with these server settings too
    /// (`name=value;name=value`, as `COHORT_PGTEMP_SETTINGS` takes them):
    /// for a test that needs what a shared cluster does not have, such as
    /// `wal_level=logical` for a logical replication slot.
    pub async fn start_with_settings(settings: &str) -> Result<Cluster> {
        let lines = parse_settings(settings).map_err(|problem| Error::Settings {
            variable: "Cluster::start_with_settings",
            problem,
        })?;
        Self::start_inner(PgBinaries::find()?, Some(lines)).await
    }

    /// Starts a new cluster using the given binaries.
    pub async fn start_with(binaries: PgBinaries) -> Result<Cluster> {
        Self::start_inner(binaries, None).await
    }

    async fn start_inner(binaries: PgBinaries, settings: Option<String>) -> Result<Cluster> {
        let started = Instant::now();
        let mut cluster = Self::prepare(binaries, settings)?;
        cluster.initdb().await?;
        let initdb_time = started.elapsed();
        cluster.spawn_server()?;
        cluster.wait_until_ready().await?;
        cluster.startup_time = started.elapsed();
        tracing::info!(
            dir = %cluster.root.display(),
            user = cluster.run_as.as_ref().map(|u| u.name.as_str()).unwrap_or("(self)"),
            initdb_ms = initdb_time.as_millis() as u64,
            total_ms = cluster.startup_time.as_millis() as u64,
            "started throw-away PostgreSQL cluster"
        );
        Ok(cluster)
    }

    /// Starts a streaming standby of this cluster: a base backup taken with
    /// `pg_basebackup -R` (WAL streamed, `standby.signal` and
    /// `primary_conninfo` written), started in its own directory and socket
    /// directory, connected to this server over its unix socket. The
    /// standby's server settings are this cluster's. Dropping it stops it.
    pub async fn start_standby(&self) -> Result<Cluster> {
        let started = Instant::now();
        let mut standby = Self::prepare(self.binaries.clone(), self.settings.clone())?;
        let mut cmd = tokio::process::Command::new(self.binaries.bin_dir().join("pg_basebackup"));
        cmd.arg("-D")
            .arg(&standby.data_dir)
            .arg("-h")
            .arg(&self.socket_dir)
            .args([
                "-p",
                &PORT.to_string(),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ])
            .current_dir(&standby.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(user) = &standby.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        let out = cmd
            .output()
            .await
            .map_err(|e| Error::io("running pg_basebackup", e))?;
        if !out.status.success() {
            return Err(Error::CommandFailed {
                command: format!("pg_basebackup -D {} -R", standby.data_dir.display()),
                status: out.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        standby.spawn_server()?;
        standby.wait_until_ready().await?;
        standby.startup_time = started.elapsed();
        tracing::info!(
            dir = %standby.root.display(),
            primary = %self.root.display(),
            total_ms = standby.startup_time.as_millis() as u64,
            "started a streaming standby"
        );
        Ok(standby)
    }

    /// Starts a new cluster that archives its WAL (`archive_mode = on`,
    /// each segment copied into [`Cluster::archive_dir`], never
    /// overwritten): with [`Cluster::base_backup`] and
    /// [`Cluster::recover_to_restore_point`], a real point-in-time
    /// recovery.
    pub async fn start_archiving() -> Result<Cluster> {
        let started = Instant::now();
        let mut cluster = Self::prepare(PgBinaries::find()?, None)?;
        let archive = cluster.archive_dir();
        cluster.owned_dir(&archive)?;
        let a = archive.display();
        cluster.settings = Some(format!(
            "\n# archiving\nwal_level = 'replica'\narchive_mode = 'on'\narchive_command = 'test ! -f {a}/%f && cp %p {a}/%f'\n"
        ));
        cluster.initdb().await?;
        cluster.spawn_server()?;
        cluster.wait_until_ready().await?;
        cluster.startup_time = started.elapsed();
        Ok(cluster)
    }

    /// Where an archiving cluster copies its WAL segments.
    pub fn archive_dir(&self) -> PathBuf {
        self.root.join("archive")
    }

    /// A directory under this cluster's root, owned by the server's user.
    fn owned_dir(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        if let Some(user) = &self.run_as {
            std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))
                .map_err(|e| Error::io(format!("chown {} to {}", dir.display(), user.name), e))?;
        }
        Ok(())
    }

    /// Takes a base backup of this running cluster with `pg_basebackup`
    /// (WAL streamed with it) into a new directory under its root, and
    /// returns that directory.
    pub async fn base_backup(&self) -> Result<PathBuf> {
        let mut n = 1;
        while self.root.join(format!("backup-{n}")).exists() {
            n += 1;
        }
        let target = self.root.join(format!("backup-{n}"));
        let mut cmd = tokio::process::Command::new(self.binaries.bin_dir().join("pg_basebackup"));
        cmd.arg("-D")
            .arg(&target)
            .arg("-h")
            .arg(&self.socket_dir)
            .args([
                "-p",
                &PORT.to_string(),
                "-U",
                "postgres",
                "-X",
                "stream",
                "--no-sync",
            ])
            .current_dir(&self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        self.run_checked(cmd, format!("pg_basebackup -D {}", target.display()))
            .await?;
        Ok(target)
    }

    async fn run_checked(&self, mut cmd: tokio::process::Command, what: String) -> Result<()> {
        if let Some(user) = &self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        let out = cmd
            .output()
            .await
            .map_err(|e| Error::io(format!("running {what}"), e))?;
        if !out.status.success() {
            return Err(Error::CommandFailed {
                command: what,
                status: out.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(())
    }

    /// A point-in-time recovery: a new cluster, in its own directory,
    /// started from `backup` (a [`Cluster::base_backup`] of this cluster)
    /// and this cluster's WAL archive, recovered up to the restore point
    /// `name` (`pg_create_restore_point`) and promoted. It does not archive.
    /// Returns once recovery has ended and it accepts writes.
    pub async fn recover_to_restore_point(&self, backup: &Path, name: &str) -> Result<Cluster> {
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(Error::Settings {
                variable: "recover_to_restore_point",
                problem: format!(
                    "{name:?}: a restore point's name here takes letters, digits, '_' and '-'"
                ),
            });
        }
        let started = Instant::now();
        let mut restored = Self::prepare(self.binaries.clone(), self.settings.clone())?;
        let mut copy = tokio::process::Command::new("cp");
        copy.arg("-a")
            .arg(backup)
            .arg(&restored.data_dir)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        restored
            .run_checked(
                copy,
                format!("cp -a {} {}", backup.display(), restored.data_dir.display()),
            )
            .await?;
        let a = self.archive_dir();
        let conf = format!(
            "\n# point-in-time recovery\nrestore_command = 'cp {a}/%f %p'\nrecovery_target_name = '{name}'\nrecovery_target_action = 'promote'\narchive_mode = 'off'\n",
            a = a.display()
        );
        let auto = restored.data_dir.join("postgresql.auto.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&auto)
            .map_err(|e| Error::io(format!("opening {}", auto.display()), e))?;
        std::io::Write::write_all(&mut file, conf.as_bytes())
            .map_err(|e| Error::io(format!("writing {}", auto.display()), e))?;
        let signal = restored.data_dir.join("recovery.signal");
        std::fs::write(&signal, b"")
            .map_err(|e| Error::io(format!("writing {}", signal.display()), e))?;
        if let Some(user) = &restored.run_as {
            std::os::unix::fs::chown(&signal, Some(user.uid), Some(user.gid))
                .map_err(|e| Error::io(format!("chown {}", signal.display()), e))?;
        }
        restored.spawn_server()?;
        restored.wait_until_ready().await?;
        // Ready for reads during recovery; wait for the promotion.
        loop {
            let mut conn = restored.options.clone().connect().await.map_err(|e| {
                Error::io(
                    "connecting to the recovered cluster",
                    std::io::Error::other(e),
                )
            })?;
            let in_recovery: bool = sqlx::query_scalar("SELECT pg_catalog.pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await
                .map_err(|e| Error::io("asking the recovered cluster", std::io::Error::other(e)))?;
            let _ = sqlx::Connection::close(conn).await;
            if !in_recovery {
                break;
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::StartTimeout {
                    waited: started.elapsed(),
                    last_error: "still in recovery".into(),
                    log_tail: restored.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        restored.startup_time = started.elapsed();
        tracing::info!(
            dir = %restored.root.display(),
            target = name,
            total_ms = restored.startup_time.as_millis() as u64,
            "recovered a cluster to a restore point"
        );
        Ok(restored)
    }

    /// A cluster's directories and addresses, before its data directory
    /// exists and its server runs.
    fn prepare(binaries: PgBinaries, settings: Option<String>) -> Result<Cluster> {
        let run_as = server_user()?;
        let base = temp_base(run_as.is_some());
        let dir = tempfile::Builder::new()
            .prefix("cohort-pgtemp-")
            .tempdir_in(&base)
            .map_err(|e| Error::io(format!("creating temp dir in {}", base.display()), e))?;
        let root = dir.path().to_path_buf();
        let data_dir = root.join("data");
        let socket_dir = root.join("sock");
        let log_path = root.join("postgres.log");
        std::fs::create_dir(&socket_dir)
            .map_err(|e| Error::io(format!("creating {}", socket_dir.display()), e))?;
        if let Some(user) = &run_as {
            for p in [&root, &socket_dir] {
                std::os::unix::fs::chown(p, Some(user.uid), Some(user.gid))
                    .map_err(|e| Error::io(format!("chown {} to {}", p.display(), user.name), e))?;
            }
        }

        let url = format!(
            "postgres://postgres@localhost/postgres?host={}&port={PORT}&sslmode=disable",
            percent_encode(&socket_dir.to_string_lossy())
        );
        let options = PgConnectOptions::new_without_pgpass()
            .socket(&socket_dir)
            .port(PORT)
            .username("postgres")
            .database("postgres")
            .ssl_mode(PgSslMode::Disable);

        Ok(Cluster {
            dir: Some(dir),
            root,
            data_dir,
            socket_dir,
            log_path,
            url,
            options,
            supervisor: None,
            binaries,
            run_as,
            startup_time: Duration::ZERO,
            settings,
        })
    }

    async fn initdb(&self) -> Result<()> {
        let mut cmd = tokio::process::Command::new(self.binaries.initdb());
        cmd.arg("-D")
            .arg(&self.data_dir)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ])
            .current_dir(&self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(user) = &self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        let out = cmd
            .output()
            .await
            .map_err(|e| Error::io(format!("running {}", self.binaries.initdb().display()), e))?;
        if !out.status.success() {
            return Err(Error::CommandFailed {
                command: format!(
                    "{} -D {}",
                    self.binaries.initdb().display(),
                    self.data_dir.display()
                ),
                status: out.status.to_string(),
                output: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        // The speed settings first, then extra server settings (e.g. a
        // bigger `shared_buffers` for a benchmark, `synchronous_commit=on`
        // for a crash test), appended to the new cluster's postgresql.conf:
        // the environment's, then this cluster's own. Later lines win, so
        // every extra setting takes effect (on the command line the speed
        // settings would silently override them).
        let from_env = match std::env::var_os(SETTINGS_ENV) {
            Some(text) => Some(parse_settings(&text.to_string_lossy()).map_err(|problem| {
                Error::Settings {
                    variable: SETTINGS_ENV,
                    problem,
                }
            })?),
            None => None,
        };
        let lines: String = std::iter::once(SPEED_SETTINGS.to_owned())
            .chain(from_env)
            .chain(self.settings.clone())
            .collect();
        let conf = self.data_dir.join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(|e| Error::io(format!("opening {}", conf.display()), e))?;
        std::io::Write::write_all(&mut file, lines.as_bytes())
            .map_err(|e| Error::io(format!("writing {}", conf.display()), e))?;
        Ok(())
    }

    fn spawn_server(&mut self) -> Result<()> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(SUPERVISOR_SCRIPT)
            .arg("cohort-pgtemp-supervisor")
            .arg(self.binaries.postgres())
            .arg(&self.data_dir)
            .arg(&self.socket_dir)
            .arg(&self.log_path)
            .arg(&self.root)
            .arg(PORT.to_string())
            .arg(MAX_CONNECTIONS.to_string())
            .current_dir(&self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Own process group: a Ctrl-C aimed at the owner's terminal job
            // must not reach the server; the owner decides when it stops.
            .process_group(0);
        if let Some(user) = &self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        let child = cmd
            .spawn()
            .map_err(|e| Error::io("spawning the PostgreSQL supervisor (/bin/sh)", e))?;
        self.supervisor = Some(child);
        Ok(())
    }

    async fn wait_until_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        let mut last_error = String::from("(none)");
        loop {
            if let Some(child) = self.supervisor.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        return Err(Error::ServerExited {
                            status: status.to_string(),
                            log_tail: self.log_tail(),
                        })
                    }
                    Ok(None) => {}
                    Err(e) => return Err(Error::io("checking the server process", e)),
                }
            }
            if self.socket_dir.join(format!(".s.PGSQL.{PORT}")).exists() {
                let attempt = tokio::time::timeout(
                    Duration::from_secs(5),
                    self.options.clone().disable_statement_logging().connect(),
                )
                .await;
                match attempt {
                    Ok(Ok(conn)) => {
                        let _ = conn.close().await;
                        return Ok(());
                    }
                    Ok(Err(e)) => last_error = e.to_string(),
                    Err(_) => last_error = "connect attempt timed out".to_owned(),
                }
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::StartTimeout {
                    waited: started.elapsed(),
                    last_error,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the server with a fast shutdown (every session is cut, new
    /// ones are refused), keeps it down for `down`, then starts it again on
    /// the same data and waits until it accepts connections: a real
    /// database outage for tests of what survives one.
    pub async fn restart(&mut self, down: Duration) -> Result<()> {
        self.stop_with_signal("-INT", down).await
    }

    /// Crashes the server the way `pg_ctl restart -m immediate` does
    /// (SIGQUIT: every backend exits at once, nothing is flushed or
    /// checkpointed, in-flight transactions are simply lost), keeps it down
    /// for `down`, then starts it again, running crash recovery from the
    /// WAL, and waits until it accepts connections.
    pub async fn crash_restart(&mut self, down: Duration) -> Result<()> {
        self.stop_with_signal("-QUIT", down).await
    }

    async fn stop_with_signal(&mut self, signal: &str, down: Duration) -> Result<()> {
        let pid_file = self.data_dir.join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file)
            .map_err(|e| Error::io(format!("reading {}", pid_file.display()), e))?;
        let pid = text.lines().next().unwrap_or_default().trim().to_owned();
        // SIGINT is a fast shutdown, SIGQUIT an immediate one. No stop is requested from
        // the watchdog, so the supervisor leaves the directory in place.
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .map_err(|e| Error::io("signalling the server", e))?;
        if !status.success() {
            return Err(Error::io(
                "signalling the server",
                std::io::Error::other(format!("kill {signal} {pid} failed")),
            ));
        }
        if let Some(mut child) = self.supervisor.take() {
            let deadline = Instant::now() + STOP_TIMEOUT;
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    return Err(Error::io(
                        "restarting the server",
                        std::io::Error::other("the server did not stop in time"),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(down).await;
        self.spawn_server()?;
        self.wait_until_ready().await
    }

    /// The last ~40 lines of the server log (empty if unreadable).
    pub fn log_tail(&self) -> String {
        let Ok(mut f) = std::fs::File::open(&self.log_path) else {
            return String::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(8192)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A connection URL for the `postgres` database as superuser `postgres`,
    /// usable as `DATABASE_URL` by sqlx and libpq (`psql`), e.g.
    /// `postgres://postgres@localhost/postgres?host=%2Ftmp%2F...%2Fsock&port=5432&sslmode=disable`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connection options for the `postgres` database as superuser `postgres`.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// The cluster's temporary directory (holds `data/`, `sock/` and `postgres.log`).
    pub fn dir(&self) -> &Path {
        &self.root
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory holding the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The port number that is part of the socket file name (`.s.PGSQL.<port>`).
    pub fn port(&self) -> u16 {
        PORT
    }

    /// Path of the server log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// How long `initdb` plus server start-up took.
    pub fn startup_time(&self) -> Duration {
        self.startup_time
    }

    /// The binaries this cluster runs.
    pub fn binaries(&self) -> &PgBinaries {
        &self.binaries
    }

    /// Stops the server and removes the directory; the same as dropping the
    /// cluster, spelled out.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(mut child) = self.supervisor.take() {
            // Closing the pipe tells the watchdog to stop the server.
            drop(child.stdin.take());
            let deadline = Instant::now() + STOP_TIMEOUT;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        tracing::warn!(
                            dir = %self.root.display(),
                            "PostgreSQL supervisor did not stop in time; using pg_ctl"
                        );
                        self.pg_ctl_stop();
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        if let Some(dir) = self.dir.take() {
            // The supervisor normally removed it already; ignore NotFound & co.
            let _ = dir.close();
        }
    }

    fn pg_ctl_stop(&self) {
        let mut cmd = Command::new(self.binaries.pg_ctl());
        cmd.args(["stop", "-m", "immediate", "-w", "-D"])
            .arg(&self.data_dir)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(user) = &self.run_as {
            cmd.uid(user.uid).gid(user.gid);
        }
        let _ = cmd.status();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Where to create the cluster directory. When the server runs as another
/// user, every ancestor must be traversable by it; if `TMPDIR` is not, use `/tmp`.
fn temp_base(other_user: bool) -> PathBuf {
    let base = std::env::temp_dir();
    if !other_user || ancestors_traversable(&base) {
        return base;
    }
    PathBuf::from("/tmp")
}

fn ancestors_traversable(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    dir.ancestors().all(|p| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// Percent-encodes everything except unreserved URL characters.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod settings_tests {
    use super::parse_settings;

    #[test]
    fn settings_table() {
        assert_eq!(
            parse_settings("shared_buffers=2GB; work_mem = 64MB;").unwrap(),
            "\n# COHORT_PGTEMP_SETTINGS\nshared_buffers = '2GB'\nwork_mem = '64MB'\n"
        );
        for bad in [
            "shared_buffers",
            "=1",
            "Shared=1",
            "a=b'c",
            "a=",
            "a=1\nb=2",
            "x y=1",
        ] {
            assert!(parse_settings(bad).is_err(), "{bad:?}");
        }
    }
}
