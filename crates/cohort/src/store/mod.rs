//! The journal's stores (a directory of files, or a table in another
//! database), below the context: a handle opens its journal once.

pub(crate) mod journal;
