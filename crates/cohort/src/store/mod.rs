//! Stores outside a run: the journal's stores (a directory of files or another database) and the registry of peer processes.

pub(crate) mod journal;
pub mod peers;
