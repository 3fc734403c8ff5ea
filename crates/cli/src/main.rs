//! The `sessionizer` binary: parse arguments, run, report.
//!
//! Exit codes: 0 success; 1 the run failed (unreadable input, unwritable output, an
//! invalid record with `--on-invalid fail`); 2 bad options or config file.

use anyhow::Context;
use clap::Parser;
use sessionizer::pipeline::{self, RunError};
use sessionizer_cli::args::{Cli, Command, ProgressArg};
use sessionizer_cli::config;
use sessionizer_cli::progress::Progress;
use std::io::{ErrorKind, Write};
use std::process::ExitCode;

/// Sessions are created and dropped at a high rate, often by another thread than the
/// one that reads the input: mimalloc's thread-local free lists handle that pattern much
/// better than the system allocator (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
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
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sessionizer: {e:#}");
            ExitCode::from(1)
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
    let progress = Progress::new(cfg.progress == ProgressArg::Auto);
    let result = pipeline::run_with(&cfg.pipeline, cfg.checkpoint.as_ref(), &progress);
    progress.finish();
    let stats = match result {
        Ok(stats) => stats,
        Err(RunError::Output(e)) if e.source.kind() == ErrorKind::BrokenPipe => {
            // A closed stdout pipe (`| head`) ends the run quietly.
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sessionizer: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!("{}", stats.summary(&cfg.pipeline.output.display_name()));
    if let Some(path) = &cfg.stats_file {
        let written = serde_json::to_vec_pretty(&stats)
            .context("encoding the stats")
            .and_then(|mut json| {
                json.push(b'\n');
                std::fs::write(path, json)
                    .with_context(|| format!("cannot write the stats file {}", path.display()))
            });
        if let Err(e) = written {
            eprintln!("sessionizer: {e:#}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

fn generate(args: &sessionizer_cli::generate::GenerateArgs) -> ExitCode {
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
