//! `cohort-pgtemp`: run a command against a throw-away PostgreSQL server.
//!
//! ```text
//! cohort-pgtemp exec -- <cmd> [args...]   run <cmd> with DATABASE_URL set, forward its exit code
//! cohort-pgtemp serve                     print DATABASE_URL=<url>, run until SIGINT/SIGTERM/stdin EOF
//! ```

use std::io::Write as _;
use std::process::ExitCode;

use cohort_pgtemp::Cluster;
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "usage:
  cohort-pgtemp exec -- <cmd> [args...]
      Start a throw-away PostgreSQL cluster, run <cmd> with DATABASE_URL
      (and PG_TEMP_STARTED=1) set, stop the cluster, exit with <cmd>'s code.
      If DATABASE_URL is already set, just run <cmd>.
  cohort-pgtemp serve
      Start a cluster, print `DATABASE_URL=<url>` on stdout and keep running
      until SIGINT/SIGTERM or stdin is closed (stdin /dev/null is ignored).

  PG_BIN=<dir> selects the PostgreSQL binaries; RUST_LOG controls logging.";

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();

    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cohort-pgtemp: cannot start tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(run(args));
    // Exit without waiting for a blocked stdin reader thread.
    std::process::exit(code);
}

async fn run(args: Vec<String>) -> i32 {
    match args.first().map(String::as_str) {
        Some("exec") => {
            let rest = &args[1..];
            let cmd = match rest.first().map(String::as_str) {
                Some("--") => &rest[1..],
                _ => rest,
            };
            if cmd.is_empty() {
                eprintln!("cohort-pgtemp exec: missing command\n\n{USAGE}");
                return 2;
            }
            exec(cmd).await
        }
        Some("serve") if args.len() == 1 => serve().await,
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            0
        }
        _ => {
            eprintln!("{USAGE}");
            2
        }
    }
}

async fn exec(cmd: &[String]) -> i32 {
    let mut command = tokio::process::Command::new(&cmd[0]);
    command.args(&cmd[1..]);

    let cluster = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => {
            eprintln!("cohort-pgtemp: DATABASE_URL is already set; running the command against it");
            None
        }
        _ => match Cluster::start().await {
            Ok(cluster) => {
                command
                    .env("DATABASE_URL", cluster.url())
                    .env("PG_TEMP_STARTED", "1");
                Some(cluster)
            }
            Err(e) => {
                eprintln!("cohort-pgtemp: {e}");
                return 1;
            }
        },
    };

    let code = run_child(command, &cmd[0]).await;
    drop(cluster);
    code
}

async fn run_child(mut command: tokio::process::Command, name: &str) -> i32 {
    let (mut sigint, mut sigterm) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("cohort-pgtemp: cannot install signal handlers: {e}");
            return 1;
        }
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("cohort-pgtemp: cannot run {name}: {e}");
            return 127;
        }
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = sigint.recv() => forward_signal(child.id(), "INT").await,
            _ = sigterm.recv() => forward_signal(child.id(), "TERM").await,
        }
    };
    match status {
        Ok(status) => exit_code(status),
        Err(e) => {
            eprintln!("cohort-pgtemp: waiting for {name}: {e}");
            1
        }
    }
}

/// Forwards a signal to the child with the `kill` utility (no unsafe code).
async fn forward_signal(pid: Option<u32>, sig: &str) {
    if let Some(pid) = pid {
        let _ = tokio::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .await;
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

async fn serve() -> i32 {
    let (mut sigint, mut sigterm) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("cohort-pgtemp: cannot install signal handlers: {e}");
            return 1;
        }
    };
    let cluster = match Cluster::start().await {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("cohort-pgtemp: {e}");
            return 1;
        }
    };
    let mut stdout = std::io::stdout().lock();
    if writeln!(stdout, "DATABASE_URL={}", cluster.url())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        eprintln!("cohort-pgtemp: cannot write to stdout");
        return 1;
    }
    drop(stdout);

    let mut stdin_closed = stdin_watcher();
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
        _ = &mut stdin_closed => {}
    }
    drop(cluster);
    0
}

/// Resolves when stdin reaches EOF; never, if stdin is `/dev/null` (e.g. a
/// background job in a script), since that would stop the server at once.
fn stdin_watcher() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let is_dev_null = std::fs::read_link("/proc/self/fd/0")
        .map(|p| p == std::path::Path::new("/dev/null"))
        .unwrap_or(false);
    if is_dev_null {
        return Box::pin(std::future::pending());
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 1024];
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    Box::pin(async move {
        let _ = rx.await;
    })
}
