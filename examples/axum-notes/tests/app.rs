//! The axum application on a real server: guarded deletes answer 204, 409
//! (held) or 404; the erasure endpoint erases the person's notes except the
//! held one; the dispatcher running beside the server logs every purge.

use std::io::{Read, Write};
use std::time::Duration;

use cohort::holds::HoldRequest;
use cohort::services::Services;
use cohort_example_axum::{retention, router, Note, COHORT_SCHEMA, SCHEMA_SQL};
use uuid::Uuid;

const TENANT: &str = "11111111-1111-1111-1111-111111111111";

/// One HTTP/1.1 request: (status, body).
fn request(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        rest.to_string(),
    )
}

async fn count(pool: &cohort::sqlx::PgPool, sql: &'static str) -> i64 {
    cohort::sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// PACKAGE (examples build and run): the web application end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_application_deletes_under_holds_erases_and_logs_purges() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let pool = db.pool().clone();
    cohort::sqlx::raw_sql(SCHEMA_SQL)
        .execute(&pool)
        .await
        .unwrap();
    cohort::schema::migrate(&mut pool.acquire().await.unwrap(), COHORT_SCHEMA)
        .await
        .unwrap();
    let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
    let mut notes = Vec::new();
    for (author, n) in [(alice, 4), (bob, 2)] {
        for _ in 0..n {
            let id = Uuid::new_v4();
            cohort::sqlx::query("INSERT INTO app.notes VALUES ($1, $2, $3, now() - interval '1 day', 'secret text')")
                .bind(id)
                .bind(Uuid::parse_str(TENANT).unwrap())
                .bind(author)
                .execute(&pool)
                .await
                .unwrap();
            notes.push((author, id));
        }
    }
    let config = cohort::CohortConfig {
        schema: COHORT_SCHEMA.into(),
        dispatch: cohort::config::DispatchConfig {
            poll_interval: "1s".parse().unwrap(),
            ..Default::default()
        },
        ..Default::default()
    };
    let cohort = retention(pool.clone(), config).await.unwrap();
    let services = Services::new(&cohort).unwrap().spawn();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = router(cohort.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // One of Alice's notes is under a legal hold.
    let held = notes[0].1;
    cohort
        .create_hold(
            HoldRequest::new(Note::RETENTION_ENTITY_ID, held.to_string(), "case").tenant(TENANT),
        )
        .await
        .unwrap();

    let a = addr.clone();
    let path = |id: Uuid| format!("/tenants/{TENANT}/notes/{id}");
    let (held_path, bobs) = (path(held), path(notes[4].1));
    let (status, body) = tokio::task::spawn_blocking({
        let a = a.clone();
        move || request(&a, "DELETE", &held_path, None)
    })
    .await
    .unwrap();
    assert_eq!(status, 409, "{body}");
    assert!(body.contains(&held.to_string()), "{body}");
    let (status, _) = tokio::task::spawn_blocking({
        let a = a.clone();
        move || request(&a, "DELETE", &bobs, None)
    })
    .await
    .unwrap();
    assert_eq!(status, 204);
    let unknown = path(Uuid::new_v4());
    let (status, _) = tokio::task::spawn_blocking({
        let a = a.clone();
        move || request(&a, "DELETE", &unknown, None)
    })
    .await
    .unwrap();
    assert_eq!(status, 404);
    let (status, _) = tokio::task::spawn_blocking({
        let a = a.clone();
        move || request(&a, "DELETE", "/tenants/not-a-tenant/notes/x", None)
    })
    .await
    .unwrap();
    assert_eq!(status, 400);
    assert_eq!(count(&pool, "SELECT count(*) FROM app.notes").await, 5);

    // Erase Alice: three of her notes go, the held one stays; Bob's stays.
    let body = format!("{{\"subject\": \"{alice}\"}}");
    let erasure = format!("/tenants/{TENANT}/erasure");
    let (status, answer) = tokio::task::spawn_blocking({
        let a = a.clone();
        move || request(&a, "POST", &erasure, Some(&body))
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{answer}");
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        (answer["affected"].as_u64(), answer["held"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(answer["status"], "succeeded");
    assert_eq!(count(&pool, "SELECT count(*) FROM app.notes").await, 2);

    // The dispatcher beside the server logs each purged note once.
    let start = std::time::Instant::now();
    while count(&pool, "SELECT count(*) FROM app.deletion_log").await < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "deliveries never came"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logged: Vec<(Uuid, String)> =
        cohort::sqlx::query_as("SELECT note_id, action FROM app.deletion_log ORDER BY note_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut expected: Vec<Uuid> = notes[1..4].iter().map(|n| n.1).collect();
    expected.sort();
    assert_eq!(logged.iter().map(|l| l.0).collect::<Vec<_>>(), expected);
    assert!(logged.iter().all(|l| l.1 == "purge"));
    let report = services.shutdown().await;
    assert!(report.clean(), "{report:?}");
}
