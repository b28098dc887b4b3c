//! `cohort report`, `keys generate` and `verify`: the evidence an auditor
//! reads, signs and checks.

use std::path::PathBuf;

use cohort::Error;

use crate::open::{open_auditor, open_ledger};
use crate::{evidence, output, report, Cli, Failure};

/// `cohort report`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ReportArgs {
    /// First day of the period (YYYY-MM-DD, UTC).
    #[arg(long, value_name = "DATE")]
    pub(crate) from: String,
    /// Last day of the period, included (YYYY-MM-DD, UTC).
    #[arg(long, value_name = "DATE")]
    pub(crate) to: String,
    /// Only this tenant's runs, and the holds that reach it.
    #[arg(long, value_name = "TENANT")]
    pub(crate) tenant: Option<String>,
    /// html (one self-contained page), csv (one row per figure) or json.
    /// The global --json flag means json.
    #[arg(long, value_enum, default_value_t = report::Format::Html)]
    pub(crate) format: report::Format,
    /// Write here (replacing the file whole) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// Sign the report with this signing key (PREFIX.key of `cohort
    /// keys generate`): writes FILE.manifest.json and FILE.sig beside it.
    #[arg(long, value_name = "KEY_FILE", requires = "output")]
    pub(crate) sign: Option<PathBuf>,
    /// Sign even though the ledger's chain does not verify (refused
    /// otherwise, exit 1); the manifest records that it was broken.
    #[arg(long, requires = "sign")]
    pub(crate) sign_broken_chain: bool,
}

/// `cohort verify`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// Cohort's schema, for verifying without a policy file (default:
    /// COHORT_SCHEMA, else public). With a policy file, its own.
    #[arg(long, value_name = "SCHEMA", conflicts_with = "report")]
    pub(crate) schema: Option<String>,
    /// A chain head recorded earlier (N:HASH, as a report prints it):
    /// the chain must still hold it.
    #[arg(long, value_name = "N:HASH", conflicts_with = "report")]
    pub(crate) head: Option<String>,
    /// The report file (its FILE.manifest.json beside it).
    #[arg(long, value_name = "FILE", requires_all = ["signature", "public_key"])]
    pub(crate) report: Option<PathBuf>,
    /// The detached signature (FILE.sig).
    #[arg(long, value_name = "SIG", requires = "report")]
    pub(crate) signature: Option<PathBuf>,
    /// The signer's public key (PREFIX.pub of `cohort keys generate`).
    #[arg(long, value_name = "KEY", requires = "report")]
    pub(crate) public_key: Option<PathBuf>,
    /// The period the report must be of (FROM..TO, as given to
    /// `cohort report`): a report of another period fails.
    #[arg(long, value_name = "FROM..TO", requires = "report")]
    pub(crate) period: Option<String>,
    /// The tenant the report must be of: a report of another tenant
    /// (or of all) fails.
    #[arg(long, value_name = "TENANT", requires = "report")]
    pub(crate) tenant: Option<String>,
}

/// `cohort report`: the evidence for a period, to stdout or a file,
/// signed when asked.
pub(crate) async fn report(cli: &Cli, args: &ReportArgs) -> Result<(), Failure> {
    let from = &args.from;
    let to = &args.to;
    let tenant = &args.tenant;
    let format = &args.format;
    let output = &args.output;
    let sign = &args.sign;
    let sign_broken_chain = &args.sign_broken_chain;
    let (cohort, loaded) = open_ledger(cli).await?;
    let format = if cli.json {
        report::Format::Json
    } else {
        *format
    };
    let policy = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("cohort.toml"));
    let args = report::Args {
        from,
        to,
        tenant: tenant.as_deref(),
        format,
        output: output.as_deref(),
        sign: sign.as_deref().map(|key| (key, policy.as_path())),
        sign_broken_chain: *sign_broken_chain,
        evidence: &loaded.evidence,
    };
    report::run(&cohort, args).await
}

/// `cohort keys generate --out PREFIX`.
pub(crate) fn keys_generate(cli: &Cli, out: &std::path::Path) -> Result<(), Failure> {
    let (private, public) = evidence::generate(out)?;
    if cli.json {
        output::print_json(&serde_json::json!({
            "private_key": private.display().to_string(),
            "public_key": public.display().to_string(),
        }));
    } else {
        outln!(
            "Wrote {} (the signing key: keep it secret) and {} (its public key: give it to whoever verifies).",
            private.display(),
            public.display()
        );
    }
    Ok(())
}

/// `cohort verify`: a signed report offline (`--report`), or the ledger's
/// chain (with the policy file, or as an auditor has it).
pub(crate) async fn verify(cli: &Cli, args: &VerifyArgs) -> Result<(), Failure> {
    match args {
        VerifyArgs {
            report: Some(report),
            signature: Some(signature),
            public_key: Some(public_key),
            period,
            tenant,
            ..
        } => verify_report(cli, (report, signature, public_key), period, tenant),
        VerifyArgs {
            report: None,
            head,
            schema,
            ..
        } => verify_chain(cli, head, schema).await,
        VerifyArgs { .. } => Err(Failure::Input(Error::InvalidInput(
            "--report needs --signature SIG and --public-key KEY".into(),
        ))),
    }
}

fn verify_report(
    cli: &Cli,
    (report, signature, public_key): (&PathBuf, &PathBuf, &PathBuf),
    period: &Option<String>,
    tenant: &Option<String>,
) -> Result<(), Failure> {
    let expect = evidence::Expected::parse(period.as_deref(), tenant.as_deref())?;
    let verified = evidence::verify(report, signature, public_key, &expect)?;
    if cli.json {
        output::print_json(&serde_json::to_value(&verified).expect("serialises"));
    } else if verified.valid {
        outln!(
            "{}: the signature and the report's digest hold ({}).",
            report.display(),
            verified.manifest
        );
        for line in verified.summary() {
            outln!("  {line}");
        }
    } else {
        eprintln!(
            "cohort: {}",
            verified.problem.as_deref().unwrap_or("not valid")
        );
    }
    if verified.valid {
        Ok(())
    } else {
        Err(Failure::Status(1))
    }
}

async fn verify_chain(
    cli: &Cli,
    head: &Option<String>,
    schema: &Option<String>,
) -> Result<(), Failure> {
    let expected = head
        .as_deref()
        .map(str::parse::<cohort::chain::ExpectedHead>)
        .transpose()?;
    if cli.config.is_some() && schema.is_some() {
        return Err(Failure::Input(Error::InvalidInput(
            "--schema is for verifying without a policy file; with --config the policy file names the schema".into(),
        )));
    }
    let policy_file =
        cli.config.is_some() || (schema.is_none() && std::path::Path::new("cohort.toml").exists());
    if policy_file {
        let (cohort, _) = open_ledger(cli).await?;
        evidence::verify_chain(&cohort, cli.json, expected, true).await
    } else {
        let cohort = open_auditor(cli, schema.as_deref()).await?;
        evidence::verify_chain(&cohort, cli.json, expected, false).await
    }
}
