//! Signed reports (RS-036): `cohort keys generate`, `cohort report … --sign
//! KEY_FILE` and `cohort verify --report FILE --signature SIG --public-key
//! KEY`, which needs no database.
//!
//! Beside the report `FILE`, signing writes `FILE.manifest.json` (the
//! report's SHA-256 and what it attests: period, tenant, policy, rows
//! changed per entity and strategy, what was kept, erasures served) and
//! `FILE.sig`, a detached Ed25519 signature over the manifest's bytes as
//! written. Verification checks the signature with the public key, then
//! the report's digest against the manifest's: a byte changed in either
//! file fails it. Keys and signatures come from `ring`; nothing here is
//! cryptography of its own.

use std::path::{Path, PathBuf};

use cohort::report::Report;
use cohort::Error;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::Failure;

/// The manifest's format name, first in every manifest.
pub(crate) const MANIFEST_FORMAT: &str = "cohort-report-manifest/1";

fn bad(msg: String) -> Failure {
    Failure::Input(Error::InvalidInput(msg))
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn unhex(text: &str, what: &str, path: &Path) -> Result<Vec<u8>, Failure> {
    hex::decode(text.trim()).map_err(|_| {
        bad(format!(
            "{} is not a {what} (hexadecimal text)",
            path.display()
        ))
    })
}

/// The refusal of a key file that exists.
fn kept_key(path: &Path) -> Failure {
    bad(format!(
        "{} exists; keys are never overwritten: move it away or choose another --out",
        path.display()
    ))
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| bad(format!("cannot read the {what} {}: {e}", path.display())))
}

/// `PATH` with `suffix` appended to its file name (`r.html` → `r.html.sig`).
pub(crate) fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Writes a new file, refusing to replace one (a key is never overwritten).
fn create_new(path: &Path, bytes: &[u8], private: bool) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    if private {
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(|e| {
        bad(if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "{} exists; keys are never overwritten: move it away or choose another --out",
                path.display()
            )
        } else {
            format!("cannot write {}: {e}", path.display())
        })
    })?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| bad(format!("cannot write {}: {e}", path.display())))
}

/// `cohort keys generate --out PREFIX`: `PREFIX.key` (the PKCS#8 private
/// key as hexadecimal, readable by its owner only) and `PREFIX.pub` (the
/// 32-byte public key as hexadecimal). Returns both paths.
pub(crate) fn generate(prefix: &Path) -> Result<(PathBuf, PathBuf), Failure> {
    let private = beside(prefix, ".key");
    let public = beside(prefix, ".pub");
    // Both checked first, so a pair is never half written.
    if let Some(p) = [&private, &public].into_iter().find(|p| p.exists()) {
        return Err(kept_key(p));
    }
    let rng = SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| Failure::Run(Error::InvalidInput("generating a key pair failed".into())))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("a key just generated");
    create_new(
        &private,
        format!("{}\n", hex(pkcs8.as_ref())).as_bytes(),
        true,
    )?;
    create_new(
        &public,
        format!("{}\n", hex(pair.public_key().as_ref())).as_bytes(),
        false,
    )?;
    Ok((private, public))
}

/// What a signed report attests, besides its digest.
pub(crate) struct Signing<'a> {
    pub(crate) report: &'a Report,
    pub(crate) format: &'a str,
    /// The report file as written.
    pub(crate) path: &'a Path,
    pub(crate) bytes: &'a [u8],
    /// The policy file the command read, for its digest.
    pub(crate) policy: &'a Path,
    pub(crate) key: &'a Path,
    /// The policy's `[evidence]`.
    pub(crate) evidence: &'a cohort::policy::Evidence,
    /// Handler work not done when the report was written.
    pub(crate) queue: cohort::telemetry::QueueDepth,
    /// Signed although the chain did not verify (`--sign-broken-chain`).
    pub(crate) broken_chain: bool,
}

/// What the database alone cannot erase and Cohort knows about: handler
/// work not done (a blob, an index, a CRM not yet told), and, when the
/// policy states it, how long backups keep copies of what was removed.
fn residual_copies(s: &Signing<'_>) -> serde_json::Value {
    let end = s
        .report
        .to
        .succ_opt()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc());
    let backups = match (s.evidence.backup_retention, end) {
        (Some(retention), Some(end)) => {
            let until = retention.after(end);
            json!({
                "retention": retention.to_string(),
                "until": until,
                "statement": format!(
                    "copies of rows removed up to {} may remain in base backups and the WAL archive until {}",
                    s.report.to,
                    until.map(|u| u.date_naive().to_string()).unwrap_or_else(|| "beyond the calendar".into())
                ),
            })
        }
        _ => json!({
            "statement": "not stated: set [evidence] backup_retention in the policy file to state how long backups keep copies"
        }),
    };
    json!({
        "handler_work": {
            "pending": s.queue.pending,
            "in_flight": s.queue.in_flight,
            "dead_lettered": s.queue.dead_lettered,
            "statement": "handler work not done when the report was written (every period): what handlers still have to tell other systems",
        },
        "backups": backups,
    })
}

/// Reads a private key file written by [`generate`].
fn private_key(path: &Path) -> Result<Ed25519KeyPair, Failure> {
    let der = read_hex(path, "private key")?;
    Ed25519KeyPair::from_pkcs8(&der).map_err(|_| {
        bad(format!(
            "{} is not an Ed25519 private key (cohort keys generate writes one)",
            path.display()
        ))
    })
}

/// Refuses a private key file that cannot sign (read before a report is
/// written, so a bad key changes nothing).
pub(crate) fn check_key(path: &Path) -> Result<(), Failure> {
    private_key(path).map(drop)
}

/// Writes `FILE.manifest.json` and `FILE.sig` beside the report; returns
/// their paths. The key is read before anything is written.
pub(crate) fn sign(s: &Signing<'_>) -> Result<(PathBuf, PathBuf), Failure> {
    let pair = private_key(s.key)?;
    let policy = read(s.policy, "policy file")?;
    let r = s.report;
    let mut changed = Vec::new();
    for e in &r.entities {
        let sum = |f: fn(&cohort::report::MonthCounts) -> u64| e.months.iter().map(f).sum::<u64>();
        for (strategy, rows) in [
            ("purge", sum(|m| m.purged)),
            ("soft_delete", sum(|m| m.soft_deleted)),
            ("anonymise", sum(|m| m.anonymised)),
            ("archive", sum(|m| m.archived)),
        ] {
            if rows > 0 {
                changed.push(json!({
                    "entity": e.entity, "entity_id": e.entity_id, "category": e.category,
                    "stage": e.stage, "strategy": strategy, "rows": rows,
                }));
            }
        }
    }
    let kept: Vec<_> = r
        .entities
        .iter()
        .map(|e| json!({"entity": e.entity, "category": e.category, "stage": e.stage, "kept": e.kept}))
        .collect();
    let manifest = json!({
        "format": MANIFEST_FORMAT,
        "report_file": s.path.file_name().map(|n| n.to_string_lossy().into_owned()),
        "report_format": s.format,
        "report_sha256": hex(&Sha256::digest(s.bytes)),
        "period": {"from": r.from, "to": r.to},
        "tenant": r.tenant,
        "generated_at": r.generated_at,
        "policy_file_sha256": hex(&Sha256::digest(&policy)),
        "cohort_version": env!("CARGO_PKG_VERSION"),
        "public_key_sha256": hex(&Sha256::digest(pair.public_key().as_ref())),
        "changed": changed,
        "kept": kept,
        "erasures": {
            "requests": r.erasures.requests,
            "succeeded": r.erasures.succeeded,
            "failed": r.erasures.failed,
            "median_seconds": r.erasures.median_seconds,
            "requests_with_due_date": r.erasures.timeliness,
        },
        "failures": r.failures,
        "chain": r.chain.as_ref().map(|c| json!({
            "head": c.head.as_ref().map(|h| h.spelling()),
            "head_at_period_end": c.head_at_period_end.as_ref().map(|h| h.spelling()),
            "verified_at_generation": c.verified,
            "breaks": c.breaks,
            "first_break": c.first_break,
        })),
        "signed_broken_chain": s.broken_chain,
        "residual_copies": residual_copies(s),
    });
    let mut bytes = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
    bytes.push(b'\n');
    let signature = pair.sign(&bytes);
    let manifest_path = beside(s.path, ".manifest.json");
    let sig_path = beside(s.path, ".sig");
    std::fs::write(&manifest_path, &bytes)
        .and_then(|()| std::fs::write(&sig_path, format!("{}\n", hex(signature.as_ref()))))
        .map_err(|e| {
            bad(format!(
                "cannot write the signature beside {}: {e}",
                s.path.display()
            ))
        })?;
    Ok((manifest_path, sig_path))
}

/// What `cohort verify --report` checked.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Verified {
    pub(crate) valid: bool,
    /// Why not, when not valid.
    pub(crate) problem: Option<String>,
    pub(crate) report: String,
    pub(crate) manifest: String,
    /// The manifest, when its signature verified.
    pub(crate) attests: Option<serde_json::Value>,
}

impl Verified {
    /// What the report is, as its signed manifest binds it: the lines a
    /// person reads after "the signature holds".
    pub(crate) fn summary(&self) -> Vec<String> {
        let Some(a) = &self.attests else {
            return Vec::new();
        };
        let text =
            |v: &serde_json::Value| v.as_str().map(str::to_owned).unwrap_or_else(|| "-".into());
        let mut out = vec![
            format!("file: {}", text(&a["report_file"])),
            format!(
                "period: {} to {}",
                text(&a["period"]["from"]),
                text(&a["period"]["to"])
            ),
            format!("tenant: {}", a["tenant"].as_str().unwrap_or("all tenants")),
            format!("policy file sha256: {}", text(&a["policy_file_sha256"])),
            format!("chain head: {}", text(&a["chain"]["head"])),
        ];
        if a["signed_broken_chain"] == true {
            out.push(format!(
                "signed although the ledger's chain did not verify ({} break(s); first: {})",
                a["chain"]["breaks"],
                text(&a["chain"]["first_break"])
            ));
        }
        out
    }
}

/// A tenant as the report compares it offline (no database to ask the
/// tenant column's type): a UUID in any spelling Cohort accepts (braced,
/// upper case, without hyphens) is its canonical text; anything else is
/// compared as written.
fn same_spelling(tenant: &str) -> String {
    uuid::Uuid::parse_str(tenant.trim())
        .map(|u| u.to_string())
        .unwrap_or_else(|_| tenant.to_owned())
}

/// What the verifier expects the report to be (`--period`, `--tenant`).
#[derive(Debug, Default)]
pub(crate) struct Expected {
    period: Option<(chrono::NaiveDate, chrono::NaiveDate)>,
    tenant: Option<String>,
}

impl Expected {
    /// `--period FROM..TO` (dates) and `--tenant T`.
    pub(crate) fn parse(period: Option<&str>, tenant: Option<&str>) -> Result<Self, Failure> {
        let period = period
            .map(|p| {
                let (from, to) = p.split_once("..").ok_or_else(|| {
                    bad(format!(
                        "--period {p:?}: write it FROM..TO, as 2026-01-01..2026-03-31"
                    ))
                })?;
                let day = |d: &str| {
                    chrono::NaiveDate::parse_from_str(d.trim(), "%Y-%m-%d").map_err(|e| {
                        bad(format!(
                            "--period {p:?}: {d:?} is not a date (YYYY-MM-DD): {e}"
                        ))
                    })
                };
                Ok::<_, Failure>((day(from)?, day(to)?))
            })
            .transpose()?;
        Ok(Self {
            period,
            tenant: tenant.map(str::to_owned),
        })
    }

    /// Why a signed manifest is not of the period and tenant expected.
    /// `None` when it is, or when nothing is expected.
    fn unlike(&self, attests: &serde_json::Value) -> Option<String> {
        if let Some((from, to)) = self.period {
            let period = (
                attests["period"]["from"].as_str().map(str::to_owned),
                attests["period"]["to"].as_str().map(str::to_owned),
            );
            let signed_period = (Some(from.to_string()), Some(to.to_string()));
            if signed_period != period {
                return Some(format!(
                    "the report is of {} to {}, not {from} to {to}",
                    period.0.as_deref().unwrap_or("-"),
                    period.1.as_deref().unwrap_or("-")
                ));
            }
        }
        if let Some(t) = &self.tenant {
            let tenant = attests["tenant"].as_str();
            if tenant.map(same_spelling) != Some(same_spelling(t)) {
                return Some(format!(
                    "the report is of {}, not of tenant {t}",
                    tenant
                        .map(|t| format!("tenant {t}"))
                        .unwrap_or_else(|| "all tenants".into())
                ));
            }
        }
        None
    }
}

/// Reads a file of hexadecimal text (a signature, a key): its bytes.
fn read_hex(path: &Path, what: &str) -> Result<Vec<u8>, Failure> {
    let text = String::from_utf8(read(path, what)?)
        .map_err(|_| bad(format!("{} is not a {what} file", path.display())))?;
    unhex(&text, what, path)
}

/// The signature and the public key `cohort verify --report` is given,
/// read and checked for form.
fn signature_and_key(signature: &Path, public_key: &Path) -> Result<(Vec<u8>, Vec<u8>), Failure> {
    let sig = read_hex(signature, "signature")?;
    let key = read_hex(public_key, "public key")?;
    if key.len() != 32 {
        return Err(bad(format!(
            "{} is not an Ed25519 public key (32 bytes; cohort keys generate writes one)",
            public_key.display()
        )));
    }
    Ok((sig, key))
}

/// A manifest whose signature holds, parsed: `Err` when it is not JSON or
/// not a [`MANIFEST_FORMAT`] manifest.
fn signed_manifest(manifest: &[u8], manifest_path: &Path) -> Result<serde_json::Value, Failure> {
    let attests: serde_json::Value = serde_json::from_slice(manifest).map_err(|e| {
        bad(format!(
            "{} is signed but not JSON: {e}",
            manifest_path.display()
        ))
    })?;
    if attests["format"] != MANIFEST_FORMAT {
        return Err(bad(format!(
            "{} is signed but not a {MANIFEST_FORMAT} manifest",
            manifest_path.display()
        )));
    }
    Ok(attests)
}

/// Why a report is not the one its signed manifest names: its SHA-256
/// differs, or it is presented under another file name. `None` when it is.
fn unlike_signed(report: &Path, bytes: &[u8], attests: &serde_json::Value) -> Option<String> {
    let digest = hex(&Sha256::digest(bytes));
    let signed = attests["report_sha256"].as_str().unwrap_or_default();
    if digest != signed {
        return Some(format!(
            "{} was changed after signing: its SHA-256 is {digest}, the signed manifest's {signed}",
            report.display()
        ));
    }
    // The manifest binds the file's name: a report signed as q2.html and
    // presented as q1.html is another report.
    let named = attests["report_file"].as_str().map(str::to_owned);
    let file = report.file_name().map(|n| n.to_string_lossy().into_owned());
    if named != file {
        return Some(format!(
            "the signed manifest is of {}, not {}: this is another report presented under its name",
            named.as_deref().unwrap_or("no file"),
            file.as_deref().unwrap_or("-")
        ));
    }
    None
}

/// Checks a signed report offline: the signature over the manifest with
/// the public key, then the report's digest against the manifest's.
/// `Err` only for bad input (a file missing or not what it should be).
pub(crate) fn verify(
    report: &Path,
    signature: &Path,
    public_key: &Path,
    expected: &Expected,
) -> Result<Verified, Failure> {
    let manifest_path = beside(report, ".manifest.json");
    let report_bytes = read(report, "report")?;
    let manifest = read(&manifest_path, "manifest")?;
    let (sig, key) = signature_and_key(signature, public_key)?;
    let mut out = Verified {
        valid: false,
        problem: None,
        report: report.display().to_string(),
        manifest: manifest_path.display().to_string(),
        attests: None,
    };
    if UnparsedPublicKey::new(&ED25519, &key)
        .verify(&manifest, &sig)
        .is_err()
    {
        out.problem = Some(format!(
            "the signature does not verify: {} was changed after signing, or was signed with another key",
            manifest_path.display()
        ));
        return Ok(out);
    }
    let attests = signed_manifest(&manifest, &manifest_path)?;
    out.problem =
        unlike_signed(report, &report_bytes, &attests).or_else(|| expected.unlike(&attests));
    out.valid = out.problem.is_none();
    out.attests = Some(attests);
    Ok(out)
}

/// `cohort verify` (no `--report`): walks the ledger's hash chain; exit 0
/// intact, 1 broken (the first broken record named), 2 bad input.
pub(crate) async fn verify_chain(
    cohort: &cohort::Cohort,
    json: bool,
    expected: Option<cohort::chain::ExpectedHead>,
    with_policy: bool,
) -> Result<(), Failure> {
    let report = if with_policy {
        cohort.verify_chain(expected).await?
    } else {
        cohort.verify_chain_without_policy(expected).await?
    };
    if json {
        crate::output::print_json(&serde_json::to_value(&report).expect("the report serialises"));
    } else {
        print_chain(&report);
    }
    if report.intact {
        Ok(())
    } else {
        Err(Failure::Status(1))
    }
}

/// `cohort verify`'s text: what was walked, then the verdict (a break on
/// standard error).
fn print_chain(report: &cohort::chain::ChainReport) {
    let head = report
        .head
        .as_ref()
        .map(|h| h.spelling())
        .unwrap_or_else(|| "-".into());
    outln!(
        "{} links walked, {} records compared, {} pruned under a checkpoint; head {head}.",
        report.links,
        report.records_checked,
        report.records_pruned
    );
    if report.runs_before_chain > 0 {
        outln!(
            "{} runs were settled before the chain started: they are outside it.",
            report.runs_before_chain
        );
    }
    if report.holds_outside_chain > 0 {
        outln!(
            "{} holds were written outside the library (raw SQL, COPY) or before the chain started: they keep rows, and are not in the chain.",
            report.holds_outside_chain
        );
    }
    print_checkpoints(report);
    if let Some(from) = report.keyed_from {
        outln!(
            "Keyed from link {from}: {}.",
            if report.macs_checked {
                "every link's MAC was checked"
            } else {
                "MACs not checked (no COHORT_LEDGER_KEY)"
            }
        );
    }
    for w in &report.warnings {
        eprintln!("cohort: warning: {w}");
    }
    print_verdict(report);
}

/// One line per pruner's checkpoint: its link and what it pruned.
fn print_checkpoints(report: &cohort::chain::ChainReport) {
    for c in &report.checkpoints {
        let cut = |t: &Option<chrono::DateTime<chrono::Utc>>| {
            t.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into())
        };
        outln!(
            "checkpoint link {} at {}: {} links pruned (succeeded runs before {}, failed runs before {}, inactive holds before {}).",
            c.link_id,
            c.linked_at.to_rfc3339(),
            c.links,
            cut(&c.succeeded_before),
            cut(&c.failed_before),
            cut(&c.holds_before)
        );
    }
}

/// "The chain is intact.", or the first break and how many follow it on
/// standard error.
fn print_verdict(report: &cohort::chain::ChainReport) {
    match report.first_break() {
        None => outln!("The chain is intact."),
        Some(first) => {
            eprintln!("cohort: the chain is broken at {first}");
            let more = report.breaks.len() - 1;
            if more > 0 || report.more_breaks {
                eprintln!(
                    "cohort: {}{more} more after it (--json lists them)",
                    if report.more_breaks { "over " } else { "" }
                );
            }
        }
    }
}
