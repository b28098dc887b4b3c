//! Class C of the operations review: policy-file handlers deliver, or fail
//! loudly. A timed-out command takes its whole process group with it; a
//! command's stderr is never held whole; a `url` handler never follows a
//! redirect; a handler that requires the earlier ones waits behind their
//! dead letter; a dead letter of a handler nobody registers is not retried.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cohort::handlers::RetrySelection;
use cohort::{Cohort, Error, SweepRequest};
use support::*;

/// One old note of tenant A (the engine fixture's 45-day-old one).
async fn one_note() -> cohort_pgtemp::TestDatabase {
    let db = engine_db().await;
    exec(
        db.pool(),
        "DELETE FROM app.notes WHERE body <> 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .await;
    db
}

fn policy(handlers: &str) -> String {
    format!(
        r#"
[cohort.dispatch]
claim_timeout = "30s"
max_attempts = 1

[[entity]]
name = "Note"
id = "{NOTE_ID}"
table = "app.notes"
category = "notes"
anchor = "created_at"

{handlers}

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#
    )
}

async fn cohort_for(db: &cohort_pgtemp::TestDatabase, handlers: &str) -> Cohort {
    let p = cohort::policy::PolicyFile::parse(&policy(handlers)).unwrap();
    let cohort = Cohort::builder(db.pool().clone())
        .policy(p)
        .build()
        .await
        .unwrap();
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    cohort
}

/// (handler, status, last_error) of every piece of work, by handler.
async fn work(pool: &sqlx::PgPool) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT handler_id, status, last_error FROM public.sweep_row_handler_status ORDER BY handler_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

fn alive(pid: i32) -> bool {
    // A zombie (killed, not yet reaped by init) is not running.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|s| !s.trim_start().starts_with('Z'))
    })
}

async fn read_pid(path: &Path) -> i32 {
    let read = || {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
    };
    wait_until(
        "the command to write its child's pid",
        Duration::from_secs(10),
        async || read().is_some(),
    )
    .await;
    read().unwrap()
}

/// RS-009, DISPATCH-001: a command that times out is killed with every
/// process it started (its process group); the grandchild is running
/// while the delivery runs, and gone once it timed out.
#[tokio::test]
async fn a_timed_out_command_takes_its_whole_process_group_with_it() {
    let db = one_note().await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let script = format!("sleep 600 & echo $! > {}; wait", pidfile.display());
    let cohort = cohort_for(
        &db,
        &format!(
            "[[entity.handler]]\nname = \"slow\"\ntimeout = \"2s\"\ncommand = [\"sh\", \"-c\", {script:?}]"
        ),
    )
    .await;
    let dispatcher = cohort.dispatcher();
    let flush = tokio::spawn(async move { dispatcher.flush().await });
    let grandchild = read_pid(&pidfile).await;
    assert!(alive(grandchild), "the grandchild runs during the delivery");
    let report = flush.await.unwrap().unwrap();
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    wait_until(
        "the grandchild to be gone",
        Duration::from_secs(2),
        async || !alive(grandchild),
    )
    .await;
    assert!(
        !alive(grandchild),
        "the grandchild was killed with its group"
    );
    let w = work(db.pool()).await;
    assert!(w[0].2.as_deref().unwrap().contains("timed out"), "{w:?}");
}

/// RS-009: a command that writes 64 MB to stderr is delivered, and only
/// the tail of its stderr is kept (never the whole output in memory).
#[tokio::test]
async fn a_command_flooding_stderr_is_delivered_with_bounded_memory() {
    let db = one_note().await;
    let cohort = cohort_for(
        &db,
        "[[entity.handler]]\nname = \"noisy\"\ncommand = [\"sh\", \"-c\", \"head -c 67108864 /dev/zero >&2; cat > /dev/null\"]",
    )
    .await;
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.delivered, 1, "{report:?}");
    let w = work(db.pool()).await;
    assert_eq!(w[0].1, "succeeded");
}

/// A one-shot HTTP server on loopback answering every request with
/// `response`; counts requests.
fn http_server(response: String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&hits);
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut stream) = stream else { continue };
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            seen.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (format!("http://{addr}/hook"), hits)
}

/// RS-009, DISPATCH-002: a redirect is never followed; 301, 302, 307 and
/// 308 are failed attempts naming the status, and the redirect's target
/// never hears of the delivery.
#[tokio::test]
async fn url_handlers_never_follow_redirects() {
    let (target, target_hits) =
        http_server("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".into());
    for status in [
        "301 Moved Permanently",
        "302 Found",
        "307 Temporary Redirect",
        "308 Permanent Redirect",
    ] {
        let db = one_note().await;
        let (hook, hook_hits) = http_server(format!(
            "HTTP/1.1 {status}\r\nLocation: {target}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        let cohort = cohort_for(
            &db,
            &format!("[[entity.handler]]\nname = \"hook\"\nurl = {hook:?}"),
        )
        .await;
        let report = cohort.dispatcher().flush().await.unwrap();
        assert_eq!(report.dead_lettered, 1, "{status}: {report:?}");
        assert_eq!(hook_hits.load(Ordering::SeqCst), 1, "{status}");
        let w = work(db.pool()).await;
        let error = w[0].2.as_deref().unwrap();
        let code = &status[..3];
        assert!(error.contains(&format!("http status {code}")), "{error}");
        assert!(error.contains("never followed"), "{error}");
    }
    assert_eq!(
        target_hits.load(Ordering::SeqCst),
        0,
        "no redirect followed"
    );
}

/// DISPATCH-001: `requires_earlier = true` holds a handler behind an
/// earlier one's dead letter until the retry delivers it ("archive, then
/// delete"); without it (the default), the later handler runs after the
/// earlier one dead-letters.
#[tokio::test]
async fn a_handler_that_requires_the_earlier_ones_waits_behind_their_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("archive-is-up");
    let archive = format!("test -f {}", ready.display());
    for requires in [false, true] {
        let _ = std::fs::remove_file(&ready);
        let db = one_note().await;
        let cohort = cohort_for(
            &db,
            &format!(
                "[[entity.handler]]\nname = \"archive\"\npriority = 1\ncommand = [\"sh\", \"-c\", {archive:?}]\n\n\
                 [[entity.handler]]\nname = \"delete\"\npriority = 2\nrequires_earlier = {requires}\ncommand = [\"true\"]"
            ),
        )
        .await;
        let report = cohort.dispatcher().flush().await.unwrap();
        let w = work(db.pool()).await;
        assert_eq!(w[0].1, "dead_lettered", "archive failed: {w:?}");
        if !requires {
            assert_eq!(w[1].1, "succeeded", "default: delete ran anyway: {w:?}");
            continue;
        }
        assert_eq!(report.delivered, 0, "{report:?}");
        assert_eq!(
            w[1].1, "pending",
            "delete waits behind archive's dead letter: {w:?}"
        );
        // Still held at the next flush.
        cohort.dispatcher().flush().await.unwrap();
        assert_eq!(work(db.pool()).await[1].1, "pending");
        // The archive comes back; retrying its dead letter releases delete.
        std::fs::write(&ready, "").unwrap();
        let letters = cohort
            .dead_letters(&cohort::handlers::DeadLetterFilter::all())
            .await
            .unwrap();
        let ids: Vec<i64> = letters.iter().map(|l| l.id).collect();
        assert_eq!(
            cohort
                .retry_dead_letters(&RetrySelection::Ids(ids))
                .await
                .unwrap(),
            1
        );
        let report = cohort.dispatcher().flush().await.unwrap();
        assert_eq!(report.delivered, 2, "{report:?}");
        let w = work(db.pool()).await;
        assert!(w.iter().all(|(_, s, _)| s == "succeeded"), "{w:?}");
    }
}

/// RS-009: retrying a dead letter whose handler no longer exists is
/// refused as bad input naming the handler, and changes nothing.
#[tokio::test]
async fn retrying_a_dead_letter_of_an_unknown_handler_is_refused() {
    let db = one_note().await;
    let cohort = cohort_for(
        &db,
        "[[entity.handler]]\nname = \"gone-soon\"\ncommand = [\"false\"]",
    )
    .await;
    cohort.dispatcher().flush().await.unwrap();
    // The policy loses that handler (renamed).
    let p = cohort::policy::PolicyFile::parse(&policy(
        "[[entity.handler]]\nname = \"renamed\"\ncommand = [\"true\"]",
    ))
    .unwrap();
    let renamed = Cohort::builder(db.pool().clone())
        .policy(p)
        .build()
        .await
        .unwrap();
    let letters = renamed
        .dead_letters(&cohort::handlers::DeadLetterFilter::all())
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    let before = work(db.pool()).await;
    let err = renamed
        .retry_dead_letters(&RetrySelection::Ids(vec![letters[0].id]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("\"gone-soon\"")),
        "{err}"
    );
    assert_eq!(work(db.pool()).await, before, "nothing changed");
    // `--all` leaves it alone too; the original handler retries it.
    assert_eq!(
        renamed
            .retry_dead_letters(&RetrySelection::All)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        cohort
            .retry_dead_letters(&RetrySelection::All)
            .await
            .unwrap(),
        1
    );
}
