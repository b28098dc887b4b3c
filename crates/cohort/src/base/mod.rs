//! Leaves: what every layer may use and that uses nothing of Cohort's (identifiers, errors' parts, cancellation, digests, advisory-lock keys, spelling suggestions).

pub(crate) mod cancel;
pub(crate) mod diagnostic;
pub(crate) mod digest;
pub(crate) mod ident;
pub(crate) mod locks;
pub(crate) mod suggest;
