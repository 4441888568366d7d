//! Errors that point at the exact document and field a user has to fix.

use std::fmt;

/// Field name used when a problem concerns a whole document rather than one field.
pub const WHOLE_DOCUMENT: &str = "(document)";

/// One problem in a manifest: which document, which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{document}: {field}: {reason}")]
pub struct FieldError {
    /// E.g. `line3.yaml document 2 (Link/a-b)`.
    pub document: String,
    /// Path inside the document, e.g. `spec.endpoints[1]`.
    pub field: String,
    /// What is wrong, in words a user can act on.
    pub reason: String,
}

impl FieldError {
    pub fn new(
        document: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        FieldError {
            document: document.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Every problem found, in document order; displayed one per line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl ValidationErrors {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, FieldError> {
        self.0.iter()
    }

    pub(crate) fn push(
        &mut self,
        document: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) {
        self.0.push(FieldError::new(document, field, reason));
    }

    /// `Ok(value)` when nothing was found, so callers can end with `errors.into_result(x)`.
    pub(crate) fn into_result<T>(self, value: T) -> Result<T, ValidationErrors> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}

impl IntoIterator for ValidationErrors {
    type Item = FieldError;
    type IntoIter = std::vec::IntoIter<FieldError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a ValidationErrors {
    type Item = &'a FieldError;
    type IntoIter = std::slice::Iter<'a, FieldError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
