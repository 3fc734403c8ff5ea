//! Output targets: a file or stdout, opened lazily when asked to.

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;

/// Where one output stream goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// A file, created or truncated when opened.
    File(PathBuf),
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl OutputTarget {
    /// `-` means stdout.
    pub fn parse(s: &str) -> OutputTarget {
        if s == "-" {
            OutputTarget::Stdout
        } else {
            OutputTarget::File(PathBuf::from(s))
        }
    }

    /// How the target is named in messages: the path, `stdout` or `stderr`.
    pub fn display_name(&self) -> String {
        match self {
            OutputTarget::File(p) => p.display().to_string(),
            OutputTarget::Stdout => "stdout".to_string(),
            OutputTarget::Stderr => "stderr".to_string(),
        }
    }

    /// Opens the target for writing (a file is created or truncated).
    pub fn open(&self) -> io::Result<Box<dyn Write + Send>> {
        Ok(match self {
            OutputTarget::File(p) => Box::new(File::create(p)?),
            OutputTarget::Stdout => Box::new(io::stdout()),
            OutputTarget::Stderr => Box::new(io::stderr()),
        })
    }
}
