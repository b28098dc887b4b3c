//! Operations that are not sweeps: holds, guarded writes, history, dead letters, reports, the chain's verification and the journal's restore check and replay.

pub(crate) mod dead_letters;
pub mod guarded;
pub mod history;
pub mod holds;
pub mod report;
pub mod restore;
pub mod verify;
