//! The test binary's one tracing subscriber, and each test's capture of
//! what its own thread logs.
//!
//! A process-wide subscriber is installed once. It formats an event only
//! on a thread whose test asked for a capture, into that test's buffer, so
//! tests that read logs run beside every other test of the binary without
//! reading each other's lines. (A scoped subscriber per test, tracing's
//! `set_default`, races with other threads over the per-callsite interest
//! cache and sometimes misses events; this one never answers "never" for a
//! callsite, it decides per event: its filters are dynamic, which tracing
//! asks every time, where a plain `filter_fn`'s answer is cached for the
//! callsite by whichever thread reached it first.) A `#[tokio::test]`
//! runs its tasks, and so Cohort's, on its own thread.

use std::cell::RefCell;
use std::sync::OnceLock;

use tracing_subscriber::filter::dynamic_filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use super::LogBuffer;

/// How a capture's lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Plain text lines, without colour, at INFO and above.
    Text,
    /// JSON lines at DEBUG and above, with the current span and the list
    /// of spans around each event (what operators ship).
    Json,
}

thread_local! {
    static CAPTURE: RefCell<Option<(Format, LogBuffer)>> = const { RefCell::new(None) };
}

/// What this thread logs while the value lives.
pub struct Capture {
    buffer: LogBuffer,
}

impl Capture {
    /// Everything captured so far.
    pub fn text(&self) -> String {
        self.buffer.text()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        CAPTURE.with(|c| *c.borrow_mut() = None);
    }
}

/// Starts capturing what this thread logs, in `format`.
pub fn capture(format: Format) -> Capture {
    install();
    let buffer = LogBuffer::default();
    CAPTURE.with(|c| *c.borrow_mut() = Some((format, buffer.clone())));
    Capture { buffer }
}

/// Whether this thread captures `format` at `level`.
fn wanted(format: Format, level: &tracing::Level) -> bool {
    CAPTURE.with(|c| match &*c.borrow() {
        Some((f, _)) if *f == format => match format {
            Format::Text => *level <= tracing::Level::INFO,
            Format::Json => *level <= tracing::Level::DEBUG,
        },
        _ => false,
    })
}

/// Writes a formatted line into this thread's capture.
struct ThreadWriter;

impl std::io::Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some((_, b)) = &*c.borrow() {
                b.0.lock().unwrap().extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn install() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let text = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(|| ThreadWriter)
            .with_filter(dynamic_filter_fn(|m, _| wanted(Format::Text, m.level())));
        let json = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(|| ThreadWriter)
            .with_filter(dynamic_filter_fn(|m, _| wanted(Format::Json, m.level())));
        tracing_subscriber::registry()
            .with(text)
            .with(json)
            .try_init()
            .expect("the only global subscriber of this test binary");
    });
}
