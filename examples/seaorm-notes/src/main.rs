//! `cargo run -p cohort-example-seaorm` with `DATABASE_URL` set: migrates,
//! builds the Cohort handle on SeaORM's pool, sweeps every tenant's notes
//! once and prints what it did.

use cohort::SweepRequest;
use cohort_example_seaorm::{migration::Migrator, retention};
use sea_orm_migration::MigratorTrait;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let db = sea_orm::Database::connect(&url).await?;
    Migrator::up(&db, None).await?;
    let cohort = retention(&db).await?;
    let tenants: Vec<(uuid::Uuid,)> =
        cohort::sqlx::query_as("SELECT DISTINCT tenant_id FROM app.notes")
            .fetch_all(db.get_postgres_connection_pool())
            .await?;
    let now = chrono::Utc::now();
    for (tenant,) in tenants {
        let r = cohort
            .sweep(SweepRequest::tenanted(tenant.to_string(), now))
            .await?;
        println!(
            "tenant {tenant}: {:?}, {} notes purged",
            r.status,
            r.affected()
        );
    }
    Ok(())
}
