//! Errors of the faces as HTTP statuses with a JSON body naming the field.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::body::ErrorOut;
use crate::bank::{BankError, ErrorKind};

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
    match (e, e.kind()) {
        // An item of an insert batch: its own field, else its parent (an
        // unknown node in an insert is the one it attaches to). Of other
        // batches (ids) the position is the change's, not the id's.
        (BankError::BatchItem { position, error }, _) if field == "nodes" => {
            let (status, inner) = classify(error, "attach");
            (status, inner.map(|f| format!("nodes[{position}].{f}")))
        }
        (BankError::BatchItem { error, .. }, _) => classify(error, field),
        // No request names a path: the served bank itself has gone.
        (BankError::NotABank { .. }, _) => (StatusCode::INTERNAL_SERVER_ERROR, None),
        // Named: an unknown node may be a parent to attach to or one of
        // many ids, not only the one in the path.
        (_, ErrorKind::NotFound) => named(StatusCode::NOT_FOUND),
        (_, ErrorKind::Conflict) => named(StatusCode::CONFLICT),
        (_, ErrorKind::Invalid) => named(StatusCode::BAD_REQUEST),
        // Another process's writer lock, held past the wait (`deltamem mcp`).
        (_, ErrorKind::Locked | ErrorKind::ReadOnly | ErrorKind::Poisoned) => (StatusCode::SERVICE_UNAVAILABLE, None),
        (_, ErrorKind::Corrupt | ErrorKind::Io) => (StatusCode::INTERNAL_SERVER_ERROR, None),
    }
}

/// The request field an input error is about.
fn field_of<'a>(e: &BankError, default: &'a str) -> &'a str {
    match e {
        // A batch of queries keeps its own name (`embeddings`).
        BankError::DimensionMismatch { .. } | BankError::BadEmbedding(_) if default.starts_with("embedding") => default,
        BankError::DimensionMismatch { .. } | BankError::BadEmbedding(_) => "embedding",
        BankError::EmptyScenario => "scenario",
        // Blamed on whichever of the two is most of the size.
        BankError::PayloadTooLarge {
            size_bytes,
            scenario_bytes,
            ..
        } if scenario_bytes * 2 > *size_bytes => "scenario",
        BankError::PayloadTooLarge { .. } => "payload",
        BankError::BadExternalId { .. }
        | BankError::DuplicateExternalId { .. }
        | BankError::DuplicateInWrite { .. } => "id",
        BankError::WrongTree { .. } | BankError::UnknownTree { .. } => "tree",
        BankError::BadQueryOption(m) if m.starts_with("k ") => "k",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::TreeError;

    #[test]
    fn an_oversized_node_is_blamed_on_its_larger_part() {
        let too_large = |scenario_bytes| BankError::PayloadTooLarge {
            size_bytes: 5 << 20,
            scenario_bytes,
            limit_bytes: 4 << 20,
        };
        let field = |e| ApiError::from_bank(e, "nodes").field;
        assert_eq!(field(too_large(5 << 20)).as_deref(), Some("scenario"));
        assert_eq!(field(too_large(10)).as_deref(), Some("payload"));
        let bad = || BankError::BadEmbedding("its norm overflows".into());
        assert_eq!(
            ApiError::from_bank(bad(), "embeddings").field.as_deref(),
            Some("embeddings")
        );
        assert_eq!(ApiError::from_bank(bad(), "attach").field.as_deref(), Some("embedding"));
    }

    #[test]
    fn bank_errors_map_to_statuses_by_kind() {
        let cases: [(BankError, u16, Option<&str>); 5] = [
            (BankError::UnknownNode("7".into()), 404, Some("attach")),
            (
                BankError::DimensionMismatch { expected: 4, found: 3 },
                400,
                Some("embedding"),
            ),
            (
                BankError::DuplicateExternalId {
                    id: "a".into(),
                    existing: 1,
                },
                409,
                Some("id"),
            ),
            // Damage in the stored tree is the server's problem, not the
            // request's: it was a 400 before the kinds were shared.
            (
                BankError::Tree(TreeError::Inconsistent {
                    node: 3,
                    detail: "x".into(),
                }),
                500,
                None,
            ),
            (BankError::Poisoned("fsync".into()), 503, None),
        ];
        for (e, status, field) in cases {
            let what = e.to_string();
            let api = ApiError::from_bank(e, "attach");
            assert_eq!((api.status.as_u16(), api.field.as_deref()), (status, field), "{what}");
        }
        let nested = BankError::BatchItem {
            position: 2,
            error: Box::new(BankError::EmptyScenario),
        };
        let api = ApiError::from_bank(nested, "nodes");
        assert_eq!(
            (api.status.as_u16(), api.field.as_deref()),
            (400, Some("nodes[2].scenario"))
        );
    }
}
