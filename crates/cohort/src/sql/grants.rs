//! Statements that check the connected role's privileges.

use super::statement::{Args, Params, Statement};
use crate::ident::SqlText;

/// Table privileges to check, as three arrays of one length.
#[derive(Debug)]
pub(crate) struct Privileges {
    pub(crate) schemas: Vec<String>,
    pub(crate) tables: Vec<String>,
    pub(crate) privileges: Vec<&'static str>,
}

impl Params for Privileges {
    fn bind(self, q: Args) -> Args {
        q.bind(self.schemas).bind(self.tables).bind(self.privileges)
    }
}

/// For each (schema, table, privilege), in order: whether it is missing.
pub(crate) fn missing(privileges: Privileges) -> Statement<Privileges> {
    let sql = SqlText::new(
        "SELECT NOT pg_catalog.has_table_privilege(pg_catalog.format('%I.%I', s, n), p) \
         FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]), \
              pg_catalog.unnest($3::text[])) WITH ORDINALITY AS t(s, n, p, i) ORDER BY i",
    );
    Statement::new(sql, privileges)
}

/// The connected role's name.
pub(crate) fn current_role() -> Statement<()> {
    Statement::new(SqlText::new("SELECT current_user::text"), ())
}
