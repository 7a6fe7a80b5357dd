//! `POST /v1/retrieve` (feature `agent`): what the agent's `retrieve`
//! gives for a task and an environment, the same JSON as `deltamem
//! retrieve --json`. Thin: the agent library searches the server's own
//! bank handle with the embedding model the CLI would load.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::http::{AppState, JsonBody};
use crate::agent::memory_loop::{AgentError, Retrieval, retrieve_in};
use crate::agent::{AgentConfig, DomainProfile, OnnxEmbedder};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrieveRequest {
    task: String,
    env: String,
    /// Field descriptions and headers, as `retrieve --profile`.
    #[serde(default)]
    profile: Option<String>,
}

/// The embedding model, loaded on first use from the same settings as the
/// CLI (`DELTAMEM_ASSETS`, ...); one request embeds at a time.
static EMBEDDER: OnceLock<Mutex<OnnxEmbedder>> = OnceLock::new();

fn embedder() -> ApiResult<&'static Mutex<OnnxEmbedder>> {
    if let Some(loaded) = EMBEDDER.get() {
        return Ok(loaded);
    }
    let loaded =
        OnnxEmbedder::from_env().map_err(|e| ApiError::unavailable(format!("cannot load the embedding model: {e}")))?;
    Ok(EMBEDDER.get_or_init(|| Mutex::new(loaded)))
}

pub async fn retrieve(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<RetrieveRequest>,
) -> ApiResult<Json<Retrieval>> {
    let name = request.profile.as_deref().unwrap_or("scienceworld");
    let profile = DomainProfile::by_name(name).ok_or_else(|| {
        ApiError::bad_field(
            "profile",
            format!("unknown profile {name:?} (alfworld, scienceworld, webshop, generic)"),
        )
    })?;
    state
        .blocking(move |core| {
            let config = AgentConfig::new(PathBuf::new(), profile);
            let mut model = embedder()?
                .lock()
                .map_err(|_| ApiError::unavailable("the embedding model's lock is poisoned"))?;
            let bank = core.read()?;
            match retrieve_in(&bank, &config, &mut *model, &request.task, &request.env) {
                Ok(found) => Ok(Json(found)),
                Err(AgentError::Bank(e)) => Err(ApiError::from_bank(e, "task")),
                Err(e) => Err(ApiError::new(StatusCode::BAD_REQUEST, e.to_string())),
            }
        })
        .await
}
