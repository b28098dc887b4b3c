//! `cohort serve`: the read-only operations console, as a real process on a
//! real database with real runs, holds and dead letters, read over HTTP
//! and in headless Chromium.
use crate::support::cli;
use crate::support::scenario::scenario;

use crate::support::chromium;
use crate::support::wait;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;
use wait::wait_until_blocking;

use cohort_pgtemp::TestDatabase;

const T1: &str = "11111111-1111-1111-1111-111111111111";
const TOKEN: &str = "console-test-token-0123456789";

const POLICY: &str = r#"
[cohort]
schema = "retention"
sweep_batch_size = 7
schedule = "0 2 * * *"

[cohort.dispatch]
max_attempts = 1

[[tenant]]
id = "11111111-1111-1111-1111-111111111111"

[[entity]]
name = "SessionNote"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.session_notes"
category = "notes"
anchor = "created_at"

[[entity.handler]]
name = "crm"
command = ["sh", "-c", "exit 3"]

[[entity]]
name = "Event"
id = "5b0bf2f4-3f0e-4a57-8d3c-2f1f7f0c9a11"
table = "app.events"
category = "notes"
anchor = "created_at"
tenantless = true
subjects = ["owner_email"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#;

/// Every body is a value that must never be shown.
const TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.session_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, body text);
    CREATE TABLE app.events (id bigint PRIMARY KEY, created_at timestamptz, owner_email text);
    INSERT INTO app.session_notes SELECT g, '11111111-1111-1111-1111-111111111111', now() - interval '90 days', 'secret-body-' || g FROM generate_series(1, 20) g;
    INSERT INTO app.events SELECT g, now() - interval '90 days', NULL FROM generate_series(1, 5) g;";

fn cohort(dir: &Path, args: &[&str], url: &str) -> Output {
    let out = cli::cohort(dir, args, url);
    assert!(
        out.status.code().is_some_and(|c| c == 0 || c == 3),
        "cohort {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A database with a succeeded tenant sweep, a tenantless one, a dry run,
/// one held row (with a reason naming a person) and 19 dead letters.
async fn setup() -> (TestDatabase, tempfile::TempDir) {
    let (db, dir) = scenario(TABLES, POLICY).await;
    let d = dir.path();
    cohort(d, &["migrate"], db.url());
    cohort(
        d,
        &[
            "holds",
            "create",
            "--entity",
            "SessionNote",
            "--record",
            "7",
            "--tenant",
            T1,
            "--reason",
            "Litigation: Jane Roe v. Example Ltd",
        ],
        db.url(),
    );
    // A hold on a person: the console shows its kind, never the person.
    cohort(
        d,
        &[
            "holds",
            "create",
            "--subject",
            "jane.roe@example.com",
            "--reason",
            "Litigation hold",
        ],
        db.url(),
    );
    cohort(d, &["sweep", "--tenant", T1, "--dry-run"], db.url());
    cohort(d, &["sweep", "--all-tenants"], db.url());
    cohort(d, &["dispatch", "--once"], db.url());
    (db, dir)
}

/// A running `cohort serve`; killed when dropped.
struct Console {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Console {
    fn start(dir: &Path, url: &str, listen: &str, token: Option<&str>) -> Console {
        Console::start_with_env(dir, url, listen, token, &[])
    }

    /// [`Console::start`] with these variables set too (a key).
    fn start_with_env(
        dir: &Path,
        url: &str,
        listen: &str,
        token: Option<&str>,
        env: &[(&str, &str)],
    ) -> Console {
        let log = dir.join(format!(
            "serve-{}-{}.log",
            listen.replace([':', '.', '[', ']'], "_"),
            uuid::Uuid::new_v4().simple()
        ));
        let mut cmd = cli::command(dir, &["serve", "--listen", listen], url, env);
        if let Some(t) = token {
            cmd.env("COHORT_SERVE_TOKEN", t);
        }
        let child = cmd
            .env("RUST_LOG", "cohort=info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("start cohort serve");
        let mut console = Console {
            child,
            addr: String::new(),
            log,
        };
        wait_until_blocking(
            "the console's address in its log",
            Duration::from_secs(30),
            || {
                let text = std::fs::read_to_string(&console.log).unwrap_or_default();
                if let Some(rest) = text
                    .lines()
                    .find_map(|l| l.split("console at http://").nth(1))
                {
                    console.addr = rest.split('/').next().unwrap().to_string();
                }
                if let Some(status) = console.child.try_wait().unwrap() {
                    panic!("cohort serve exited ({status}):\n{text}");
                }
                !console.addr.is_empty()
            },
        );
        console
    }

    fn get(&self, path: &str, token: Option<&str>) -> Response {
        get(&self.addr, path, token)
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn get(addr: &str, path: &str, token: Option<&str>) -> Response {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    send(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"),
    )
}

fn request_with_host(addr: &str, path: &str, host: &str) -> Response {
    send(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    )
}

fn send(addr: &str, request: &str) -> Response {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the console");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// Every row id swept in `run`, and the runs newest first.
async fn runs(db: &TestDatabase) -> Vec<(uuid::Uuid, String, bool, Option<String>)> {
    sqlx::query_as(
        "SELECT run_id, status, dry_run, tenant_id FROM retention.sweep_run ORDER BY started_at DESC",
    )
    .fetch_all(db.pool())
    .await
    .unwrap()
}

/// The runs page's header and chart: the last successes as the ledger has
/// them, the schedule's next occurrence by the database clock, the
/// backlog, and rows per day per category as an inline SVG.
/// An entity's row of a run page, and its counts in column order:
/// affected, held, skipped, NULL anchor, kept: legal minimum, kept: policy.
fn counts_of<'p>(page: &'p str, entity: &str) -> (&'p str, Vec<&'p str>) {
    let row = page
        .split("<tr>")
        .find(|r| r.contains(&format!("<td>{entity}</td>")))
        .unwrap_or_else(|| panic!("no row for {entity}"));
    let cells = row
        .split("<td class=\"n\">")
        .skip(1)
        .map(|c| c.split('<').next().unwrap())
        .collect();
    (row, cells)
}

async fn keeps_up_as_the_ledger_says(db: &TestDatabase, page: &str) {
    let fact = |label: &str| -> String {
        let at = page
            .find(&format!("<span class=\"label\">{label}</span>"))
            .unwrap_or_else(|| panic!("no {label:?} in the header:\n{page}"));
        let value = &page[at..];
        let start = value.find("<span class=\"value\">").unwrap() + "<span class=\"value\">".len();
        value[start..].split("</div>").next().unwrap().to_string()
    };
    let (last_sweep, now): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as(
            "SELECT max(settled_at), now() FROM retention.sweep_run
             WHERE kind = 'sweep' AND status = 'succeeded' AND NOT dry_run",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
    let shown = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    assert_eq!(
        fact("Last successful sweep"),
        format!("{}</span>", shown(last_sweep))
    );
    assert_eq!(
        fact("Last successful erasure"),
        "—</span>",
        "no erasure ran"
    );
    // "0 2 * * *": the next 02:00 UTC after the database's now.
    let today_two = now.date_naive().and_hms_opt(2, 0, 0).unwrap().and_utc();
    let next = if now < today_two {
        today_two
    } else {
        today_two + chrono::TimeDelta::days(1)
    };
    assert_eq!(fact("Next occurrence"), format!("{}</span>", shown(next)));
    let backlog = fact("Backlog");
    assert!(
        backlog.contains("Event: 10 d 05 h past its cutoff"),
        "{backlog}"
    );
    assert!(
        !backlog.contains("SessionNote"),
        "the held note is not backlog: {backlog}"
    );
    // Rows per day: today's real sweeps changed 19 notes and 5 events,
    // all of category "notes"; the dry run counts nothing.
    let today: i64 = sqlx::query_scalar(
        "SELECT sum(s.affected_count)::int8 FROM retention.sweep_run_entity_summary s
         JOIN retention.sweep_run r USING (run_id) WHERE NOT r.dry_run",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(today, 24);
    let svg = page
        .split("<svg xmlns=\"http://www.w3.org/2000/svg\" role=\"img\"")
        .nth(1)
        .expect("an inline SVG chart")
        .split("</svg>")
        .next()
        .unwrap();
    let title = format!(
        "<title>notes: {today} rows on {}</title>",
        chrono::Utc::now().date_naive()
    );
    assert!(svg.contains(&title), "{title} not in {svg}");
    assert_eq!(
        svg.matches("<rect ").count(),
        1,
        "one day, one category: {svg}"
    );
    assert!(!svg.contains("<script"), "{svg}");
}

/// RS-015: each page shows the ledger's figures, and nothing personal
/// beyond record ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_runs_holds_queue_and_settings_as_the_ledger_has_them() {
    let (db, dir) = setup().await;
    let console = Console::start(dir.path(), db.url(), "127.0.0.1:0", None);

    let home = console.get("/", None);
    assert_eq!(home.status, 303);
    assert_eq!(home.header("location"), Some("/runs"));

    // An event 40 days and 5 hours old arrives after the sweeps: past its
    // 30-day cutoff by 10 days and 5 hours, the backlog.
    sqlx::raw_sql("INSERT INTO app.events VALUES (1000, now() - interval '40 days 5 hours', NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    let runs_page = console.get("/runs", None);
    assert_eq!(runs_page.status, 200);
    keeps_up_as_the_ledger_says(&db, &runs_page.body).await;
    // The backlog read is reused for a while: an older event arriving now
    // shows at the next read, not at every load (each read visits every
    // retained table once per tenant).
    sqlx::raw_sql("INSERT INTO app.events VALUES (1001, now() - interval '90 days', NULL)")
        .execute(db.pool())
        .await
        .unwrap();
    let read_at = |body: &str| -> String {
        let at = body
            .find("read-at")
            .expect("the backlog says when it was read");
        body[at..].split("</span>").next().unwrap().to_string()
    };
    let again = console.get("/runs", None);
    assert_eq!(read_at(&again.body), read_at(&runs_page.body));
    assert!(
        again.body.contains("Event: 10 d 05 h past its cutoff")
            && !again.body.contains("Event: 60 d"),
        "reused, not read again"
    );
    assert_eq!(
        runs_page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let ledger = runs(&db).await;
    assert_eq!(ledger.len(), 3, "{ledger:?}");
    for (id, status, _, _) in &ledger {
        assert!(
            runs_page.body.contains(&format!("/runs/{id}")),
            "{id} not listed"
        );
        assert!(runs_page.body.contains(status.as_str()));
    }
    assert!(runs_page.body.contains("dry run"));
    assert!(runs_page.body.contains("tenantless"));

    // The tenant's real sweep: 19 purged, 1 held.
    let (real, _, _, _) = ledger
        .iter()
        .find(|r| !r.2 && r.3.as_deref() == Some(T1))
        .unwrap();
    let run = console.get(&format!("/runs/{real}"), None);
    assert_eq!(run.status, 200);
    let (row, cells) = counts_of(&run.body, "SessionNote");
    assert_eq!(cells, ["19", "1", "0", "0", "0", "0"], "{row}");
    assert!(run.body.contains("<dd>19</dd>"), "rows affected");
    assert!(run.body.contains("succeeded"));

    let holds = console.get("/holds", None);
    assert_eq!(holds.status, 200);
    assert!(holds.body.contains("<code>7</code>"), "the held record id");
    assert!(holds.body.contains("SessionNote"));
    assert!(!holds.body.contains("Jane Roe"), "a hold reason was shown");
    assert!(
        holds.body.contains("every row holding it"),
        "the subject hold is listed"
    );
    assert!(!holds.body.contains("jane.roe"), "a held subject was shown");

    let queue = console.get("/queue", None);
    assert_eq!(queue.status, 200);
    let dead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM retention.sweep_row_handler_status WHERE status = 'dead_lettered'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(dead, 19);
    assert!(
        queue.body.contains("<dt>Dead-lettered</dt><dd>19</dd>"),
        "{}",
        queue.body
    );
    assert!(queue.body.contains("<dt>Pending</dt><dd>0</dd>"));
    assert!(queue.body.contains("crm"));
    assert!(queue.body.contains("exit status 3"), "the sanitised error");

    let settings = console.get("/settings", None);
    assert_eq!(settings.status, 200);
    assert!(settings.body.contains("kill_switch"));
    assert!(settings
        .body
        .contains("<code>sweep_batch_size</code></td><td>7</td>"));

    // Security headers on every response, pages and errors alike.
    for path in [
        "/runs",
        "/holds",
        "/queue",
        "/settings",
        "/style.css",
        "/nope",
    ] {
        let r = console.get(path, None);
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(
            csp.contains("default-src 'none'") && !csp.contains("script-src"),
            "{path}: {csp}"
        );
        assert_eq!(r.header("cache-control"), Some("no-store"), "{path}");
        assert_eq!(
            r.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(r.header("x-frame-options"), Some("DENY"), "{path}");
        // No row value, hold reason or script on any page.
        assert!(!r.body.contains("secret-body"), "{path} shows a row value");
        assert!(!r.body.contains("Jane Roe"), "{path} shows a hold reason");
        assert!(!r.body.contains("jane.roe"), "{path} shows a held subject");
        assert!(!r.body.contains("<script"), "{path} has a script");
    }
    let css = console.get("/style.css", None);
    assert_eq!(css.status, 200);
    assert_eq!(css.header("content-type"), Some("text/css; charset=utf-8"));
    assert_eq!(console.get("/nope", None).status, 404);
    assert_eq!(console.get("/runs/not-a-uuid", None).status, 400);
    assert_eq!(
        console
            .get(&format!("/runs/{}", uuid::Uuid::nil()), None)
            .status,
        404
    );
    assert_eq!(console.get("/runs?limit=0", None).status, 400);
    assert_eq!(console.get("/runs?limit=x", None).status, 400);
    let one = console.get("/runs?limit=1", None);
    assert_eq!(one.body.matches("href=\"/runs/").count(), 1);
    // DNS rebinding: a page served under another name that resolves to
    // 127.0.0.1 sends its own Host, and is refused.
    let rebound = request_with_host(&console.addr, "/holds", "evil.example");
    assert_eq!(rebound.status, 421);
    assert!(!rebound.body.contains("<code>7</code>"));
    assert_eq!(
        request_with_host(&console.addr, "/holds", "localhost:1").status,
        200
    );
    // Read-only: nothing but GET is routed.
    assert_eq!(ledger, runs(&db).await, "serving changed the ledger");
}

/// RS-015: off loopback the console refuses to start without a token, and
/// with one every request needs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_the_console_needs_a_bearer_token() {
    let (db, dir) = setup().await;
    let d = dir.path();
    let out = cli::command(
        d,
        &["--json", "serve", "--listen", "0.0.0.0:0"],
        db.url(),
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(message.contains("COHORT_SERVE_TOKEN"), "{message}");
    let short = cli::command(d, &["serve", "--listen", "0.0.0.0:0"], db.url(), &[])
        .env("COHORT_SERVE_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(short.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&short.stderr).contains("at least 16"));

    let console = Console::start(d, db.url(), "0.0.0.0:0", Some(TOKEN));
    let port = console.addr.rsplit(':').next().unwrap();
    let addr = format!("127.0.0.1:{port}");
    for path in ["/runs", "/holds", "/queue", "/settings", "/style.css"] {
        let none = get(&addr, path, None);
        assert_eq!(none.status, 401, "{path}");
        assert_eq!(
            none.header("www-authenticate"),
            Some("Bearer realm=\"cohort\"")
        );
        assert!(
            !none.body.contains("SessionNote"),
            "{path} leaked data without a token"
        );
        let wrong = get(&addr, path, Some("console-test-token-0123456780"));
        assert_eq!(wrong.status, 401, "{path}");
        let longer = get(&addr, path, Some(&format!("{TOKEN}x")));
        assert_eq!(longer.status, 401, "{path}");
        assert_eq!(get(&addr, path, Some(TOKEN)).status, 200, "{path}");
    }
    drop(console);

    // A token set on loopback is required there too.
    let console = Console::start(d, db.url(), "127.0.0.1:0", Some(TOKEN));
    assert_eq!(console.get("/runs", None).status, 401);
    assert_eq!(console.get("/runs", Some(TOKEN)).status, 200);
}

/// RS-015: the pages render in a real browser without a console error (no
/// CSP refusal: the stylesheet loads, no script exists), and look right;
/// screenshots of the runs page and a run page (copied to `docs/` with
/// `COHORT_UPDATE_SCREENSHOTS=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_renders_in_headless_chromium() {
    let (db, dir) = setup().await;
    let console = Console::start(dir.path(), db.url(), "127.0.0.1:0", None);
    let ledger = runs(&db).await;
    let (real, _, _, _) = ledger
        .iter()
        .find(|r| !r.2 && r.3.as_deref() == Some(T1))
        .unwrap();
    let pages = [
        ("runs", "/runs".to_string(), "Recent runs"),
        ("run", format!("/runs/{real}"), "SessionNote"),
        ("holds", "/holds".to_string(), "Active holds"),
        ("queue", "/queue".to_string(), "Dead letters"),
        ("settings", "/settings".to_string(), "Live settings"),
    ];
    let shots = tempfile::tempdir().unwrap();
    for (name, path, expect) in &pages {
        let url = format!("http://{}{path}", console.addr);
        let profile = tempfile::tempdir().unwrap();
        let dom = chromium::run(profile.path(), &["--dump-dom", &url]);
        assert!(
            dom.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&dom.stderr)
        );
        let html = String::from_utf8_lossy(&dom.stdout);
        assert!(html.contains(expect), "{name}: {html}");
        assert!(
            html.contains("<table") || *name == "holds",
            "{name}: {html}"
        );
        let errors = chromium::console_errors(&dom.stderr);
        assert!(errors.is_empty(), "{name}: {errors:#?}");

        let png = shots.path().join(format!("console-{name}.png"));
        let profile = tempfile::tempdir().unwrap();
        let shot = chromium::run(
            profile.path(),
            &[&format!("--screenshot={}", png.display()), &url],
        );
        assert!(
            shot.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&shot.stderr)
        );
        let bytes = std::fs::read(&png).expect("a screenshot");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}: not a PNG");
        assert!(
            bytes.len() > 10_000,
            "{name}: a blank page? {} bytes",
            bytes.len()
        );
        if std::env::var_os("COHORT_UPDATE_SCREENSHOTS").is_some() && ["runs", "run"].contains(name)
        {
            let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
            std::fs::create_dir_all(&docs).unwrap();
            std::fs::copy(&png, docs.join(format!("console-{name}.png"))).unwrap();
        }
    }
}

/// RS-015: a console whose role may read Cohort's tables but not the
/// retained ones serves the runs page with the ledger's figures and says
/// the backlog is not readable, rather than failing the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_role_without_select_on_retained_tables_still_serves_the_runs_page() {
    let (db, dir) = setup().await;
    let role = format!("console_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'console-pw';
         GRANT USAGE ON SCHEMA retention, app TO {role};
         GRANT SELECT ON ALL TABLES IN SCHEMA retention TO {role};"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let url = format!("{}&user={role}&password=console-pw", db.url());
    assert!(db.url().contains('?'), "{}", db.url());
    let console = Console::start(dir.path(), &url, "127.0.0.1:0", None);
    let page = console.get("/runs", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains("not readable: the console's role lacks SELECT on a retained table"),
        "{}",
        page.body
    );
    let last: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT max(settled_at) FROM retention.sweep_run WHERE status = 'succeeded' AND NOT dry_run",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        page.body
            .contains(&last.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
        "the last success is still shown"
    );
    // The other pages read Cohort's tables only, and are served as before.
    assert_eq!(console.get("/holds", None).status, 200);
}

/// Issue 37 C: the read-only console needs no secret. With an entity
/// anonymised by `hash` and no `COHORT_HASH_KEY`, `cohort sweep` is
/// refused naming the key (the key matters here), while `cohort serve`
/// starts and serves every page, and `runs show` prints a run.
#[tokio::test]
async fn the_console_and_runs_show_need_no_hash_key() {
    let (db, dir) = setup().await;
    sqlx::raw_sql("ALTER TABLE app.events ADD COLUMN anonymised_at timestamptz")
        .execute(db.pool())
        .await
        .unwrap();
    let policy = POLICY
        .replace(
            "tenantless = true\nsubjects = [\"owner_email\"]",
            "tenantless = true\nsubjects = [\"owner_email\"]\nanonymise = { owner_email = \"hash\" }",
        )
        .replace(
            "name = \"Event\"\nid = \"5b0bf2f4-3f0e-4a57-8d3c-2f1f7f0c9a11\"\ntable = \"app.events\"\ncategory = \"notes\"",
            "name = \"Event\"\nid = \"5b0bf2f4-3f0e-4a57-8d3c-2f1f7f0c9a11\"\ntable = \"app.events\"\ncategory = \"scrub\"",
        )
        + "\n[[category]]\nname = \"scrub\"\nstrategy = \"anonymise\"\nperiod = \"30d\"\n";
    assert!(policy.contains("owner_email = \"hash\"") && policy.contains("category = \"scrub\""));
    std::fs::write(dir.path().join("cohort.toml"), policy).unwrap();
    let d = dir.path();
    let sweep = cli::command(d, &["sweep", "--tenantless"], db.url(), &[])
        .output()
        .unwrap();
    assert_eq!(sweep.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&sweep.stderr).contains("which needs the secret key"),
        "{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    let console = Console::start(d, db.url(), "127.0.0.1:0", None);
    for path in ["/runs", "/holds", "/queue", "/settings"] {
        let page = console.get(path, None);
        assert_eq!(page.status, 200, "{path}: {}", page.body);
    }
    let (run_id, ..) = runs(&db).await[0].clone();
    let shown = cohort(d, &["runs", "show", &run_id.to_string()], db.url());
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(&run_id.to_string()),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );
}

/// RS-037: a sweep's rows kept by a legal minimum show on its run page,
/// as the ledger counted them.
#[tokio::test]
async fn a_sweeps_run_page_shows_what_the_legal_minimum_kept() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    // Notes 40 and 90 days old: past the period (30 days), and only the
    // 90-day ones past the legal minimum (60 days).
    sqlx::raw_sql(
        "CREATE SCHEMA app;
         CREATE TABLE app.session_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, body text);
         CREATE TABLE app.events (id bigint PRIMARY KEY, created_at timestamptz, owner_email text);
         INSERT INTO app.session_notes SELECT g, '11111111-1111-1111-1111-111111111111',
           now() - make_interval(days => CASE WHEN g <= 3 THEN 40 ELSE 90 END), 'body-' || g
         FROM generate_series(1, 5) g;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = POLICY.replace("period = \"30d\"", "period = \"30d\"\nlegal_min = \"60d\"");
    assert!(policy.contains("legal_min = \"60d\""));
    std::fs::write(dir.path().join("cohort.toml"), policy).unwrap();
    let d = dir.path();
    cohort(d, &["migrate"], db.url());
    let out = cohort(d, &["--json", "sweep", "--tenant", T1], db.url());
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run_id = run["run_id"].as_str().unwrap();
    let stored: i64 = sqlx::query_scalar(
        "SELECT kept_by_legal_min_count FROM retention.sweep_run_entity_summary
         WHERE run_id = $1::uuid AND entity_type = 'SessionNote'",
    )
    .bind(run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(stored, 3);

    let console = Console::start(d, db.url(), "127.0.0.1:0", None);
    let page = console.get(&format!("/runs/{run_id}"), None);
    assert_eq!(page.status, 200);
    let (row, cells) = counts_of(&page.body, "SessionNote");
    assert_eq!(cells, ["2", "0", "0", "0", "3", "0"], "{row}");
}

/// A hold on a composite key shows the key as its JSON array (RS-038).
#[tokio::test]
async fn the_holds_page_shows_a_composite_key_as_its_json_array() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(
        "CREATE SCHEMA app;
         CREATE TABLE app.session_notes (id bigint NOT NULL, part int NOT NULL, tenant_id uuid NOT NULL,
             created_at timestamptz, body text, PRIMARY KEY (id, part));
         CREATE TABLE app.events (id bigint PRIMARY KEY, created_at timestamptz, owner_email text);
         INSERT INTO app.session_notes VALUES (41, 2, '11111111-1111-1111-1111-111111111111', now(), 'secret');",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = POLICY.replace(
        "table = \"app.session_notes\"",
        "table = \"app.session_notes\"\nrecord_id = [\"id\", \"part\"]",
    );
    assert!(policy.contains("record_id = [\"id\", \"part\"]"));
    std::fs::write(dir.path().join("cohort.toml"), policy).unwrap();
    let d = dir.path();
    cohort(d, &["migrate"], db.url());
    cohort(
        d,
        &[
            "holds",
            "create",
            "--entity",
            "SessionNote",
            "--record",
            "[41, 2]",
            "--tenant",
            T1,
            "--reason",
            "dispute",
        ],
        db.url(),
    );
    let console = Console::start(d, db.url(), "127.0.0.1:0", None);
    let page = console.get("/holds", None);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<code>[41, 2]</code>"), "{}", page.body);
    assert!(!page.body.contains("secret"));
}

/// The erasure requests page lists each request with its state, deadline
/// and what it waits for, and never the person or the requester's note
/// (RS-031).
#[tokio::test]
async fn the_erasure_requests_page_shows_deadlines_and_parts_but_not_the_person() {
    let (db, dir) = scenario(
        "CREATE SCHEMA app;
         CREATE TABLE app.session_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, body text);
         CREATE TABLE app.events (id bigint PRIMARY KEY, created_at timestamptz, owner_email text);
         INSERT INTO app.events SELECT g, now() - interval '90 days', 'ann@example.com' FROM generate_series(1, 3) g;",
        POLICY,
    )
    .await;
    let d = dir.path();
    cohort(d, &["migrate"], db.url());
    cohort(
        d,
        &[
            "holds", "create", "--entity", "Event", "--record", "2", "--reason", "claim",
        ],
        db.url(),
    );
    let out = cli::cohort_with_env(
        d,
        &[
            "--json",
            "erase",
            "--tenantless",
            "--subject",
            "ann@example.com",
            "--reference",
            "SAR-9",
            "--note",
            "Ann's letter of 1 December",
        ],
        db.url(),
        &[("COHORT_HASH_KEY", "an-example-hash-key-0123456789")],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let console = Console::start(d, db.url(), "127.0.0.1:0", None);
    let page = console.get("/erasure-requests", None);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<code>SAR-9</code>"), "{}", page.body);
    assert!(page.body.contains("Event: 1 row(s), held"), "{}", page.body);
    assert!(page.body.contains("<dt>waiting</dt><dd>1</dd>"));
    assert!(page.body.contains("<dt>Overdue</dt><dd>0</dd>"));
    assert!(
        !page.body.contains("ann@example.com"),
        "the subject was shown"
    );
    assert!(
        !page.body.contains("letter"),
        "the requester's note was shown"
    );
    let runs = console.get("/runs", None);
    assert!(
        runs.body.contains("href=\"/erasure-requests\""),
        "in the navigation"
    );
}

/// The journal's key, for the commands that write the journal and the
/// console that reads it.
const JOURNAL_KEY: (&str, &str) = (
    "COHORT_JOURNAL_KEY",
    "7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a",
);

/// The page's text from `from` to the end of its table (or the page).
fn section<'p>(page: &'p str, from: &str) -> &'p str {
    let at = page
        .find(from)
        .unwrap_or_else(|| panic!("{from:?} not on the page: {page}"));
    let rest = &page[at..];
    rest.find("</table>").map_or(rest, |end| &rest[..end])
}

/// Issue 55 C1: the settings page shows what `cohort settings show`
/// prints: both live settings with their configuration, database and
/// effective values; the live pacing set through the CLI (a paused entity,
/// called out before anything else, one entity's max_rows_per_second and
/// every entity's max_replica_lag, each with who set it and when) beside
/// the configured pacing; and the journal's state: none configured, then
/// a clean restore check, then a hold the database lost, named, in a
/// real browser too, and a check the console cannot run, with why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_page_shows_live_pacing_and_the_journals_state() {
    let (db, dir) = setup().await;
    let d = dir.path();

    // No [journal], nothing paused.
    let console = Console::start(d, db.url(), "127.0.0.1:0", None);
    let page = console.get("/settings", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains("No [journal] is configured."),
        "{}",
        page.body
    );
    assert!(page.body.contains("No entity is paused."), "{}", page.body);
    assert!(page.body.contains("No live pacing"), "{}", page.body);
    drop(console);

    // A journal, configured pacing (global and one entity's own), then
    // live pacing and a journaled hold through the CLI.
    let journal = tempfile::tempdir().unwrap();
    let policy = POLICY
        .replace(
            "schedule = \"0 2 * * *\"",
            "schedule = \"0 2 * * *\"\nmax_rows_per_second = 1000",
        )
        .replace(
            "tenantless = true",
            "tenantless = true\nmax_replica_lag = \"1m\"",
        )
        + &format!(
            "\n[journal]\ndir = {:?}\n",
            journal.path().display().to_string()
        );
    std::fs::write(d.join("cohort.toml"), policy).unwrap();
    let keyed = |args: &[&str]| {
        let out = cli::cohort_with_env(d, args, db.url(), &[JOURNAL_KEY]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "cohort {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    keyed(&["pause", "SessionNote"]);
    keyed(&[
        "settings",
        "set",
        "max_rows_per_second",
        "500",
        "--entity",
        "SessionNote",
    ]);
    keyed(&["settings", "set", "max_replica_lag", "30s"]);
    keyed(&["settings", "set", "dry_run", "on"]);
    sqlx::raw_sql(
        "INSERT INTO app.session_notes VALUES (100, '11111111-1111-1111-1111-111111111111', now(), 'secret-body-100')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    keyed(&[
        "holds",
        "create",
        "--entity",
        "SessionNote",
        "--record",
        "100",
        "--tenant",
        T1,
        "--reason",
        "Litigation: Jane Roe v. Example Ltd",
    ]);
    let set = |entity: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_as::<_, (String, String)>(
                "SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC', updated_by \
                 FROM retention.retention_pacing WHERE entity_type = $1",
            )
            .bind(entity)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (paused_at, paused_by) = set("SessionNote").await;
    let (every_at, every_by) = set("*").await;

    let console = Console::start_with_env(d, db.url(), "127.0.0.1:0", None, &[JOURNAL_KEY]);
    let page = console.get("/settings", None);
    assert_eq!(page.status, 200, "{}", page.body);
    let body = &page.body;

    // Every live setting, with its three values.
    let live = section(body, "<h2>Live settings</h2>");
    assert!(
        live.contains(
            "<td><code>kill_switch</code></td><td><span class=\"status ok\">off</span></td><td>off</td><td>off</td>"
        ),
        "{live}"
    );
    assert!(
        live.contains(
            "<td><code>dry_run</code></td><td><span class=\"status warn\">on</span></td><td>off</td><td>on</td>"
        ),
        "{live}"
    );

    // The pause stands out before the tables, then the live rows.
    let pacing = &body[body.find("<h2>Pacing</h2>").expect("a pacing section")..];
    let callout = pacing
        .find("Paused: SessionNote")
        .expect("the pause called out");
    assert!(callout < pacing.find("<table>").unwrap(), "{pacing}");
    assert!(
        pacing.contains(&format!(
            "Paused: SessionNote</span> since {paused_at} (by {paused_by})"
        )),
        "{pacing}"
    );
    assert!(pacing.contains("cohort resume SessionNote"), "{pacing}");
    let rows = section(pacing, "<table>");
    assert!(
        rows.contains(&format!(
            "<td>SessionNote</td><td><span class=\"status bad\">paused</span></td><td class=\"n\">500</td>\
             <td class=\"n\"><span class=\"muted\">—</span></td><td>{paused_at}</td><td>{paused_by}</td>"
        )),
        "{rows}"
    );
    assert!(
        rows.contains(&format!(
            "<td><code>*</code> <span class=\"muted\">(every entity)</span></td><td><span class=\"muted\">no</span></td>\
             <td class=\"n\"><span class=\"muted\">—</span></td><td class=\"n\">30s</td><td>{every_at}</td><td>{every_by}</td>"
        )),
        "{rows}"
    );
    // The configured pacing beside it: the global rate, Event's own lag.
    let configured = section(pacing, "Configured pacing");
    assert!(
        configured.contains(
            "(every entity)</span></td><td class=\"n\">1000</td><td class=\"n\"><span class=\"muted\">—</span></td>"
        ),
        "{configured}"
    );
    assert!(
        configured.contains(
            "<td>Event</td><td class=\"n\"><span class=\"muted\">—</span></td><td class=\"n\">60s</td>"
        ),
        "{configured}"
    );
    assert!(!configured.contains("SessionNote"), "{configured}");

    // The journal: one entry (the hold), and the database has it.
    let journal_part = &body[body.find("<h2>Journal</h2>").expect("a journal section")..];
    assert!(
        journal_part.contains("The database knows everything the journal holds."),
        "{journal_part}"
    );
    assert!(
        journal_part.contains("<dt>Entries</dt><dd>1 (every one checked)</dd>"),
        "{journal_part}"
    );
    assert!(!body.contains("Jane Roe"), "a hold reason was shown");

    // The database loses the hold, as a restore to before it would (the
    // reach trigger set aside for it, as `pg_restore` would not meet it).
    // The check is reused for a while, so this console still shows the one
    // it ran; a console started now checks, and names the hold.
    let hold: uuid::Uuid =
        sqlx::query_scalar("SELECT hold_id FROM retention.retention_hold WHERE record_id = '100'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    sqlx::raw_sql(
        "ALTER TABLE retention.retention_hold DISABLE TRIGGER retention_hold_reach;
         DELETE FROM retention.retention_hold WHERE record_id = '100';
         ALTER TABLE retention.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let checked_at = |body: &str| section(body, "<dt>Checked</dt>")[..60].to_string();
    let again = console.get("/settings", None);
    assert_eq!(checked_at(&again.body), checked_at(body));
    assert!(again
        .body
        .contains("The database knows everything the journal holds."));
    drop(console);
    let console = Console::start_with_env(d, db.url(), "127.0.0.1:0", None, &[JOURNAL_KEY]);
    let page = console.get("/settings", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body
            .contains("The database lacks what the journal holds."),
        "{}",
        page.body
    );
    assert!(
        page.body.contains(&format!(
            "<li>missing: hold {hold} is not in the database</li>"
        )),
        "{}",
        page.body
    );
    assert!(page.body.contains("cohort replay"), "{}", page.body);

    // In a real browser: the page renders without a console error, and
    // the pause and the gap are there.
    let profile = tempfile::tempdir().unwrap();
    let url = format!("http://{}/settings", console.addr);
    let dom = chromium::run(profile.path(), &["--dump-dom", &url]);
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let html = String::from_utf8_lossy(&dom.stdout);
    for expect in [
        "Paused: SessionNote",
        "paused</span></td><td class=\"n\">500</td>",
        "<td class=\"n\">30s</td>",
        "The database lacks what the journal holds.",
        &format!("missing: hold {hold} is not in the database"),
    ] {
        assert!(html.contains(expect), "{expect:?} not in {html}");
    }
    let errors = chromium::console_errors(&dom.stderr);
    assert!(errors.is_empty(), "{errors:#?}");
    drop(console);

    // Without the key the console cannot check the journal, and says why
    // (the rest of the page is served as before).
    let console = Console::start(d, db.url(), "127.0.0.1:0", None);
    let page = console.get("/settings", None);
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(
            "Not checked: </span>invalid configuration: [journal] is configured but COHORT_JOURNAL_KEY is not set"
        ),
        "{}",
        page.body
    );
    assert!(page.body.contains("Paused: SessionNote"), "{}", page.body);
}
