//! Cancelling a run from outside it.

use tokio_util::sync::CancellationToken;

/// Cancels the run it is given to: keep a clone, pass one to the request
/// (`SweepRequest::cancellation`, `ErasureRequest::cancellation`) and call
/// [`Cancel::cancel`] from anywhere (a signal handler, another task). The
/// open batch is rolled back and the run settles `Cancelled`.
#[derive(Debug, Clone, Default)]
pub struct Cancel(CancellationToken);

impl Cancel {
    /// A handle that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires: every clone sees it.
    pub fn cancel(&self) {
        self.0.cancel();
    }

    /// Whether it has fired.
    pub fn is_cancelled(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Completes once it has fired.
    pub async fn cancelled(&self) {
        self.0.cancelled().await
    }

    /// Sleeps for `duration` unless it fires first; `true` when the whole
    /// time passed without it firing.
    pub(crate) async fn sleep(&self, duration: std::time::Duration) -> bool {
        tokio::select! {
            _ = self.0.cancelled() => false,
            _ = tokio::time::sleep(duration) => !self.0.is_cancelled(),
        }
    }
}
