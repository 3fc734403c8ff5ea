//! The `sessionizer` binary: parse arguments, run, report.
//!
//! Exit codes: 0 success; 1 the run failed (unreadable input, unwritable output, an
//! invalid record with `--on-invalid fail`); 2 bad options or config file.

use anyhow::Context;
use clap::Parser;
use sessionizer::pipeline::{self, RunError};
use sessionizer::telemetry::Telemetry;
use sessionizer_cli::args::{Cli, Command, ProgressArg};
use sessionizer_cli::config;
use sessionizer_cli::progress::Progress;
use std::io::{ErrorKind, IsTerminal, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Sessions are created and dropped at a high rate, often by another thread than the
/// one that reads the input: mimalloc's thread-local free lists handle that pattern much
/// better than the system allocator (see BENCHMARKS.md). Built without transparent huge
/// pages (the `no_thp` feature): resident memory then follows the state.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Logs (`RUST_LOG=sessionizer=info`) are events with fields on stderr; colours only
    // on a terminal, so that a log file or collector gets plain text. Unset, only
    // errors are logged — but not the "run failed" event, whose error the binary
    // prints itself (once) — and a Kafka job's waits for its cluster.
    let filter = match std::env::var_os("RUST_LOG") {
        Some(_) => tracing_subscriber::EnvFilter::from_default_env(),
        None => tracing_subscriber::EnvFilter::new(format!(
            "error,{}=info,sessionizer::telemetry=off",
            sessionizer::telemetry::OUTAGE_TARGET
        )),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Generate(args) => generate(&args),
        Command::Inspect(args) => inspect(&args),
    }
}

fn inspect(args: &sessionizer_cli::args::InspectArgs) -> ExitCode {
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::new(stdout);
    let result = sessionizer_cli::inspect::inspect(args, &mut out).and_then(|()| {
        out.flush()?;
        Ok(())
    });
    exit_code(result)
}

/// 0 on success and when stdout was closed early (`| head`), else the error and 1.
fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sessionizer: {}", message(&e));
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == ErrorKind::BrokenPipe)
    })
}

/// The error and its causes, each said once: a message that already quotes its cause
/// (as many error types do) is not followed by that cause again.
fn message(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    // A client's error may quote a property it was given: never a secret one.
    sessionizer_connectors::secrets::redact(&text).into_owned()
}

/// The `--stats-file`, opened (created when missing, not yet truncated) before the run,
/// so that a path that cannot be written is reported before any work.
struct StatsFile {
    path: PathBuf,
    file: std::fs::File,
    /// Whether this run created it (then a run that fails removes it again).
    created: bool,
}

impl StatsFile {
    fn open(path: &Path) -> anyhow::Result<StatsFile> {
        let fail = |e: std::io::Error| match e.kind() {
            ErrorKind::ResourceBusy => {
                anyhow::anyhow!("cannot write the stats file {}: {e}", path.display())
            }
            _ => anyhow::anyhow!(
                "cannot write the stats file {}: {e}; give a --stats-file path in a writable directory",
                path.display()
            ),
        };
        let created = !path.exists();
        // Locked before the run starts, so that a second run naming the same file is
        // refused at once; its content is replaced only when the run ends.
        let file = sessionizer_connectors::output::open_locked(path, false).map_err(fail)?;
        Ok(StatsFile {
            path: path.to_path_buf(),
            file,
            created,
        })
    }

    fn write(mut self, stats: &sessionizer::stats::RunStats) -> anyhow::Result<()> {
        let mut json = serde_json::to_vec_pretty(stats).context("encoding the stats")?;
        json.push(b'\n');
        let regular = self.file.metadata().is_ok_and(|m| m.is_file());
        let written = (|| {
            if regular {
                self.file.set_len(0)?;
                self.file.rewind()?;
            }
            self.file.write_all(&json)?;
            self.file.flush()
        })();
        written.with_context(|| format!("cannot write the stats file {}", self.path.display()))
    }

    /// The run failed: leave no empty stats file behind as if it had succeeded.
    fn abandon(self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn run(args: sessionizer_cli::args::RunArgs) -> ExitCode {
    let cfg = match config::resolve(args) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("sessionizer: {e}");
            return ExitCode::from(2);
        }
    };
    let stats_file = match cfg.stats_file.as_deref().map(StatsFile::open).transpose() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("sessionizer: {}", message(&e));
            return ExitCode::from(1);
        }
    };
    let progress = Progress::new(cfg.progress == ProgressArg::Auto);
    let telemetry = Telemetry::new(progress.clone());
    if let Some(addr) = cfg.http_addr {
        match sessionizer_cli::http::serve(addr, telemetry.clone()) {
            // One line that scripts (and tests) can read the chosen port from.
            Ok(server) => eprintln!("sessionizer: http listening on {}", server.addr()),
            Err(e) => {
                eprintln!(
                    "sessionizer: cannot serve HTTP on {addr} (--http-addr): {e}; choose another address or port (port 0 picks a free one)"
                );
                if let Some(f) = stats_file {
                    f.abandon();
                }
                return ExitCode::from(1);
            }
        }
    }
    // SIGTERM or SIGINT (Ctrl-C) asks the run to stop between two batches: a Kafka
    // job commits what it did and leaves the group; a file or stdin run writes out
    // what it processed (with --state-dir a checkpoint, so the same command resumes)
    // and its stats file. A second signal ends the process at once.
    let kafka_source = cfg.pipeline.kafka.as_ref().is_some_and(|k| k.is_source());
    {
        let flag = telemetry.stop_flag();
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            let registered =
                signal_hook::flag::register_conditional_shutdown(signal, 1, flag.clone())
                    .and_then(|_| signal_hook::flag::register(signal, flag.clone()));
            if let Err(e) = registered {
                eprintln!("sessionizer: cannot handle signal {signal}: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let result = pipeline::run_with(&cfg.pipeline, cfg.checkpoint.as_ref(), &telemetry);
    progress.finish();
    let stats = match result {
        // A file or stdin run stopped by a signal did not read its input to the end:
        // not a success, but its stats file tells how far it got.
        Ok(stats) if stats.stopped && !kafka_source => {
            eprintln!("{}", stats.summary(&cfg.pipeline.output.display_name()));
            eprintln!(
                "sessionizer: stopped by a signal before the end of the input; the outputs hold what was processed until then{}",
                if cfg.checkpoint.is_some() {
                    " (checkpointed: the same command resumes from there)"
                } else {
                    ""
                }
            );
            return match stats_file.map(|f| f.write(&stats)) {
                Some(Err(e)) => {
                    eprintln!("sessionizer: {}", message(&e));
                    ExitCode::from(1)
                }
                _ => ExitCode::from(1),
            };
        }
        Ok(stats) => {
            let output = match cfg
                .pipeline
                .kafka
                .as_ref()
                .and_then(|k| k.output_topic.as_ref())
            {
                Some(topic) => format!("Kafka topic {topic}"),
                None => cfg.pipeline.output.display_name(),
            };
            eprintln!("{}", stats.summary(&output));
            stats
        }
        // A closed stdout pipe (`| head`) ends the run quietly; the stats file still
        // tells how far it got.
        Err(RunError::OutputClosed { stats, .. }) => *stats,
        Err(e) => {
            let text = sessionizer_connectors::secrets::redact(&e.to_string()).into_owned();
            eprintln!("sessionizer: {text}");
            // The stats file tells how far a failed run got, and why it stopped; one
            // that failed before it started leaves none.
            match (stats_file, e.stats()) {
                (Some(f), Some(stats)) => {
                    let mut stats = stats.clone();
                    stats.error = Some(text);
                    if let Err(e) = f.write(&stats) {
                        eprintln!("sessionizer: {}", message(&e));
                    }
                }
                (Some(f), None) => f.abandon(),
                (None, _) => {}
            }
            return ExitCode::from(1);
        }
    };
    if let Some(f) = stats_file
        && let Err(e) = f.write(&stats)
    {
        eprintln!("sessionizer: {}", message(&e));
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

fn generate(args: &sessionizer_cli::generate::GenerateArgs) -> ExitCode {
    if let (Some(topic), Some(brokers)) = (&args.kafka_topic, &args.kafka_brokers) {
        let result = sessionizer_cli::kafka::generate_into(args, brokers, topic);
        return exit_code(result.map(|report| {
            eprintln!(
                "sessionizer: generated {} events ({} late), {} duplicate lines, {} invalid lines into Kafka topic {topic}",
                report.events, report.late, report.duplicates, report.invalid
            );
        }));
    }
    let result = match &args.output {
        path if path.as_os_str() != "-" => std::fs::File::create(path)
            .with_context(|| format!("cannot create {}", path.display()))
            .and_then(|mut f| {
                let report = sessionizer_cli::generate::generate(args, &mut f)?;
                f.flush()?;
                Ok(report)
            }),
        _ => {
            let mut out = std::io::stdout().lock();
            sessionizer_cli::generate::generate(args, &mut out).map_err(anyhow::Error::from)
        }
    };
    exit_code(result.map(|report| {
        eprintln!(
            "sessionizer: generated {} events ({} late), {} duplicate lines, {} invalid lines",
            report.events, report.late, report.duplicates, report.invalid
        );
    }))
}
