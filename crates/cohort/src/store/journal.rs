//! Writing and reading the journal's stores (see [`crate::domain::journal`]): a
//! directory of append-only, fsynced files, or a table in another
//! PostgreSQL database. Each append takes the store's lock (an exclusive
//! file lock, or the table's `EXCLUSIVE` lock), reads the last entry,
//! checks it (its hash, its key) and links the new one to it.
//!
//! A handle opens its journal once ([`Journal::new`]): the key is resolved
//! then (a missing key refuses each journaled operation, as before, without
//! reading the environment again), and a journal in a database keeps one
//! connection between appends, checked with a round trip before each use and
//! opened again when the server dropped it.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection};

use crate::domain::journal::{
    check_next, verify_lines, Entry, JournalConfig, JournalKey, JournalTarget, Record, Stamp,
    FILE_NAME, JOURNAL_GENESIS,
};
use crate::error::{Error, Problems, Result};
use crate::sql::journal as sql;

/// How long a journal database may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of a journal file's end is read to find its last entry.
const TAIL_BYTES: u64 = 64 * 1024;

/// Why a store could not be written or read. Each is said inside the
/// journal's own refusal ("the journal in DIR cannot be written (WHY)").
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// The journal's database did not accept a connection.
    #[error("unreachable: {0}")]
    Unreachable(sqlx::Error),
    /// The journal's database did not answer in time.
    #[error("unreachable: no answer within {}s", CONNECT_TIMEOUT.as_secs())]
    NoAnswer,
    /// A statement on the journal's database failed.
    #[error("{0}")]
    Database(#[from] sqlx::Error),
    /// The journal's directory is not there.
    #[error("{} is not a directory (create it, on storage apart from the database's)", .0.display())]
    NoDirectory(PathBuf),
    /// A file operation failed.
    #[error("{doing}{}: {source}", .path.display())]
    File {
        /// What was being done ("" for opening, "locking ", …).
        doing: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The file's last line has no end: a write was cut short.
    #[error("its last line is incomplete (a write cut short): check the file and end or remove that line by hand")]
    Incomplete,
    /// The last line or row is not an entry.
    #[error("its last {what} is not a journal entry ({source})")]
    NotAnEntry {
        /// "line" or "entry".
        what: &'static str,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// The last entry's content does not give its hash.
    #[error("its last entry ({0}) was changed: its content does not give its hash")]
    Changed(u64),
    /// The last entry was written with another key.
    #[error("it was written with another key (key id {theirs}; COHORT_JOURNAL_KEY is {ours})")]
    AnotherKey {
        /// The key id on the entry.
        theirs: String,
        /// This handle's key id.
        ours: String,
    },
    /// The new entry would not follow the last one.
    #[error("{0}")]
    Unlinked(crate::domain::journal::JournalBreak),
    /// The blocking file writer or reader stopped.
    #[error("the journal's {0} stopped: {1}")]
    Stopped(&'static str, tokio::task::JoinError),
}

type Stored<T> = std::result::Result<T, StoreError>;

/// A journal opened by a handle: where, its key (or why there is none),
/// and a journal database's connection between uses.
pub(crate) struct Journal {
    config: JournalConfig,
    key: std::result::Result<JournalKey, Problems>,
    /// A URL journal's connection (`None`: not yet opened, or dropped
    /// after a failure).
    conn: tokio::sync::Mutex<Option<PgConnection>>,
    /// Whether a URL journal was found on another server than the
    /// retained database's (checked until it is).
    apart: AtomicBool,
    /// Whether a URL journal's table is known to be there (created on the
    /// first append, and again after any failed one).
    table_made: AtomicBool,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("target", &self.config.describe())
            .field("keyed", &self.key.is_ok())
            .finish()
    }
}

impl Journal {
    /// Opens the configured journal: its key is resolved now; nothing is
    /// read or written until it is used.
    pub(crate) fn new(config: JournalConfig) -> Self {
        let key = match config.resolved_key() {
            Ok(k) => Ok(k),
            Err(Error::Config(p)) => Err(p),
            Err(e) => Err(Problems::one(e.to_string())),
        };
        Self {
            config,
            key,
            conn: tokio::sync::Mutex::new(None),
            apart: AtomicBool::new(false),
            table_made: AtomicBool::new(false),
        }
    }

    /// Where it is, for messages.
    pub(crate) fn describe(&self) -> String {
        self.config.describe()
    }

    /// The key, to seal and open values; refused when none was given.
    pub(crate) fn key(&self) -> Result<&JournalKey> {
        self.key.as_ref().map_err(|p| Error::Config(p.clone()))
    }

    /// Appends `record`, durably, after the last entry; returns the entry.
    /// Refused when the store cannot be reached or written, or its last
    /// entry is broken or sealed with another key: the caller then does
    /// not do what the entry records.
    ///
    /// The entry records where the retained database stands (its system
    /// identifier, the ledger's chain head in `schema`) and its clock, read
    /// through `retained` first.
    pub(crate) async fn append(
        &self,
        retained: &sqlx::PgPool,
        schema: &str,
        record: Record,
    ) -> Result<Entry> {
        let key = self.key()?;
        let (stamp, at) = stamp(retained, schema).await;
        let result = match &self.config.target {
            JournalTarget::Dir(dir) => {
                let dir = dir.clone();
                let key = key.clone();
                tokio::task::spawn_blocking(move || append_file(&dir, &key, record, stamp, at))
                    .await
                    .unwrap_or_else(|e| Err(StoreError::Stopped("writer", e)))
            }
            JournalTarget::Url(url) => {
                let mut conn = self.conn.lock().await;
                let make = !self.table_made.load(Ordering::Acquire);
                let conn_now = connected(&mut conn, url).await;
                let result = append_db(conn_now, make, key, record, stamp, at).await;
                self.table_made.store(result.is_ok(), Ordering::Release);
                if result.is_err() {
                    // Whatever state the connection is in, the next use opens another.
                    *conn = None;
                }
                result
            }
        };
        result.map_err(|why| {
            Error::Refused(format!(
                "{} cannot be written ({why}); nothing it would record was done",
                self.describe()
            ))
        })
    }

    /// Every entry, checked from the first: an entry changed, removed,
    /// inserted or moved, or sealed with another key, is named.
    pub(crate) async fn read(&self) -> Result<Vec<Entry>> {
        let key = self.key()?;
        let lines = self.lines().await?;
        verify_lines(lines.iter().map(String::as_str), key).map_err(|b| {
            Error::InvalidInput(format!(
                "{} is broken: {b}; nothing was replayed",
                self.describe()
            ))
        })
    }

    /// Every line, as stored, unchecked.
    pub(crate) async fn lines(&self) -> Result<Vec<String>> {
        match &self.config.target {
            JournalTarget::Dir(dir) => {
                let path = dir.join(FILE_NAME);
                tokio::task::spawn_blocking(move || read_file(&path))
                    .await
                    .unwrap_or_else(|e| Err(StoreError::Stopped("reader", e)))
            }
            JournalTarget::Url(url) => {
                let mut conn = self.conn.lock().await;
                let result = read_db(connected(&mut conn, url).await).await;
                if result.is_err() {
                    *conn = None;
                }
                result
            }
        }
        .map_err(|why| Error::Refused(format!("{} cannot be read ({why})", self.describe())))
    }

    /// Refuses a journal URL on the retained database's own server: the
    /// journal must survive a restore of that server. Checked until it
    /// passes once.
    pub(crate) async fn check_apart(&self, retained: &sqlx::PgPool) -> Result<()> {
        let JournalTarget::Url(url) = &self.config.target else {
            return Ok(());
        };
        if self.apart.load(Ordering::Acquire) {
            return Ok(());
        }
        type Identity = (String, i64, DateTime<Utc>);
        let ours: Identity = sql::identity().query_as().fetch_one(retained).await?;
        let theirs: Stored<Identity> = {
            let mut conn = self.conn.lock().await;
            let read = match connected(&mut conn, url).await {
                Ok(c) => sql::identity()
                    .query_as()
                    .fetch_one(c)
                    .await
                    .map_err(StoreError::from),
                Err(e) => Err(e),
            };
            if read.is_err() {
                *conn = None;
            }
            read
        };
        let theirs = theirs.map_err(|why| Error::Refused(format!("{}: {why}", self.describe())))?;
        // The same server (started at the same instant) is refused too: a
        // point-in-time recovery restores every database of a server.
        if ours.2 == theirs.2 {
            let what = if ours == theirs {
                "the retained database itself"
            } else {
                "a database on the retained database's own server"
            };
            return Err(Error::Config(Problems::one(format!(
                "[journal] url names {what} ({}): restoring that server from a backup would take the journal back with it; put the journal on another server, or in a directory (dir = \"…\") on other storage",
                self.describe()
            ))));
        }
        self.apart.store(true, Ordering::Release);
        Ok(())
    }
}

/// The journal database's connection: the kept one when it still answers,
/// else a new one.
async fn connected<'c>(
    slot: &'c mut Option<PgConnection>,
    url: &str,
) -> Stored<&'c mut PgConnection> {
    if let Some(c) = slot.as_mut() {
        if c.ping().await.is_err() {
            *slot = None;
        }
    }
    if slot.is_none() {
        *slot = Some(connect(url).await?);
    }
    Ok(slot.as_mut().expect("connected above"))
}

/// The last entry of a journal file (read from its tail), if any.
fn last_in_file(file: &mut std::fs::File, path: &Path) -> Stored<Option<Entry>> {
    let io = |source| StoreError::File {
        doing: "reading ",
        path: path.to_owned(),
        source,
    };
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        return Ok(None);
    }
    let start = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(start)).map_err(io)?;
    let mut tail = String::new();
    file.read_to_string(&mut tail).map_err(io)?;
    if !tail.ends_with('\n') {
        return Err(StoreError::Incomplete);
    }
    // A tail that starts mid-line has that part first; the last line is
    // whole either way.
    match tail.lines().rfind(|l| !l.trim().is_empty()) {
        Some(line) => {
            serde_json::from_str(line)
                .map(Some)
                .map_err(|source| StoreError::NotAnEntry {
                    what: "line",
                    source,
                })
        }
        None => Ok(None),
    }
}

fn append_file(
    dir: &Path,
    key: &JournalKey,
    record: Record,
    stamp: Stamp,
    at: DateTime<Utc>,
) -> Stored<Entry> {
    if !dir.is_dir() {
        return Err(StoreError::NoDirectory(dir.to_owned()));
    }
    let path: PathBuf = dir.join(FILE_NAME);
    let file_error = |doing, path: &Path| {
        let path = path.to_owned();
        move |source| StoreError::File {
            doing,
            path,
            source,
        }
    };
    let created = !path.exists();
    // Created readable and writable by its owner alone: its entries are
    // sealed, but their order and times are nobody else's to read.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
        .map_err(file_error("", &path))?;
    file.lock().map_err(file_error("locking ", &path))?;
    let last = last_in_file(&mut file, &path)?;
    let entry = next_entry(last.as_ref(), key, record, stamp, at)?;
    let mut line = entry.to_line();
    line.push('\n');
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_data())
        .map_err(file_error("writing ", &path))?;
    if created {
        // The new file's name must survive a crash too.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(file_error("syncing ", dir))?;
    }
    Ok(entry)
}

/// The entry after `last`, once `last` checks out (its own hash, and the
/// key it was sealed with: a journal is written with one key).
fn next_entry(
    last: Option<&Entry>,
    key: &JournalKey,
    record: Record,
    stamp: Stamp,
    at: DateTime<Utc>,
) -> Stored<Entry> {
    let ours = key.id();
    if let Some(l) = last {
        if l.computed_hash() != l.hash {
            return Err(StoreError::Changed(l.seq));
        }
        if l.key_id != ours {
            return Err(StoreError::AnotherKey {
                theirs: l.key_id.clone(),
                ours,
            });
        }
    }
    let after = last
        .map(|l| (l.seq, l.hash.as_str()))
        .unwrap_or((0, JOURNAL_GENESIS));
    let entry = Entry::next(after, at, key, record, stamp);
    check_next(last, &entry, key).map_err(StoreError::Unlinked)?;
    Ok(entry)
}

fn read_file(path: &Path) -> Stored<Vec<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = path.parent().unwrap_or(path);
            if dir.is_dir() {
                Ok(Vec::new())
            } else {
                Err(StoreError::NoDirectory(dir.to_owned()))
            }
        }
        Err(source) => Err(StoreError::File {
            doing: "",
            path: path.to_owned(),
            source,
        }),
    }
}

async fn connect(url: &str) -> Stored<PgConnection> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(url)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(StoreError::Unreachable(e)),
        Err(_) => Err(StoreError::NoAnswer),
    }
}

async fn append_db(
    conn: Stored<&mut PgConnection>,
    make_table: bool,
    key: &JournalKey,
    record: Record,
    stamp: Stamp,
    at: DateTime<Utc>,
) -> Stored<Entry> {
    let conn = conn?;
    if make_table {
        sql::create().query().execute(&mut *conn).await?;
    }
    let mut tx = conn.begin().await?;
    sql::lock().query().execute(&mut *tx).await?;
    let last: Option<String> = sql::last().query_scalar().fetch_optional(&mut *tx).await?;
    let last: Option<Entry> =
        last.map(|l| serde_json::from_str(&l))
            .transpose()
            .map_err(|source| StoreError::NotAnEntry {
                what: "entry",
                source,
            })?;
    let entry = next_entry(last.as_ref(), key, record, stamp, at)?;
    sql::append(entry.seq as i64, entry.to_line())
        .query()
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(entry)
}

async fn read_db(conn: Stored<&mut PgConnection>) -> Stored<Vec<String>> {
    let conn = conn?;
    let exists: bool = sql::exists().query_scalar().fetch_one(&mut *conn).await?;
    if !exists {
        return Ok(Vec::new());
    }
    Ok(sql::all().query_scalar().fetch_all(&mut *conn).await?)
}

/// Where the retained database stands, for an entry: its system
/// identifier and the ledger's chain head, and the time on its clock (the
/// clock its rows are written by). What cannot be read (a role not allowed
/// `pg_control_system()`, a schema before the chain) is left out, with a
/// log line: the entry is still written, at this process's time when the
/// database's clock cannot be read.
async fn stamp(retained: &sqlx::PgPool, schema: &str) -> (Stamp, DateTime<Utc>) {
    let system = match sql::system_identifier()
        .query_scalar::<String>()
        .fetch_one(retained)
        .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "the database's system identifier could not be read for the journal");
            None
        }
    };
    let chain = match crate::sql::chain::head(schema, None)
        .query_as::<(i64, String, DateTime<Utc>)>()
        .fetch_optional(retained)
        .await
    {
        Ok(head) => head.map(|(id, link, _)| format!("{id}:{link}")),
        Err(e) => {
            tracing::warn!(error = %e, "the ledger's chain head could not be read for the journal");
            None
        }
    };
    let at = match sql::clock().query_scalar().fetch_one(retained).await {
        Ok(at) => at,
        Err(e) => {
            tracing::warn!(error = %e, "the database's clock could not be read for the journal; the entry is dated by this process");
            Utc::now()
        }
    };
    (Stamp { system, chain }, at)
}
