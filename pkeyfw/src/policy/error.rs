//! Policy errors that point at the file, line and field at fault.

use std::{fmt, path::Path};

/// A refused policy: where, which field, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub file: String,
    /// 1-based line and column; 0 when the error is about the whole file.
    pub line: usize,
    pub column: usize,
    /// The field at fault, e.g. `qp[2].pkey`.
    pub field: String,
    pub message: String,
}

impl PolicyError {
    pub fn io(path: &Path, err: &std::io::Error) -> PolicyError {
        PolicyError {
            file: path.display().to_string(),
            line: 0,
            column: 0,
            field: String::new(),
            message: format!("cannot read the policy: {err}"),
        }
    }

    /// An error at byte offset `at` of `text`.
    pub fn at(path: &Path, text: &str, at: usize, field: &str, message: String) -> PolicyError {
        let (line, column) = position(text, at);
        PolicyError {
            file: path.display().to_string(),
            line,
            column,
            field: field.to_string(),
            message,
        }
    }
}

/// 1-based line and column of byte offset `at` in `text`.
pub fn position(text: &str, at: usize) -> (usize, usize) {
    let before = &text[..at.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for PolicyError {}
