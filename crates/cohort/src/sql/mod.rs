//! SQL planning: typed keys and the statements the engine runs, built once
//! per entity from quoted identifiers and fixed text.

mod key;
pub(crate) mod plan;

pub(crate) use key::{bind_array, KeyType, KeyValue};
