//! Writing and reading the journal's stores (see [`crate::domain::journal`]): a
//! directory of append-only, fsynced files, or a table in another
//! PostgreSQL database. Each append takes the store's lock (an exclusive
//! file lock, or the table's `EXCLUSIVE` lock), reads the last entry,
//! checks it (its hash, its key) and links the new one to it.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use sqlx::{Connection, PgConnection};

use crate::domain::journal::{
    check_next, verify_lines, Entry, JournalConfig, JournalKey, JournalTarget, Record, Stamp,
    FILE_NAME, JOURNAL_GENESIS,
};
use crate::error::{Error, Result};
use crate::sql::journal as sql;

/// How long a journal database may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of a journal file's end is read to find its last entry.
const TAIL_BYTES: u64 = 64 * 1024;

/// A journal ready to be written or read: where, and its key.
pub(crate) struct Journal<'a> {
    config: &'a JournalConfig,
    key: JournalKey,
}

impl<'a> Journal<'a> {
    /// The configured journal with its key (refused without one).
    pub(crate) fn open(config: &'a JournalConfig) -> Result<Self> {
        Ok(Self {
            config,
            key: config.resolved_key()?,
        })
    }

    /// The key, to seal and open values.
    pub(crate) fn key(&self) -> &JournalKey {
        &self.key
    }

    /// Appends `record`, durably, after the last entry; returns the entry.
    /// Refused when the store cannot be reached or written, or its last
    /// entry is broken or sealed with another key: the caller then does
    /// not do what the entry records.
    ///
    /// The entry records where the retained database stands (its system
    /// identifier, the ledger's chain head), read through `cx` first.
    pub(crate) async fn append(
        &self,
        cx: &crate::context::Context,
        record: Record,
    ) -> Result<Entry> {
        let stamp = stamp(cx).await;
        let result = match &self.config.target {
            JournalTarget::Dir(dir) => {
                let dir = dir.clone();
                let key = self.key.clone();
                tokio::task::spawn_blocking(move || append_file(&dir, &key, record, stamp))
                    .await
                    .map_err(|e| Error::Refused(format!("the journal's writer stopped: {e}")))?
            }
            JournalTarget::Url(url) => append_db(url, &self.key, record, stamp).await,
        };
        result.map_err(|why| {
            Error::Refused(format!(
                "{} cannot be written ({why}); nothing it would record was done",
                self.config.describe()
            ))
        })
    }

    /// Every entry, checked from the first: an entry changed, removed,
    /// inserted or moved, or sealed with another key, is named.
    pub(crate) async fn read(&self) -> Result<Vec<Entry>> {
        let lines = self.lines().await?;
        verify_lines(lines.iter().map(String::as_str), &self.key).map_err(|b| {
            Error::InvalidInput(format!(
                "{} is broken: {b}; nothing was replayed",
                self.config.describe()
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
                    .map_err(|e| Error::Refused(format!("the journal's reader stopped: {e}")))?
            }
            JournalTarget::Url(url) => read_db(url).await,
        }
        .map_err(|why| Error::Refused(format!("{} cannot be read ({why})", self.config.describe())))
    }
}

/// The last entry of a journal file (read from its tail), if any.
fn last_in_file(file: &mut std::fs::File) -> std::result::Result<Option<Entry>, String> {
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len == 0 {
        return Ok(None);
    }
    let start = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(start))
        .map_err(|e| e.to_string())?;
    let mut tail = String::new();
    file.read_to_string(&mut tail).map_err(|e| e.to_string())?;
    if !tail.ends_with('\n') {
        return Err(
            "its last line is incomplete (a write cut short): check the file and end or remove that line by hand"
                .into(),
        );
    }
    let mut lines = tail.lines().filter(|l| !l.trim().is_empty());
    let last = lines.next_back();
    match last {
        // A tail that starts mid-line has that part first; the last line
        // is whole either way.
        Some(line) => serde_json::from_str(line)
            .map(Some)
            .map_err(|e| format!("its last line is not a journal entry ({e})")),
        None => Ok(None),
    }
}

fn append_file(
    dir: &Path,
    key: &JournalKey,
    record: Record,
    stamp: Stamp,
) -> std::result::Result<Entry, String> {
    if !dir.is_dir() {
        return Err(format!(
            "{} is not a directory (create it, on storage apart from the database's)",
            dir.display()
        ));
    }
    let path: PathBuf = dir.join(FILE_NAME);
    let created = !path.exists();
    // Created readable and writable by its owner alone: its entries are
    // sealed, but their order and times are nobody else's to read.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| format!("locking {}: {e}", path.display()))?;
    let last = last_in_file(&mut file)?;
    let entry = next_entry(last.as_ref(), key, record, stamp)?;
    let mut line = entry.to_line();
    line.push('\n');
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_data())
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    if created {
        // The new file's name must survive a crash too.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("syncing {}: {e}", dir.display()))?;
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
) -> std::result::Result<Entry, String> {
    let key_id = key.id();
    let key_id = key_id.as_str();
    if let Some(l) = last {
        if l.computed_hash() != l.hash {
            return Err(format!(
                "its last entry ({}) was changed: its content does not give its hash",
                l.seq
            ));
        }
        if l.key_id != key_id {
            return Err(format!(
                "it was written with another key (key id {}; COHORT_JOURNAL_KEY is {key_id})",
                l.key_id
            ));
        }
    }
    let after = last
        .map(|l| (l.seq, l.hash.as_str()))
        .unwrap_or((0, JOURNAL_GENESIS));
    let entry = Entry::next(after, Utc::now(), key, record, stamp);
    check_next(last, &entry, key).map_err(|b| b.to_string())?;
    Ok(entry)
}

fn read_file(path: &Path) -> std::result::Result<Vec<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = path.parent().unwrap_or(path);
            if dir.is_dir() {
                Ok(Vec::new())
            } else {
                Err(format!("{} is not a directory", dir.display()))
            }
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

async fn connect(url: &str) -> std::result::Result<PgConnection, String> {
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect(url)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(format!("unreachable: {e}")),
        Err(_) => Err(format!(
            "unreachable: no answer within {}s",
            CONNECT_TIMEOUT.as_secs()
        )),
    }
}

async fn append_db(
    url: &str,
    key: &JournalKey,
    record: Record,
    stamp: Stamp,
) -> std::result::Result<Entry, String> {
    let mut conn = connect(url).await?;
    let step = |e: sqlx::Error| e.to_string();
    sql::create()
        .query()
        .execute(&mut conn)
        .await
        .map_err(step)?;
    let mut tx = conn.begin().await.map_err(step)?;
    sql::lock().query().execute(&mut *tx).await.map_err(step)?;
    let last: Option<String> = sql::last()
        .query_scalar()
        .fetch_optional(&mut *tx)
        .await
        .map_err(step)?;
    let last: Option<Entry> = last
        .map(|l| serde_json::from_str(&l))
        .transpose()
        .map_err(|e| format!("its last entry is not a journal entry ({e})"))?;
    let entry = next_entry(last.as_ref(), key, record, stamp)?;
    sql::append(entry.seq as i64, entry.to_line())
        .query()
        .execute(&mut *tx)
        .await
        .map_err(step)?;
    tx.commit().await.map_err(step)?;
    let _ = conn.close().await;
    Ok(entry)
}

async fn read_db(url: &str) -> std::result::Result<Vec<String>, String> {
    let mut conn = connect(url).await?;
    let exists: bool = sql::exists()
        .query_scalar()
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    if !exists {
        return Ok(Vec::new());
    }
    let lines: Vec<String> = sql::all()
        .query_scalar()
        .fetch_all(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let _ = conn.close().await;
    Ok(lines)
}

/// Where the retained database stands, for an entry: its system
/// identifier and the ledger's chain head. What cannot be read (a role
/// not allowed `pg_control_system()`, a schema before the chain) is left
/// out, with a log line: the entry is still written.
pub(crate) async fn stamp(cx: &crate::context::Context) -> Stamp {
    let system = match crate::sql::journal::system_identifier()
        .query_scalar::<String>()
        .fetch_one(&cx.pool)
        .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "the database's system identifier could not be read for the journal");
            None
        }
    };
    let chain = match crate::sql::chain::head(&cx.config.schema, None)
        .query_as::<(i64, String, chrono::DateTime<Utc>)>()
        .fetch_optional(&cx.pool)
        .await
    {
        Ok(head) => head.map(|(id, link, _)| format!("{id}:{link}")),
        Err(e) => {
            tracing::warn!(error = %e, "the ledger's chain head could not be read for the journal");
            None
        }
    };
    Stamp { system, chain }
}

/// Refuses a journal URL on the retained database's own server: the
/// journal must survive a restore of that server.
pub(crate) async fn check_apart(config: &JournalConfig, retained: &sqlx::PgPool) -> Result<()> {
    let JournalTarget::Url(url) = &config.target else {
        return Ok(());
    };
    type Identity = (String, i64, chrono::DateTime<Utc>);
    let ours: Identity = sql::identity().query_as().fetch_one(retained).await?;
    let mut conn = connect(url)
        .await
        .map_err(|why| Error::Refused(format!("{}: {why}", config.describe())))?;
    let theirs: Identity = sql::identity()
        .query_as()
        .fetch_one(&mut conn)
        .await
        .map_err(|e| Error::Refused(format!("{}: {e}", config.describe())))?;
    let _ = conn.close().await;
    // The same server (started at the same instant) is refused too: a
    // point-in-time recovery restores every database of a server.
    if ours.2 == theirs.2 {
        let what = if ours == theirs {
            "the retained database itself"
        } else {
            "a database on the retained database's own server"
        };
        return Err(Error::Config(crate::error::Problems::one(format!(
            "[journal] url names {what} ({}): restoring that server from a backup would take the journal back with it; put the journal on another server, or in a directory (dir = \"…\") on other storage",
            config.describe()
        ))));
    }
    Ok(())
}
