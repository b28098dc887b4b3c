//! Exit codes, in one place (SPEC §12): 0 success; 1 the run failed (or
//! was cancelled, or the database could not be reached); 2 bad input, bad
//! configuration or failed validation, with nothing changed; 3 the run
//! settled `partially_failed` (or, for `sweep --all-tenants`, some passes
//! did their work and others failed). A run that settled `paused` exits 0:
//! a pause is an operator's choice, and the JSON says which entities it
//! stopped.

use std::process::ExitCode;

use cohort::{Error, PassOutcome, RunStatus};

/// How a command ended, mapped to the documented exit codes.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Bad input, bad configuration or failed validation: exit 2.
    Input(Error),
    /// Anything else (database unreachable, run failed): exit 1.
    Run(Error),
    /// Output was printed; exit with this code (1 failed/cancelled run, 3 partially failed).
    Status(u8),
}

impl Failure {
    /// Prints the error (if it was not printed yet) and exits with its code.
    pub(crate) fn report(self, json: bool) -> ExitCode {
        let (code, error) = match self {
            Failure::Input(e) => (2, e),
            Failure::Run(e) => (1, e),
            Failure::Status(code) => return ExitCode::from(code),
        };
        crate::output::error(json, &error);
        ExitCode::from(code)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        if e.kind().is_bad_input() {
            Failure::Input(e)
        } else {
            Failure::Run(e)
        }
    }
}

pub(crate) fn exit_for(statuses: impl IntoIterator<Item = RunStatus>) -> Result<(), Failure> {
    let mut code = 0;
    for s in statuses {
        code = code.max(match s {
            RunStatus::Succeeded | RunStatus::Paused => 0,
            RunStatus::PartiallyFailed => 3,
            _ => 1,
        });
    }
    if code == 0 {
        Ok(())
    } else {
        Err(Failure::Status(if code == 3 { 3 } else { 1 }))
    }
}

/// Exit code of one pass: 0 succeeded, 3 partially failed, 1 failed or
/// cancelled, 2 refused as bad input before its run existed.
pub(crate) fn pass_code(pass: &PassOutcome) -> u8 {
    match pass {
        PassOutcome::Ran(r) => match r.status {
            RunStatus::Succeeded | RunStatus::Paused => 0,
            RunStatus::PartiallyFailed => 3,
            _ => 1,
        },
        PassOutcome::NotStarted(f) if f.kind.is_bad_input() => 2,
        _ => 1,
    }
}

/// `sweep --all-tenants`: 0 when every pass succeeded; 3 when some passes
/// did their work and others failed (a run partially failed, or a pass
/// could not start); when no pass succeeded at all, 2 if every pass was
/// refused as bad input, else 1.
pub(crate) fn all_tenants_code(passes: &[PassOutcome]) -> u8 {
    let codes: Vec<u8> = passes.iter().map(pass_code).collect();
    if codes.iter().all(|c| *c == 0) {
        0
    } else if codes.iter().any(|c| *c == 0 || *c == 3) {
        3
    } else if codes.iter().all(|c| *c == 2) {
        2
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Result<(), Failure>) -> u8 {
        match code {
            Ok(()) => 0,
            Err(Failure::Status(c)) => c,
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn run_statuses_map_to_the_documented_codes() {
        use RunStatus::*;
        let cases: &[(&[RunStatus], u8)] = &[
            (&[Succeeded], 0),
            (&[Succeeded, Succeeded], 0),
            (&[PartiallyFailed], 3),
            (&[Failed], 1),
            (&[Cancelled], 1),
            (&[Succeeded, PartiallyFailed], 3),
            // A pause is an operator's choice, not a failure; the JSON says it.
            (&[Paused], 0),
            (&[], 0),
        ];
        for (statuses, want) in cases {
            assert_eq!(
                status(exit_for(statuses.iter().copied())),
                *want,
                "{statuses:?}"
            );
        }
    }
}
