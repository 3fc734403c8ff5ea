//! The command line as a function: `sessionizer ARGS...` parsed and run, as the binary
//! does (`main.rs` is only this and its allocator), and as the Python package's
//! `python -m sessionizer` and its jobs do in the interpreter's process.
//!
//! Exit codes: 0 success; 1 the run failed (unreadable input, unwritable output, an
//! invalid record with `--on-invalid fail`); 2 bad options or config file.

use crate::args::{Cli, Command, ProgressArg, RunArgs};
use crate::config;
use crate::progress::Progress;
use anyhow::Context;
use clap::Parser;
use sessionizer::pipeline::{self, RunError};
use sessionizer::stats::RunStats;
use sessionizer::telemetry::Telemetry;
use std::ffi::OsString;
use std::io::{ErrorKind, IsTerminal, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// How a run of the command line behaves in its process.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// SIGTERM and SIGINT ask the run to stop between two batches (a second one ends
    /// the process): the binary's behaviour. A host process with handlers of its own
    /// (a Python interpreter) leaves them alone.
    pub signals: bool,
    /// Set by the host to ask the run to stop between two batches, as a signal would.
    pub stop: Option<Arc<AtomicBool>>,
    /// The run's summary goes to stderr at its end (the binary's); a host that takes
    /// the statistics back may leave it out.
    pub summary: bool,
}

impl RunOptions {
    /// The binary's options: signals stop the run.
    pub fn binary() -> RunOptions {
        RunOptions {
            signals: true,
            stop: None,
            summary: true,
        }
    }
}

/// Why a run failed: the exit code the binary gives, and what it says.
#[derive(Debug, Clone)]
pub struct Failure {
    /// 1 for a failed run, 2 for bad options.
    pub code: u8,
    /// What went wrong, secrets hidden (the binary prints it after `sessionizer: `).
    pub message: String,
    /// How far the run got, when it started.
    pub stats: Option<Box<RunStats>>,
}

/// Sets up the logs once per process. Logs (`RUST_LOG=sessionizer=info`) are events with
/// fields on stderr; colours only on a terminal, so that a log file or collector gets
/// plain text. Unset, only errors are logged — but not the "run failed" event, whose
/// error the binary prints itself (once) — and a Kafka job's waits for its cluster.
fn init_logs() {
    let filter = match std::env::var_os("RUST_LOG") {
        Some(_) => tracing_subscriber::EnvFilter::from_default_env(),
        None => tracing_subscriber::EnvFilter::new(format!(
            "error,{}=info,sessionizer::telemetry=off",
            sessionizer::telemetry::OUTAGE_TARGET
        )),
    };
    // A second call in one process (a Python job after another) keeps the first set-up.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Runs the command line on `args` (the program name first, as `std::env::args_os`
/// gives them) and returns its exit code.
pub fn main<I, T>(args: I, options: RunOptions) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    init_logs();
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    match cli.command {
        Command::Run(args) => match run(*args, options) {
            Ok(_) => 0,
            Err(f) => {
                if !f.message.is_empty() {
                    eprintln!("sessionizer: {}", f.message);
                }
                f.code
            }
        },
        Command::Generate(args) => generate(&args),
        Command::Inspect(args) => inspect(&args),
    }
}

/// Runs `sessionizer run ARGS...` (`args` without the program name and `run`): the
/// run's summary goes to stderr as the binary prints it; its statistics come back.
pub fn run_args<I, T>(args: I, options: RunOptions) -> Result<RunStats, Failure>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    init_logs();
    let argv: Vec<OsString> = ["sessionizer".into(), "run".into()]
        .into_iter()
        .chain(args.into_iter().map(Into::into))
        .collect();
    let cli = Cli::try_parse_from(argv).map_err(|e| Failure {
        code: 2,
        message: e
            .to_string()
            .trim_end()
            .trim_start_matches("error: ")
            .to_string(),
        stats: None,
    })?;
    match cli.command {
        Command::Run(args) => run(*args, options),
        _ => unreachable!("the arguments start with `run`"),
    }
}

fn inspect(args: &crate::args::InspectArgs) -> u8 {
    let stdout = std::io::stdout().lock();
    let mut out = std::io::BufWriter::new(stdout);
    let result = crate::inspect::inspect(args, &mut out).and_then(|()| {
        out.flush()?;
        Ok(())
    });
    exit_code(result)
}

/// 0 on success and when stdout was closed early (`| head`), else the error and 1.
fn exit_code(result: anyhow::Result<()>) -> u8 {
    match result {
        Ok(()) => 0,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            eprintln!("sessionizer: {}", message(&e));
            1
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

    fn write(mut self, stats: &RunStats) -> anyhow::Result<()> {
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

/// Runs one `sessionizer run`: the summary on stderr, the statistics back (also written
/// to `--stats-file`).
fn run(args: RunArgs, options: RunOptions) -> Result<RunStats, Failure> {
    let fail = |code, message: String| Failure {
        code,
        message,
        stats: None,
    };
    let cfg = config::resolve(args).map_err(|e| fail(2, e.to_string()))?;
    let stats_file = cfg
        .stats_file
        .as_deref()
        .map(StatsFile::open)
        .transpose()
        .map_err(|e| fail(1, message(&e)))?;
    let progress = Progress::new(cfg.progress == ProgressArg::Auto);
    let telemetry = match options.stop {
        Some(stop) => Telemetry::with_stop(progress.clone(), stop),
        None => Telemetry::new(progress.clone()),
    };
    if let Some(addr) = cfg.http_addr {
        match crate::http::serve(addr, telemetry.clone()) {
            // One line that scripts (and tests) can read the chosen port from.
            Ok(server) => eprintln!("sessionizer: http listening on {}", server.addr()),
            Err(e) => {
                if let Some(f) = stats_file {
                    f.abandon();
                }
                return Err(fail(
                    1,
                    format!(
                        "cannot serve HTTP on {addr} (--http-addr): {e}; choose another address or port (port 0 picks a free one)"
                    ),
                ));
            }
        }
    }
    // SIGTERM or SIGINT (Ctrl-C) asks the run to stop between two batches: a Kafka
    // job commits what it did and leaves the group; a file or stdin run writes out
    // what it processed (with --state-dir a checkpoint, so the same command resumes)
    // and its stats file. A second signal ends the process at once.
    let kafka_source = cfg.pipeline.kafka.as_ref().is_some_and(|k| k.is_source());
    if options.signals {
        let flag = telemetry.stop_flag();
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register_conditional_shutdown(signal, 1, flag.clone())
                .and_then(|_| signal_hook::flag::register(signal, flag.clone()))
                .map_err(|e| fail(1, format!("cannot handle signal {signal}: {e}")))?;
        }
    }
    let result = pipeline::run_with(&cfg.pipeline, cfg.checkpoint.as_ref(), &telemetry);
    progress.finish();
    let stats = match result {
        // A file or stdin run stopped by a signal did not read its input to the end:
        // not a success, but its stats file tells how far it got.
        Ok(stats) if stats.stopped && !kafka_source => {
            if options.summary {
                eprintln!("{}", stats.summary(&cfg.pipeline.output.display_name()));
            }
            let mut message = format!(
                "stopped by a signal before the end of the input; the outputs hold what was processed until then{}",
                if cfg.checkpoint.is_some() {
                    " (checkpointed: the same command resumes from there)"
                } else {
                    ""
                }
            );
            if let Some(Err(e)) = stats_file.map(|f| f.write(&stats)) {
                message.push_str(&format!("\nsessionizer: {}", self::message(&e)));
            }
            return Err(Failure {
                code: 1,
                message,
                stats: Some(Box::new(stats)),
            });
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
            if options.summary {
                eprintln!("{}", stats.summary(&output));
            }
            stats
        }
        // A closed stdout pipe (`| head`) ends the run quietly; the stats file still
        // tells how far it got.
        Err(RunError::OutputClosed { stats, .. }) => *stats,
        Err(e) => {
            let mut text = sessionizer_connectors::secrets::redact(&e.to_string()).into_owned();
            // The stats file tells how far a failed run got, and why it stopped; one
            // that failed before it started leaves none.
            let stats = e.stats().cloned();
            match (stats_file, &stats) {
                (Some(f), Some(stats)) => {
                    let mut stats = stats.clone();
                    stats.error = Some(text.clone());
                    if let Err(e) = f.write(&stats) {
                        text.push_str(&format!("\nsessionizer: {}", message(&e)));
                    }
                }
                (Some(f), None) => f.abandon(),
                (None, _) => {}
            }
            return Err(Failure {
                code: 1,
                message: text,
                stats: stats.map(Box::new),
            });
        }
    };
    if let Some(f) = stats_file {
        f.write(&stats).map_err(|e| Failure {
            code: 1,
            message: message(&e),
            stats: Some(Box::new(stats.clone())),
        })?;
    }
    Ok(stats)
}

fn generate(args: &crate::generate::GenerateArgs) -> u8 {
    if let (Some(topic), Some(brokers)) = (&args.kafka_topic, &args.kafka_brokers) {
        let result = crate::kafka::generate_into(args, brokers, topic);
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
                let report = crate::generate::generate(args, &mut f)?;
                f.flush()?;
                Ok(report)
            }),
        _ => {
            let mut out = std::io::stdout().lock();
            crate::generate::generate(args, &mut out).map_err(anyhow::Error::from)
        }
    };
    exit_code(result.map(|report| {
        eprintln!(
            "sessionizer: generated {} events ({} late), {} duplicate lines, {} invalid lines",
            report.events, report.late, report.duplicates, report.invalid
        );
    }))
}
