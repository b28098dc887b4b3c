//! Running beside production: before each batch of a sweep, a lane asks
//! its entity's [`Throttle`] whether and when it may go on.
//!
//! - **Paused** (`cohort pause ENTITY`, live in `retention_pacing`): the
//!   entity stops before its next batch (the open one commits whole) and
//!   is reported `paused`.
//! - **`max_rows_per_second`**: the lane waits until the rows its entity
//!   changed (every lane's) fit the rate: each committed batch of `n` rows
//!   moves the entity's next start to `n / rate` seconds after the later
//!   of its previous next start and the batch's own start, so the rate
//!   holds without credit piling up while batches run slow.
//! - **`max_replica_lag`**: the lane waits while a streaming standby's
//!   replay is further behind than the limit ([`lag_of`] says how it is
//!   measured), polling every [`POLL`].
//!
//! Each limit is the strictest of the configuration (global and the
//! entity's) and the live rows (`*` and the entity's), read again before
//! every batch and at every poll of a wait ([`POLL`]), so a change
//! reaches every replica at its next batch and ends a wait it makes moot:
//! a pause ends the wait as paused, a lifted or raised limit shortens it.
//! The waits happen between batches, never inside one (no row lock is
//! held), and cancellation cuts them short.
//!
//! A lag limit is only as good as the lag it reads: PostgreSQL shows a
//! role without `pg_read_all_stats` other roles' standbys with no replay
//! position, which would read as "caught up". Before its first wait under
//! a lag limit (whether from the configuration or set live) the throttle
//! asks whether its role can read every standby's position, and when it
//! cannot the entity fails before its next batch ([`Gate::Refused`]),
//! never sweeping unwaited. Their time is counted in
//! `cohort_sweep_throttled_seconds_total{entity,reason}` and recorded in
//! the entity's summary (`throttled_ms`, `lag_waited_ms`).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgConnection;

use crate::base::cancel::Cancel;
use crate::domain::signals::{Signal, TestSignals};
use crate::sql::pacing as statements;

/// How often a waiting lane reads the live rows (and the standbys' lag)
/// again.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// The WAL positions kept to measure a stalled standby's lag by.
const MAX_SAMPLES: usize = 4_096;

/// A limit on an entity's sweep, from wherever it was set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) rate: Option<u32>,
    pub(crate) lag: Option<Duration>,
}

impl Limits {
    /// Both limits: the stricter of each.
    pub(crate) fn strictest(self, other: Limits) -> Limits {
        fn min<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        Limits {
            rate: min(self.rate, other.rate),
            lag: min(self.lag, other.lag),
        }
    }
}

/// What the live rows say for one entity now.
#[derive(Debug, Clone, Default)]
pub(crate) struct Live {
    /// Paused, since when and until the read, on the database's clock.
    pub(crate) paused: Option<Pause>,
    pub(crate) limits: Limits,
}

/// A pause as read: since its row's `updated_at`, and the database's
/// clock at the read (so the time paused is measured on one clock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pause {
    pub(crate) since: chrono::DateTime<chrono::Utc>,
    pub(crate) now: chrono::DateTime<chrono::Utc>,
}

/// Reads the live rows that apply to `entity` (its own and `*`).
pub(crate) async fn live(
    conn: &mut PgConnection,
    schema: &str,
    entity: &str,
) -> Result<Live, sqlx::Error> {
    let rows = statements::for_entity(schema, entity)
        .query_as::<statements::PacingRow>()
        .fetch_all(conn)
        .await?;
    let mut out = Live::default();
    for r in rows {
        if r.paused {
            out.paused = Some(Pause {
                since: r.updated_at,
                now: r.read_at,
            });
        }
        out.limits = out.limits.strictest(Limits {
            rate: r.rate(),
            lag: r.lag(),
        });
    }
    Ok(out)
}

/// Whether a lane may take its next batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    Go,
    Paused,
    Cancelled,
    /// A limit applies that this process cannot honour (why, for the
    /// log): the entity fails before its next batch.
    Refused(String),
}

/// How a rate wait ended: go on under the limits read last, or stop.
enum Paced {
    Go(Limits),
    Stop(Gate),
}

/// One entity's pacing, shared by its lanes.
#[derive(Debug)]
pub(crate) struct Throttle {
    entity: String,
    schema: String,
    configured: Limits,
    state: Mutex<State>,
    /// Time waited for the rate, in microseconds, by every lane.
    rate_waited_us: AtomicU64,
    /// Time waited for standbys, in microseconds, by every lane.
    lag_waited_us: AtomicU64,
    /// Whether a rate applied to any batch.
    rate_applied: AtomicBool,
    /// Whether a lag limit applied to any batch.
    lag_applied: AtomicBool,
    /// Where its moments go, when a test listens.
    signals: Option<TestSignals>,
}

#[derive(Debug, Default)]
struct State {
    /// When the next batch may start (the rate's clock).
    next_start: Option<Instant>,
    /// The rate the last check applied.
    rate: Option<u32>,
    /// This server's WAL position as read at each check: (position, when).
    samples: VecDeque<(i64, Instant)>,
    /// Standbys a lane waited for.
    waited_for: BTreeSet<String>,
    /// Standbys seen streaming at any check.
    seen: BTreeSet<String>,
    /// What the run's summary says about the waits.
    notes: Vec<String>,
    /// Whether a check under a lag limit has run.
    lag_checked: bool,
    /// Whether this role can read every standby's replay position (`Err`:
    /// why not), once asked (the first time a lag limit applies).
    lag_readable: Option<Result<(), String>>,
}

/// One standby as a check reads it.
#[derive(Debug, Clone)]
struct Standby {
    name: String,
    replay_lsn: Option<i64>,
    replay_lag: Option<Duration>,
}

impl Throttle {
    /// The configured limits for `entity`; the live ones are read at each
    /// check.
    pub(crate) fn new(
        entity: &str,
        schema: &str,
        configured: Limits,
        signals: Option<TestSignals>,
    ) -> Self {
        Throttle {
            entity: entity.to_owned(),
            schema: schema.to_owned(),
            configured,
            state: Mutex::new(State::default()),
            rate_waited_us: AtomicU64::new(0),
            lag_waited_us: AtomicU64::new(0),
            rate_applied: AtomicBool::new(false),
            lag_applied: AtomicBool::new(false),
            signals,
        }
    }

    /// Sends a test signal, when a test listens.
    fn signal(&self, signal: impl FnOnce(String) -> Signal) {
        if let Some(s) = &self.signals {
            s.send(signal(self.entity.clone()));
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the entity is paused now (counted under reason `paused`
    /// when it is).
    pub(crate) async fn paused(&self, conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
        let live = live(conn, &self.schema, &self.entity).await?;
        Ok(self.count_pause(&live))
    }

    fn count_pause(&self, live: &Live) -> bool {
        match live.paused {
            Some(Pause { since, now }) => {
                crate::domain::telemetry::paused(&self.entity, since, now);
                self.signal(|entity| Signal::Paused { entity });
                true
            }
            None => false,
        }
    }

    /// Before a batch: paused, or waited for the rate and the standbys.
    pub(crate) async fn before_batch(
        &self,
        conn: &mut PgConnection,
        cancel: &Cancel,
    ) -> Result<Gate, sqlx::Error> {
        let live = live(conn, &self.schema, &self.entity).await?;
        if self.count_pause(&live) {
            return Ok(Gate::Paused);
        }
        let limits = self.configured.strictest(live.limits);
        let limits = match self.wait_for_rate(conn, limits, cancel).await? {
            Paced::Go(limits) => limits,
            Paced::Stop(gate) => return Ok(gate),
        };
        match limits.lag {
            Some(lag) => self.wait_for_standbys(conn, lag, cancel).await,
            None => Ok(Gate::Go),
        }
    }

    /// Counts a committed batch of `rows` that started at `started`.
    pub(crate) fn after_batch(&self, rows: u64, started: Instant) {
        let mut s = self.state();
        if let Some(rate) = s.rate {
            let from = s.next_start.map_or(started, |n| n.max(started));
            s.next_start = Some(from + Duration::from_secs_f64(rows as f64 / f64::from(rate)));
        }
    }

    /// Waits until the rate's clock allows the next batch, reading the
    /// live rows at every [`POLL`]: a pause ends the wait as paused, a
    /// lifted limit ends it, a changed one rescales what is left of it
    /// (the rows the wait is owed for, at the new rate). Returns the limits
    /// read last.
    async fn wait_for_rate(
        &self,
        conn: &mut PgConnection,
        mut limits: Limits,
        cancel: &Cancel,
    ) -> Result<Paced, sqlx::Error> {
        loop {
            let due = {
                let mut s = self.state();
                match (s.rate, limits.rate) {
                    (_, None) => {
                        s.rate = None;
                        s.next_start = None;
                        return Ok(Paced::Go(limits));
                    }
                    (Some(was), Some(now)) if was != now => {
                        // What is owed at the old rate, paid at the new one.
                        if let Some(next) = s.next_start {
                            let left = next.saturating_duration_since(Instant::now());
                            s.next_start = Some(
                                Instant::now() + left.mul_f64(f64::from(was) / f64::from(now)),
                            );
                        }
                        s.rate = Some(now);
                    }
                    (_, rate) => s.rate = rate,
                }
                s.next_start
            };
            self.rate_applied.store(true, Ordering::SeqCst);
            let wait = due.map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if wait.is_zero() {
                return Ok(Paced::Go(limits));
            }
            let (finished, waited) = sleep(wait.min(POLL), cancel).await;
            self.rate_waited_us
                .fetch_add(waited.as_micros() as u64, Ordering::SeqCst);
            crate::domain::telemetry::throttled(&self.entity, "rate", waited);
            self.signal(|entity| Signal::RateWaited { entity });
            if !finished {
                return Ok(Paced::Stop(Gate::Cancelled));
            }
            let live = live(conn, &self.schema, &self.entity).await?;
            if self.count_pause(&live) {
                return Ok(Paced::Stop(Gate::Paused));
            }
            limits = self.configured.strictest(live.limits);
        }
    }

    /// Whether this role can read every standby's replay position (asked
    /// once per throttle); the refusal to log when it cannot, also noted
    /// in the run's summary.
    async fn lag_unreadable(&self, conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
        let known = self.state().lag_readable.clone();
        let verdict = match known {
            Some(v) => v,
            None => {
                let (role, readable): (String, bool) = statements::can_read_lag()
                    .query_as()
                    .fetch_one(conn)
                    .await?;
                let v = if readable {
                    Ok(())
                } else {
                    Err(format!(
                        "{}, or clear the limit (cohort settings set max_replica_lag off): {}'s sweep stopped before its next batch",
                        crate::domain::settings::lag_unreadable(&role),
                        self.entity
                    ))
                };
                let mut s = self.state();
                if let Err(why) = &v {
                    s.notes.push(why.clone());
                }
                s.lag_readable = Some(v.clone());
                v
            }
        };
        Ok(verdict.err())
    }

    /// Waits while a standby is further behind than `lag`, reading the
    /// live rows again at each poll (a pause or a lifted limit ends it).
    async fn wait_for_standbys(
        &self,
        conn: &mut PgConnection,
        mut lag: Duration,
        cancel: &Cancel,
    ) -> Result<Gate, sqlx::Error> {
        self.lag_applied.store(true, Ordering::SeqCst);
        if let Some(why) = self.lag_unreadable(conn).await? {
            tracing::error!(entity = %self.entity, "{why}");
            return Ok(Gate::Refused(why));
        }
        let mut logged = false;
        loop {
            let behind = self.standbys_behind(conn, lag).await?;
            if behind.is_empty() {
                return Ok(Gate::Go);
            }
            if !logged {
                tracing::info!(
                    entity = %self.entity,
                    standbys = %behind.join(", "),
                    max_replica_lag_ms = lag.as_millis() as u64,
                    "waiting for standby replay before the next batch"
                );
                self.signal(|entity| Signal::StandbyWaitBegan {
                    entity,
                    standbys: behind.clone(),
                });
                logged = true;
            }
            let (finished, waited) = sleep(POLL, cancel).await;
            self.lag_waited_us
                .fetch_add(waited.as_micros() as u64, Ordering::SeqCst);
            crate::domain::telemetry::throttled(&self.entity, "replica_lag", waited);
            tracing::debug!(
                entity = %self.entity,
                waited_ms = self.lag_waited_us.load(Ordering::SeqCst) / 1_000,
                "still waiting for standby replay"
            );
            self.signal(|entity| Signal::StandbyPolled { entity });
            if !finished {
                return Ok(Gate::Cancelled);
            }
            let live = live(conn, &self.schema, &self.entity).await?;
            if self.count_pause(&live) {
                return Ok(Gate::Paused);
            }
            match self.configured.strictest(live.limits).lag {
                Some(l) => lag = l,
                None => return Ok(Gate::Go),
            }
        }
    }

    /// The standbys further behind than `lag` now. A standby that was
    /// waited for and no longer streams is noted and not waited for.
    async fn standbys_behind(
        &self,
        conn: &mut PgConnection,
        lag: Duration,
    ) -> Result<Vec<String>, sqlx::Error> {
        let rows = statements::standbys()
            .query_as::<statements::StandbyRow>()
            .fetch_all(conn)
            .await?;
        let now = Instant::now();
        let current = rows.last().map_or(0, |r| r.current_lsn);
        let standbys: Vec<Standby> = rows
            .iter()
            .map(|r| Standby {
                name: r.name.clone(),
                replay_lsn: r.replay_lsn,
                replay_lag: r
                    .replay_lag_ms
                    .map(|ms| Duration::from_millis(ms.max(0) as u64)),
            })
            .collect();
        let mut s = self.state();
        let present: BTreeSet<String> = standbys.iter().map(|st| st.name.clone()).collect();
        let gone: Vec<String> = s.waited_for.difference(&present).cloned().collect();
        for name in gone {
            tracing::warn!(entity = %self.entity, standby = %name, "a standby the sweep waited for no longer streams; it is not waited for");
            s.notes.push(format!(
                "max_replica_lag: standby {name} stopped streaming while the sweep waited for it, and was no longer waited for"
            ));
            s.waited_for.remove(&name);
        }
        if rows.is_empty() {
            if !s.lag_checked && s.seen.is_empty() {
                s.notes.push(
                    "max_replica_lag: no standby was streaming; nothing was waited for".to_owned(),
                );
            }
            s.lag_checked = true;
            drop(s);
            crate::domain::telemetry::replica_lag(Duration::ZERO);
            return Ok(Vec::new());
        }
        s.lag_checked = true;
        s.seen.extend(present);
        if s.samples.back().is_none_or(|(lsn, _)| *lsn < current) {
            s.samples.push_back((current, now));
            if s.samples.len() > MAX_SAMPLES {
                s.samples.pop_front();
            }
        }
        let mut worst = Duration::ZERO;
        let mut behind = Vec::new();
        for st in &standbys {
            let l = lag_of(&s.samples, current, st, now);
            worst = worst.max(l);
            if l > lag {
                behind.push(format!("{} ({} ms behind)", st.name, l.as_millis()));
                s.waited_for.insert(st.name.clone());
            }
        }
        let oldest_needed = standbys.iter().filter_map(|st| st.replay_lsn).min();
        if let Some(floor) = oldest_needed {
            while s.samples.len() > 1 && s.samples.get(1).is_some_and(|(lsn, _)| *lsn <= floor) {
                s.samples.pop_front();
            }
        }
        drop(s);
        crate::domain::telemetry::replica_lag(worst);
        Ok(behind)
    }

    /// Time waited for the rate (every lane's), when a rate applied.
    pub(crate) fn rate_waited(&self) -> Option<Duration> {
        self.rate_applied
            .load(Ordering::SeqCst)
            .then(|| Duration::from_micros(self.rate_waited_us.load(Ordering::SeqCst)))
    }

    /// Time waited for standbys (every lane's), when a lag limit applied.
    pub(crate) fn lag_waited(&self) -> Option<Duration> {
        self.lag_applied
            .load(Ordering::SeqCst)
            .then(|| Duration::from_micros(self.lag_waited_us.load(Ordering::SeqCst)))
    }

    /// What the waits leave to say in the entity's summary.
    pub(crate) fn notes(&self) -> Vec<String> {
        self.state().notes.clone()
    }
}

/// How far behind a standby is, from this server's side:
/// - 0 when it has replayed everything this server has written;
/// - otherwise the larger of PostgreSQL's `replay_lag` (NULL counts as 0:
///   PostgreSQL clears it once an idle standby has caught up) and the time
///   since the first check that saw this server's WAL past the standby's
///   replay position. The second part is what catches a stalled replay:
///   PostgreSQL's `replay_lag` stops changing while replay is paused.
///
/// A standby whose replay position cannot be read yet (still starting)
/// counts as 0.
fn lag_of(samples: &VecDeque<(i64, Instant)>, current: i64, s: &Standby, now: Instant) -> Duration {
    let Some(replayed) = s.replay_lsn else {
        return Duration::ZERO;
    };
    if replayed >= current {
        return Duration::ZERO;
    }
    let stalled_since = samples
        .iter()
        .find(|(lsn, _)| *lsn > replayed)
        .map_or(Duration::ZERO, |(_, at)| now.saturating_duration_since(*at));
    s.replay_lag.unwrap_or(Duration::ZERO).max(stalled_since)
}

/// Sleeps `wait` unless cancelled: whether it finished, and how long it
/// slept (a cancelled sleep only as far as it went).
async fn sleep(wait: Duration, cancel: &Cancel) -> (bool, Duration) {
    let started = Instant::now();
    let finished = tokio::select! {
        () = tokio::time::sleep(wait) => true,
        () = cancel.cancelled() => false,
    };
    (finished, started.elapsed().min(wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strictest_limit_wins_and_unset_ones_stay_unset() {
        let a = Limits {
            rate: Some(500),
            lag: None,
        };
        let b = Limits {
            rate: Some(200),
            lag: Some(Duration::from_secs(30)),
        };
        assert_eq!(
            a.strictest(b),
            Limits {
                rate: Some(200),
                lag: Some(Duration::from_secs(30))
            }
        );
        assert_eq!(
            Limits::default().strictest(Limits::default()),
            Limits::default()
        );
    }

    #[test]
    fn a_batch_moves_the_next_start_by_its_rows_over_the_rate() {
        let t = Throttle::new("E", "cohort", Limits::default(), None);
        t.state().rate = Some(1_000);
        let started = Instant::now();
        t.after_batch(2_000, started);
        let next = t.state().next_start.unwrap();
        assert_eq!(next - started, Duration::from_secs(2));
        // A slow batch that started after the clock: no credit piles up.
        let later = next + Duration::from_secs(10);
        t.after_batch(500, later);
        assert_eq!(
            t.state().next_start.unwrap() - later,
            Duration::from_millis(500)
        );
    }

    #[test]
    fn a_stalled_standby_lags_from_the_first_check_past_its_replay() {
        let t0 = Instant::now();
        let samples: VecDeque<(i64, Instant)> = [
            (100, t0),
            (200, t0 + Duration::from_secs(1)),
            (300, t0 + Duration::from_secs(2)),
        ]
        .into();
        let now = t0 + Duration::from_secs(5);
        let standby = |replayed: Option<i64>, lag_ms: Option<u64>| Standby {
            name: "s".into(),
            replay_lsn: replayed,
            replay_lag: lag_ms.map(Duration::from_millis),
        };
        // Caught up: 0 whatever PostgreSQL last measured.
        assert_eq!(
            lag_of(&samples, 300, &standby(Some(300), Some(4_000)), now),
            Duration::ZERO
        );
        // Replayed 150: behind since the check that saw 200.
        assert_eq!(
            lag_of(&samples, 300, &standby(Some(150), None), now),
            Duration::from_secs(4)
        );
        // PostgreSQL's own figure wins when larger.
        assert_eq!(
            lag_of(&samples, 300, &standby(Some(250), Some(9_000)), now),
            Duration::from_secs(9)
        );
        // Still starting: not measured.
        assert_eq!(
            lag_of(&samples, 300, &standby(None, None), now),
            Duration::ZERO
        );
    }
}
