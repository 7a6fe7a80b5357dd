//! Errors of the faces as HTTP statuses with a JSON body naming the field.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::body::ErrorOut;
use crate::bank::BankError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            field: None,
        }
    }

    pub fn bad_field(field: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            field: Some(field.to_string()),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// A bank error, with the request field it concerns (`field` is the
    /// name the caller used for the input it came from).
    pub fn from_bank(e: BankError, field: &str) -> ApiError {
        let (status, field) = classify(&e, field);
        ApiError {
            status,
            message: e.to_string(),
            field,
        }
    }
}

/// Status and blamed field of a bank error.
fn classify(e: &BankError, field: &str) -> (StatusCode, Option<String>) {
    let named = |status| (status, Some(field_of(e, field).to_string()));
    match e {
        BankError::UnknownTree { .. } => named(StatusCode::NOT_FOUND),
        // Named: an unknown node may be a parent to attach to or one of
        // many ids, not only the one in the path.
        BankError::UnknownNode(_) => named(StatusCode::NOT_FOUND),
        BankError::AlreadyConsolidated { .. } | BankError::DuplicateExternalId { .. } => named(StatusCode::CONFLICT),
        BankError::DimensionMismatch { .. }
        | BankError::BadEmbedding(_)
        | BankError::WrongTree { .. }
        | BankError::EmptyScenario
        | BankError::PayloadTooLarge { .. }
        | BankError::BadExternalId { .. }
        | BankError::DuplicateInWrite { .. }
        | BankError::BadConfig(_)
        | BankError::BadQueryOption(_)
        | BankError::NotConsolidatable { .. }
        | BankError::TransactionTooLarge { .. }
        | BankError::Tree(_) => named(StatusCode::BAD_REQUEST),
        // An item of an insert batch: its own field, else its parent (an
        // unknown node in an insert is the one it attaches to). Of other
        // batches (ids) the position is the change's, not the id's.
        BankError::BatchItem { position, error } if field == "nodes" => {
            let (status, inner) = classify(error, "attach");
            (status, inner.map(|f| format!("nodes[{position}].{f}")))
        }
        BankError::BatchItem { error, .. } => classify(error, field),
        BankError::Poisoned(_) | BankError::ReadOnly(_) => (StatusCode::SERVICE_UNAVAILABLE, None),
        // Another process's writer lock, held past the wait (`deltamem mcp`).
        e if e.is_locked() => (StatusCode::SERVICE_UNAVAILABLE, None),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
    }
}

/// The request field an input error is about.
fn field_of<'a>(e: &BankError, default: &'a str) -> &'a str {
    match e {
        BankError::DimensionMismatch { .. } | BankError::BadEmbedding(_) => "embedding",
        BankError::EmptyScenario => "scenario",
        BankError::PayloadTooLarge { .. } => "payload",
        BankError::BadExternalId { .. }
        | BankError::DuplicateExternalId { .. }
        | BankError::DuplicateInWrite { .. } => "id",
        BankError::WrongTree { .. } | BankError::UnknownTree { .. } => "tree",
        BankError::BadQueryOption(m) if m.starts_with("tau") => "tau",
        BankError::BadQueryOption(m) if m.starts_with("eps") => "eps",
        _ => default,
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{} (field {field})", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Carried through the agent layer (`AgentError::Store`) and back.
impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorOut {
            error: self.message,
            field: self.field,
        };
        (self.status, axum::Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
