//! The restore drill of docs/erasure.md ("A restore drill, end to end"),
//! run as written (RS-034): every ```sh block of the section, with
//! `sh -e`, on real servers from the installed PostgreSQL binaries and the
//! built `cohort`, with only the variables the guide tells the reader to
//! set (and the keys it tells them to export). Between the backup and the
//! recovery the test does what production does: erasures with a reference,
//! a hold placed and one released, through the CLI. The recovered cluster
//! lacks them; `restore-check` names them (exit 1); the replay onto a copy
//! of the journal erases the people again; the drill's check exits 0.
//!
//! PostgreSQL refuses to run as root: as root, every block (and the test's
//! own setup) runs as the server's user (`postgres`, else `nobody`), as the
//! guide tells the reader to, and every directory is that user's.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};

const POLICY: &str = r#"
[cohort]
schema = "cohort"

[journal]
dir = "JOURNAL"

[[entity]]
name = "Contact"
id = "6b6b6b6b-0000-4000-8000-000000000001"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
subjects = ["user_id"]
tenantless = true

[[category]]
name = "contacts"
strategy = "purge"
period = "3650d"
"#;

/// Five contacts: two of A's, one each of B's and C's, one of someone
/// nobody asks about.
const TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.contacts (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, user_id uuid NOT NULL);
    INSERT INTO app.contacts VALUES
      (1, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a0'),
      (2, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a0'),
      (3, now() - interval '400 days', '00000000-0000-4000-8000-0000000000b0'),
      (4, now() - interval '400 days', '00000000-0000-4000-8000-0000000000c0'),
      (5, now() - interval '400 days', '00000000-0000-4000-8000-0000000000ff');";
const A: &str = "00000000-0000-4000-8000-0000000000a0";
const B: &str = "00000000-0000-4000-8000-0000000000b0";
const C: &str = "00000000-0000-4000-8000-0000000000c0";
/// A hold on contact 5, placed before the backup and released after it.
const RELEASED: &str = "00000000-0000-0000-0000-0000000000e1";
/// A hold on C, placed after the backup.
const PLACED: &str = "00000000-0000-0000-0000-0000000000e2";

const KEYS: [(&str, &str); 2] = [
    ("COHORT_HASH_KEY", "an-example-hash-key-0123456789"),
    (
        "COHORT_JOURNAL_KEY",
        "7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a",
    ),
];
/// The primary's port (its socket is in a directory of its own).
const PRIMARY_PORT: &str = "5432";
const DRILL_PORT: &str = "5433";

/// The section's ```sh blocks, in order.
fn drill_blocks() -> Vec<String> {
    let guide = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/erasure.md"),
    )
    .unwrap();
    let section = guide
        .split("### A restore drill, end to end")
        .nth(1)
        .expect("the drill's section")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().to_owned())
        .collect()
}

/// The names the variables block sets (`NAME=value  # what`).
fn variable_names(block: &str) -> BTreeSet<String> {
    block
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|l| {
            let (name, _) = l.split_once('=').expect("NAME=value");
            assert!(
                name.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{l}"
            );
            name.to_owned()
        })
        .collect()
}

/// The unprivileged account the servers run as when we are root (as
/// cohort-pgtemp picks it: `postgres`, else `nobody`); `None` otherwise.
fn server_user() -> Option<(u32, u32)> {
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let user = ["postgres", "nobody"]
        .iter()
        .find_map(|user| {
            passwd.lines().find_map(|line| {
                let f: Vec<&str> = line.split(':').collect();
                (f.len() > 3 && f[0] == *user)
                    .then(|| (f[2].parse().unwrap(), f[3].parse().unwrap()))
            })
        })
        .filter(|(uid, _)| *uid != 0)
        .expect("an unprivileged user (postgres, nobody) to run PostgreSQL as");
    Some(user)
}

/// Everything the drill touches lives under one directory (the reader's
/// production and drill paths): the servers' user owns it.
struct Drill {
    root: tempfile::TempDir,
    run_as: Option<(u32, u32)>,
    /// The variables the guide has the reader set, with this drill's values.
    vars: Vec<(&'static str, String)>,
    path: String,
    outputs: std::cell::Cell<u32>,
}

/// What one script did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn show(&self, what: &str) -> String {
        format!(
            "{what}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Drill {
    fn new() -> Drill {
        let run_as = server_user();
        // Every ancestor must be traversable by the servers' user.
        let base = if run_as.is_some() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let root = tempfile::Builder::new()
            .prefix("cohort-drill-")
            .tempdir_in(base)
            .unwrap();
        let r = root.path().display().to_string();
        let pg_bin = cohort_pgtemp::PgBinaries::find().unwrap();
        // `cohort` where the servers' user can run it.
        let bin = root.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&bin, Some(uid), Some(gid)).unwrap();
        }
        let built = Path::new(env!("CARGO_BIN_EXE_cohort"));
        if std::fs::hard_link(built, bin.join("cohort")).is_err() {
            std::fs::copy(built, bin.join("cohort")).unwrap();
        }
        let path = format!(
            "{}:{}:{}",
            bin.display(),
            pg_bin.bin_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let journal = root.path().join("journal");
        std::fs::create_dir(&journal).unwrap();
        let policy = root.path().join("cohort.toml");
        std::fs::write(
            &policy,
            POLICY.replace("JOURNAL", &journal.display().to_string()),
        )
        .unwrap();
        if let Some((uid, gid)) = run_as {
            for p in [root.path(), &journal, &policy] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
            }
        }
        let vars = vec![
            (
                "PRIMARY",
                format!("host={r}/primary-socket port={PRIMARY_PORT} user=postgres"),
            ),
            ("WAL_ARCHIVE", format!("{r}/wal-archive")),
            ("BACKUP", format!("{r}/backup")),
            ("DRILL", format!("{r}/drill")),
            ("DRILL_PORT", DRILL_PORT.to_owned()),
            ("DATABASE", "app".to_owned()),
            ("POLICY", policy.display().to_string()),
        ];
        Drill {
            root,
            run_as,
            vars,
            path,
            outputs: std::cell::Cell::new(0),
        }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.path().join(name)
    }

    /// `sh -e -c SCRIPT` in the drill's directory, as the servers' user,
    /// with the guide's variables, the keys, PATH and HOME, and `extra`
    /// (the test's own scripts only). Output goes to files: a server a
    /// script starts would hold a pipe open.
    fn sh(&self, script: &str, extra: &[(&str, String)]) -> Ran {
        let n = self.outputs.get() + 1;
        self.outputs.set(n);
        let out = self.dir(&format!("script-{n}.out"));
        let err = self.dir(&format!("script-{n}.err"));
        let mut cmd = Command::new("sh");
        cmd.arg("-e")
            .arg("-c")
            .arg(script)
            .current_dir(self.root.path())
            .env_clear()
            .env("PATH", &self.path)
            .env("HOME", self.root.path())
            .env("LC_ALL", "C")
            .envs(KEYS)
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        let status = cmd.status().unwrap();
        Ran {
            code: status.code(),
            stdout: std::fs::read_to_string(out).unwrap(),
            stderr: std::fs::read_to_string(err).unwrap(),
        }
    }

    /// A script that must succeed.
    fn ok(&self, what: &str, script: &str, extra: &[(&str, String)]) -> Ran {
        let ran = self.sh(script, extra);
        assert_eq!(ran.code, Some(0), "{}\n{}", ran.show(what), self.logs());
        ran
    }

    /// The end of each server's log, for a failure's message (the
    /// directory goes with the test).
    fn logs(&self) -> String {
        let mut out = String::new();
        for log in ["primary.log", "drill/server.log"] {
            let text = std::fs::read_to_string(self.dir(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!(
                "{log}:\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            );
        }
        out
    }

    /// The test's own variables: production's data directory and socket,
    /// and a URL of its database for `cohort`.
    fn production(&self) -> Vec<(&'static str, String)> {
        let socket = self.dir("primary-socket");
        vec![
            ("PRIMARY_DATA", self.dir("primary").display().to_string()),
            ("PRIMARY_SOCKET", socket.display().to_string()),
            (
                "PRIMARY_URL",
                format!(
                    "postgresql://postgres@localhost/app?host={}&port={PRIMARY_PORT}",
                    socket.display()
                ),
            ),
        ]
    }

    async fn connect(&self, socket: &str, port: &str) -> PgConnection {
        PgConnectOptions::new_without_pgpass()
            .socket(self.dir(socket))
            .port(port.parse().unwrap())
            .username("postgres")
            .database("app")
            .ssl_mode(PgSslMode::Disable)
            .disable_statement_logging()
            .connect()
            .await
            .unwrap()
    }
}

/// The servers a script starts (`pg_ctl start` detaches them) are stopped,
/// and the drill's directory removed, when the test ends in any way: a
/// watchdog blocks reading a pipe only the test writes, and at its end
/// (the guard dropped, or the test killed) stops them.
const WATCHDOG: &str = r#"
cat >/dev/null
for data in primary drill/data; do
  if [ -f "$data/postmaster.pid" ]; then pg_ctl stop -D "$data" -m immediate -w >/dev/null 2>&1 || true; fi
done
cd /
rm -rf "$ROOT"
"#;

struct Watchdog(std::process::Child);

impl Watchdog {
    fn start(drill: &Drill) -> Watchdog {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .current_dir(drill.root.path())
            .env_clear()
            .env("PATH", &drill.path)
            .env("ROOT", drill.root.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // A Ctrl-C aimed at the test must leave it to clean up.
            .process_group(0);
        if let Some((uid, gid)) = drill.run_as {
            cmd.uid(uid).gid(gid);
        }
        Watchdog(cmd.spawn().unwrap())
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// What the test compares between production and the drill.
#[derive(Debug, PartialEq)]
struct State {
    contacts: Vec<i64>,
    requests: Vec<(String, String)>,
    holds: Vec<(String, bool)>,
}

async fn state(conn: &mut PgConnection) -> State {
    State {
        contacts: sqlx::query_scalar("SELECT id FROM app.contacts ORDER BY id")
            .fetch_all(&mut *conn)
            .await
            .unwrap(),
        requests: sqlx::query_as(
            "SELECT reference, state FROM cohort.erasure_request ORDER BY reference",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
        holds: sqlx::query_as(
            "SELECT hold_id::text, released_at IS NULL FROM cohort.retention_hold ORDER BY hold_id",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap(),
    }
}

#[tokio::test]
async fn the_guides_restore_drill_recovers_a_second_cluster_and_replays_what_it_lacks() {
    let blocks = drill_blocks();
    let roles = [
        "DRILL_PORT=",
        "archive_command",
        "pg_basebackup",
        "pg_switch_wal",
        "recovery.signal",
        "restore-check",
        "replay --journal-copy",
        "--dry-run",
        "rm -rf",
    ];
    assert_eq!(blocks.len(), roles.len(), "{blocks:#?}");
    for (block, role) in blocks.iter().zip(roles) {
        assert!(block.contains(role), "expected {role} in\n{block}");
    }
    let [vars, archiving, backup, archived, recover, check, replay, drill_check, throw_away] =
        &blocks[..]
    else {
        unreachable!()
    };
    let drill = Drill::new();
    let _watchdog = Watchdog::start(&drill);
    assert_eq!(
        variable_names(vars),
        drill.vars.iter().map(|(k, _)| k.to_string()).collect(),
        "the test sets exactly the variables the guide has the reader set"
    );
    let production = drill.production();

    // Production, as the reader has it: a server with Cohort's tables.
    drill.ok(
        "starting production",
        &format!(
            "initdb -D \"$PRIMARY_DATA\" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >/dev/null
             mkdir \"$PRIMARY_SOCKET\"
             pg_ctl start -D \"$PRIMARY_DATA\" -l primary.log -w -o \"-k $PRIMARY_SOCKET -p {PRIMARY_PORT} -c listen_addresses= -c fsync=off\"
             createdb -h \"$PRIMARY_SOCKET\" -p {PRIMARY_PORT} -U postgres app"
        ),
        &production,
    );
    let mut primary = drill.connect("primary-socket", PRIMARY_PORT).await;
    sqlx::raw_sql(TABLES).execute(&mut primary).await.unwrap();
    primary.close().await.unwrap();
    let on_production =
        |args: &str| format!("cohort --config \"$POLICY\" --database-url \"$PRIMARY_URL\" {args}");
    drill.ok("migrate", &on_production("migrate"), &production);
    drill.ok(
        "a hold before the backup",
        &on_production(&format!(
            "holds create --entity Contact --record 5 --reason claim --hold-id {RELEASED}"
        )),
        &production,
    );

    // The backup side: archiving (the restart is the reader's own way of
    // running the server: pg_ctl here), the base backup, the restore point.
    drill.ok("archiving", archiving, &[]);
    drill.ok(
        "the restart",
        &format!(
            "pg_ctl stop -D \"$PRIMARY_DATA\" -m fast -w
             pg_ctl start -D \"$PRIMARY_DATA\" -l primary.log -w -o \"-k $PRIMARY_SOCKET -p {PRIMARY_PORT} -c listen_addresses= -c fsync=off\""
        ),
        &production,
    );
    drill.ok("the base backup", backup, &[]);

    // Production goes on: two people erased, one kept by a hold placed
    // after the backup, and the earlier hold released.
    let mut primary = drill.connect("primary-socket", PRIMARY_PORT).await;
    for (what, args) in [
        (
            "erase A",
            format!("erase --tenantless --subject {A} --reference SAR-1"),
        ),
        (
            "hold C",
            format!("holds create --subject {C} --reason litigation --hold-id {PLACED}"),
        ),
        (
            "erase C",
            format!("erase --tenantless --subject {C} --reference SAR-2"),
        ),
        (
            "erase B",
            format!("erase --tenantless --subject {B} --reference SAR-3"),
        ),
        ("release", format!("holds release {RELEASED}")),
    ] {
        drill.ok(what, &on_production(&args), &production);
    }
    let after = state(&mut primary).await;
    assert_eq!(after.contacts, [4, 5], "C's row held, the fifth untouched");
    assert_eq!(
        after.requests,
        [
            ("SAR-1", "completed"),
            ("SAR-2", "waiting"),
            ("SAR-3", "completed")
        ]
        .map(|(r, s)| (r.to_owned(), s.to_owned()))
    );

    // The recovery side: everyone is back on the drill's cluster.
    drill.ok("archiving up to now", archived, &[]);
    drill.ok("the recovery", recover, &[]);
    let mut recovered = drill.connect("drill/socket", DRILL_PORT).await;
    let restored = state(&mut recovered).await;
    assert_eq!(
        restored.contacts,
        [1, 2, 3, 4, 5],
        "recovered to the restore point"
    );
    assert!(restored.requests.is_empty(), "{restored:?}");
    assert_eq!(restored.holds, [(RELEASED.to_owned(), true)]);

    // Cohort's steps: the gaps named, the replay, the drill's check.
    let gaps = drill.sh(check, &[]);
    assert_eq!(
        gaps.code,
        Some(1),
        "{}\n{}",
        gaps.show("restore-check"),
        drill.logs()
    );
    let named: [String; 5] = [
        "erasure request SAR-1 (completed) is not in the database".into(),
        "erasure request SAR-2 (waiting) is not in the database".into(),
        "erasure request SAR-3 (completed) is not in the database".into(),
        format!("hold {PLACED} is not in the database"),
        format!("hold {RELEASED} was released, and is in force in the database"),
    ];
    for named in named {
        assert!(
            gaps.stdout.contains(&named),
            "{named}\n{}",
            gaps.show("restore-check")
        );
    }
    assert_eq!(
        state(&mut recovered).await,
        restored,
        "restore-check only reads"
    );
    // Production's journal, which the drill must leave as it was.
    let production_journal = drill.dir("journal").join("cohort-journal.jsonl");
    let journal_before = std::fs::read(&production_journal).unwrap();
    let replayed = drill.ok("the replay", replay, &[]);
    assert!(
        replayed
            .stdout
            .contains("The database knows everything the journal holds."),
        "{}",
        replayed.show("the replay")
    );
    assert_eq!(
        state(&mut recovered).await,
        after,
        "the drill's cluster has production's rows, requests and holds"
    );
    let checked = drill.ok("the drill's check", drill_check, &[]);
    assert!(
        checked
            .stdout
            .contains("The database knows everything the journal holds."),
        "{}",
        checked.show("the drill's check")
    );
    recovered.close().await.unwrap();
    assert_eq!(
        std::fs::read(&production_journal).unwrap(),
        journal_before,
        "the drill replayed onto its copy: production's journal is unchanged"
    );

    // Thrown away: the drill's server stopped, its directory gone.
    drill.ok("throwing the drill away", throw_away, &[]);
    assert!(!drill.dir("drill").exists());
    primary.close().await.unwrap();
}
