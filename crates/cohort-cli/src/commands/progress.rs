//! The progress bar of long runs on a terminal (an audit observer).

use std::io::IsTerminal;
use std::sync::Mutex;

use cohort::async_trait;
use cohort::observer::{AuditEvent, AuditObserver};
use uuid::Uuid;

/// Whether to draw a progress bar: human output on a terminal.
pub(crate) fn progress_wanted(json: bool) -> bool {
    !json && std::io::stdout().is_terminal()
}

/// A progress line fed by committed ledger events: the entity being
/// processed, its rows so far, and how many the preview of the run counted.
/// Cheap to clone; the CLI keeps one handle to finish the line before it
/// prints a result, so the result never lands on the progress line.
#[derive(Clone, Default)]
pub(crate) struct Progress(std::sync::Arc<Mutex<ProgressState>>);

#[derive(Default)]
pub(super) struct ProgressState {
    bar: Option<indicatif::ProgressBar>,
    names: std::collections::HashMap<Uuid, String>,
    done: bool,
}

/// The progress handle of this process, when a progress line is drawn.
static PROGRESS: std::sync::OnceLock<Progress> = std::sync::OnceLock::new();

impl Progress {
    /// The process's progress line (drawn only when stdout is a terminal).
    pub(crate) fn install() -> Self {
        PROGRESS.get_or_init(Progress::default).clone()
    }

    /// Entity names for the line, from the validated model.
    pub(crate) fn names(&self, model: &cohort::validate::ValidatedModel) {
        let mut state = self.0.lock().expect("progress lock");
        state.names = model
            .entities
            .iter()
            .map(|e| (e.id, e.name.clone()))
            .collect();
    }
}

/// Clears the progress line, if one is drawn, before a result is printed.
pub(crate) fn finish_progress() {
    if let Some(p) = PROGRESS.get() {
        let mut state = p.0.lock().expect("progress lock");
        if let Some(b) = state.bar.take() {
            b.finish_and_clear();
        }
        state.done = true;
    }
}

pub(super) fn rows(n: u64) -> String {
    if n == 1 {
        "1 row".into()
    } else {
        format!("{n} rows")
    }
}

#[async_trait]
impl AuditObserver for Progress {
    async fn on_event(
        &self,
        event: &AuditEvent,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut state = self.0.lock().expect("progress lock");
        match event {
            AuditEvent::Started { tenant, .. } => {
                state.done = false;
                let b = indicatif::ProgressBar::new_spinner();
                b.set_message(format!(
                    "sweeping {}",
                    tenant.as_deref().unwrap_or("the tenantless entities")
                ));
                state.bar = Some(b);
            }
            AuditEvent::EntityProgress {
                entity_id,
                total,
                strategy,
                ..
            } if !state.done => {
                let name = state
                    .names
                    .get(entity_id)
                    .cloned()
                    .unwrap_or_else(|| entity_id.to_string());
                if let Some(b) = state.bar.as_ref() {
                    b.set_message(format!("{name}: {} so far ({strategy})", rows(*total)));
                    b.tick();
                }
            }
            AuditEvent::Settled { .. } => {
                if let Some(b) = state.bar.take() {
                    b.finish_and_clear();
                }
            }
            _ => {}
        }
        Ok(())
    }
}
