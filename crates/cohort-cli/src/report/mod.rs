//! `cohort report`: the evidence of retention for a period, from the
//! ledger alone, as one self-contained HTML file, CSV or JSON.

mod html;

use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::NaiveDate;
use cohort::report::{Report, ReportRequest};
use cohort::{Cohort, Error};

use crate::Failure;

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// One self-contained page: no script, no external resource, printable.
    Html,
    /// One row per figure: section, entity, category, stage, item, measure, value.
    Csv,
    /// The report as one JSON document.
    Json,
}

impl Format {
    /// The format's name, as the manifest and `--format` spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Html => "html",
            Format::Csv => "csv",
            Format::Json => "json",
        }
    }
}

/// What `cohort report` was asked for.
pub(crate) struct Args<'a> {
    pub(crate) from: &'a str,
    pub(crate) to: &'a str,
    pub(crate) tenant: Option<&'a str>,
    pub(crate) format: Format,
    pub(crate) output: Option<&'a Path>,
    /// Sign with this private key; the policy file whose digest the
    /// manifest carries.
    pub(crate) sign: Option<(&'a Path, &'a Path)>,
    /// Sign even when the chain does not verify (recorded in the manifest).
    pub(crate) sign_broken_chain: bool,
    /// The policy's `[evidence]`, which a signed manifest states.
    pub(crate) evidence: &'a cohort::policy::Evidence,
}

fn date(flag: &str, text: &str) -> Result<NaiveDate, Failure> {
    text.parse::<NaiveDate>().map_err(|_| {
        Failure::Input(Error::InvalidInput(format!(
            "{flag} {text:?} is not a date: write it as YYYY-MM-DD (UTC)"
        )))
    })
}

/// `cohort report`: the report for the period, written to `--output`
/// (and signed when asked) or to standard output.
pub(crate) async fn run(cohort: &Cohort, args: Args<'_>) -> Result<(), Failure> {
    let mut request = ReportRequest::new(date("--from", args.from)?, date("--to", args.to)?);
    if let Some(t) = args.tenant {
        request = request.tenant(t);
    }
    let report = cohort.report(&request).await?;
    let bytes = render(&report, args.format)?;
    let sweeps: u64 = report.entities.iter().map(|e| e.runs.runs).sum();
    if sweeps + report.erasures.requests == 0 {
        eprintln!(
            "cohort: warning: no run settled from {} to {}{}: the report attests that nothing was removed, and nothing more",
            report.from,
            report.to,
            report
                .tenant
                .as_deref()
                .map(|t| format!(" for tenant {t}"))
                .unwrap_or_default()
        );
    }
    match args.output {
        Some(path) => write_output(cohort, &args, path, &report, &bytes, sweeps).await,
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(&bytes).and_then(|()| out.flush()) {
                // `cohort report … | head`: a closed pipe ends quietly.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                other => other.map_err(|e| io_failure("stdout", &e)),
            }
        }
    }
}

/// Writes the report to `--output`, signs it when asked, and says what
/// the file holds. `sweeps`: the sweep runs the report counts.
async fn write_output(
    cohort: &Cohort,
    args: &Args<'_>,
    path: &Path,
    report: &Report,
    bytes: &[u8],
    sweeps: u64,
) -> Result<(), Failure> {
    check_signable(args, report)?;
    write_file(path, bytes)?;
    if let Some((key, policy)) = args.sign {
        let queue = cohort.queue_depth().await?;
        crate::evidence::sign(&crate::evidence::Signing {
            evidence: args.evidence,
            queue,
            report,
            format: args.format.name(),
            path,
            bytes,
            policy,
            key,
            broken_chain: report.chain.as_ref().is_some_and(|c| !c.verified),
        })?;
    }
    // The file went where it was asked: say what it holds, so a period
    // with nothing in it is never mistaken for a full one.
    outln!("{}", wrote(args, path, report, sweeps));
    Ok(())
}

/// With `--sign`, refuses before the report is written a key that cannot
/// sign, and a chain that does not verify unless `--sign-broken-chain`
/// (exit 1).
fn check_signable(args: &Args<'_>, report: &Report) -> Result<(), Failure> {
    let Some((key, _)) = args.sign else {
        return Ok(());
    };
    crate::evidence::check_key(key)?;
    // A broken chain is not signed unless asked: the signature would
    // vouch for figures the ledger no longer backs.
    if let Some(c) = report.chain.as_ref().filter(|c| !c.verified) {
        if !args.sign_broken_chain {
            eprintln!(
                "cohort: the ledger's chain does not verify ({} break(s); first: {}): nothing was written or signed; run `cohort verify`, or sign anyway with --sign-broken-chain (the manifest records it)",
                c.breaks,
                c.first_break.as_deref().unwrap_or("-")
            );
            return Err(Failure::Status(1));
        }
    }
    Ok(())
}

/// The line saying what a report written to `path` holds: its format,
/// period and tenant, the runs it counts, and its signature files.
fn wrote(args: &Args<'_>, path: &Path, report: &Report, sweeps: u64) -> String {
    format!(
        "Wrote {} ({}, {} to {}, {}): {}{}.",
        path.display(),
        args.format.name(),
        report.from,
        report.to,
        report
            .tenant
            .as_deref()
            .map(|t| format!("tenant {t}"))
            .unwrap_or_else(|| "all tenants".into()),
        if sweeps + report.erasures.requests == 0 {
            "no run settled in the period: it attests that nothing was removed, and nothing more"
                .to_owned()
        } else {
            format!(
                "{} sweep run(s) and {} erasure request(s)",
                sweeps, report.erasures.requests
            )
        },
        if args.sign.is_some() {
            format!("; signed: {0}.manifest.json, {0}.sig", path.display())
        } else {
            String::new()
        }
    )
}

/// The report in one format.
pub(crate) fn render(report: &Report, format: Format) -> Result<Vec<u8>, Failure> {
    Ok(match format {
        Format::Json => {
            let mut v = serde_json::to_vec_pretty(report).expect("a report serialises");
            v.push(b'\n');
            v
        }
        Format::Csv => csv(report)?,
        Format::Html => html::page(report).into_string().into_bytes(),
    })
}

fn csv(report: &Report) -> Result<Vec<u8>, Failure> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let failed = |e: csv::Error| Failure::Run(Error::InvalidInput(format!("writing CSV: {e}")));
    w.write_record([
        "section", "entity", "category", "stage", "item", "measure", "value",
    ])
    .map_err(failed)?;
    for f in report.facts() {
        w.write_record(
            [
                f.section,
                &f.entity,
                &f.category,
                &f.stage,
                &f.item,
                &f.measure,
                &f.value,
            ]
            .map(|cell| inert(cell).into_owned()),
        )
        .map_err(failed)?;
    }
    w.into_inner()
        .map_err(|e| Failure::Run(Error::InvalidInput(format!("writing CSV: {e}"))))
}

/// A CSV cell a spreadsheet would not run as a formula (CWE-1236): text
/// starting with `=`, `+`, `-`, `@`, a tab or a carriage return gets a
/// leading `'`, which spreadsheets read as "text follows" and do not
/// show. Numbers (a negative figure) and the lone `-` of an empty cell are
/// kept as they are; the HTML and JSON always keep the exact text.
fn inert(cell: &str) -> std::borrow::Cow<'_, str> {
    let risky = cell.starts_with(['=', '+', '-', '@', '\t', '\r']);
    if !risky || cell == "-" || cell.parse::<f64>().is_ok() {
        std::borrow::Cow::Borrowed(cell)
    } else {
        std::borrow::Cow::Owned(format!("'{cell}"))
    }
}

/// Writes beside the target and renames over it: a reader never sees half
/// a report, and a failed write leaves an older report as it was.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let name = path.file_name().ok_or_else(|| {
        Failure::Input(Error::InvalidInput(format!(
            "--output {} names no file",
            path.display()
        )))
    })?;
    let mut partial = PathBuf::from(path);
    partial.set_file_name(format!(".{}.partial", name.to_string_lossy()));
    std::fs::write(&partial, bytes)
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            io_failure(&path.display().to_string(), &e)
        })
}

fn io_failure(target: &str, e: &std::io::Error) -> Failure {
    Failure::Input(Error::InvalidInput(format!("cannot write {target}: {e}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn formula_cells_are_made_inert_and_figures_are_not() {
        for (cell, written) in [
            ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"),
            ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
            ("-1+1", "'-1+1"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\tx", "'\tx"),
            ("\rx", "'\rx"),
            ("-12", "-12"),
            ("-0.5", "-0.5"),
            ("-", "-"),
            ("policy file", "policy file"),
            ("", ""),
        ] {
            assert_eq!(super::inert(cell), written, "{cell:?}");
        }
    }
}
