//! A run's context, handed to every part of it: the handle's context and
//! plans, the run's id and spec, and the recorder that says what it does.

use uuid::Uuid;

use super::recorder::RunRecorder;
use super::work::RunSpec;
use crate::context::{Prepared, Ready};

/// One run, as its parts see it.
pub(crate) struct RunCtx<'a> {
    /// The handle, validated (it reads as its [`Context`]).
    pub(crate) cx: &'a Ready<'a>,
    pub(crate) ready: &'a Prepared,
    pub(crate) run_id: Uuid,
    pub(crate) spec: &'a RunSpec,
    /// What the run tells the outside (ledger rows, metrics, log lines,
    /// observers) goes through it.
    pub(crate) recorder: &'a RunRecorder<'a>,
}

impl RunCtx<'_> {
    /// With `cdc_marker`, the content of a batch transaction's logical
    /// decoding message: `{"run_id", "entity", "strategy", "rows"}`.
    pub(crate) fn cdc_marker(
        &self,
        entity: &str,
        strategy: crate::domain::rules::Strategy,
        rows: i64,
    ) -> Option<String> {
        self.cx.config.cdc_marker.then(|| {
            serde_json::json!({
                "run_id": self.run_id,
                "entity": entity,
                "strategy": strategy.as_str(),
                "rows": rows,
            })
            .to_string()
        })
    }
}
