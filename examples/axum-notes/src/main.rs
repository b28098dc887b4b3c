//! `DATABASE_URL=… cargo run -p cohort-example-axum`: migrates, starts the
//! scheduled worker (with `COHORT_SCHEDULE`, e.g. "0 0 3 * * *") and the
//! dispatcher, and serves on `LISTEN` (default 127.0.0.1:3000) until
//! Ctrl-C, then stops the services gracefully.

use cohort::services::Services;
use cohort_example_axum::{retention, router, COHORT_SCHEMA, SCHEMA_SQL};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let pool = cohort::sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(&url)
        .await?;
    cohort::sqlx::raw_sql(SCHEMA_SQL).execute(&pool).await?;
    cohort::schema::migrate(&mut *pool.acquire().await?, COHORT_SCHEMA).await?;

    let mut config = cohort::CohortConfig {
        schema: COHORT_SCHEMA.into(),
        ..Default::default()
    };
    config.apply_env(std::env::vars())?; // COHORT_SCHEDULE, COHORT_DRY_RUN, …
    let cohort = retention(pool, config).await?;
    let services = Services::new(&cohort)?.spawn();

    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    tracing::info!(%listen, "serving");
    axum::serve(listener, router(cohort))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    let report = services.shutdown().await;
    tracing::info!(?report, "services stopped");
    Ok(())
}
