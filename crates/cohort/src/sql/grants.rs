//! Statements that check the connected role's privileges.

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;

/// Privileges to check, as four arrays of one length: the object's
/// schema and name, the privilege, and for a function its argument types
/// in parentheses (an empty string for a table).
#[derive(Debug)]
pub(crate) struct Privileges {
    pub(crate) schemas: Vec<String>,
    pub(crate) names: Vec<String>,
    pub(crate) privileges: Vec<&'static str>,
    pub(crate) arguments: Vec<&'static str>,
}

impl Params for Privileges {
    fn bind(self, q: Args) -> Args {
        q.bind(self.schemas)
            .bind(self.names)
            .bind(self.privileges)
            .bind(self.arguments)
    }
}

/// For each (schema, name, privilege, arguments), in order: whether it is
/// missing. A function that does not exist counts as missing (its
/// privilege cannot be granted before `cohort migrate` creates it).
pub(crate) fn missing(privileges: Privileges) -> Statement<Privileges> {
    let sql = SqlText::new(
        "SELECT CASE WHEN a = '' \
                THEN NOT pg_catalog.has_table_privilege(pg_catalog.format('%I.%I', s, n), p) \
                ELSE COALESCE(NOT pg_catalog.has_function_privilege( \
                         pg_catalog.to_regprocedure(pg_catalog.format('%I.%I', s, n) || a), p), true) \
                END \
         FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), \
              pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[])) \
              WITH ORDINALITY AS t(s, n, p, a, i) ORDER BY i",
    );
    Statement::new(sql, privileges)
}

/// The connected role's name.
pub(crate) fn current_role() -> Statement<()> {
    Statement::new(SqlText::new("SELECT current_user::text"), ())
}
