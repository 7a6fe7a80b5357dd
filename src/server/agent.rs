//! The agent feature on the server: `POST /v1/retrieve` and `POST
//! /v1/record` (the same JSON as `deltamem retrieve --json` and `deltamem
//! record --json`), and the MCP tools `retrieve_memory`, `record_episode`
//! and `query_by_text`. Thin: the agent library does the work on the
//! server's bank through [`ServerStore`], a `BankStore` whose reads take
//! the shared view and whose commits go through the writer queue (group
//! commit; over `deltamem mcp`, the writer lock per commit). The LLM and
//! embedding calls of a record run on the blocking pool with no bank lock
//! held, so many records are in flight at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::body::QueryReply;
use super::core::{WriteDone, WriteOp};
use super::error::{ApiError, ApiResult};
use super::http::{AppState, JsonBody};
use super::mcp::{Memory, MemoryTools, Named};
use super::routes::query_params;
use crate::agent::memory_loop::retrieve_in;
use crate::agent::{
    AgentConfig, AgentError, BankStore, Committed, DomainProfile, EmbedError, Embedder, Episode, HttpChat, MemoryLoop,
    OnnxEmbedder, RecordOutcome, Retrieval, TextRole,
};
use crate::bank::{Bank, BankError, Change, ChangeAck, NodeRef};

/// `/v1/retrieve` and the `retrieve_memory` tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrieveRequest {
    /// The task the agent is about to attempt (searched in the task tree).
    #[schemars(regex(pattern = r"\S"))]
    pub task: String,
    /// The environment it starts in (searched in the env tree).
    #[schemars(regex(pattern = r"\S"))]
    pub env: String,
    /// Wording of the rendered memory: alfworld, scienceworld (default),
    /// webshop or generic.
    #[serde(default)]
    pub profile: Option<String>,
}

/// `?profile=` of `/v1/record` (the body is the episode itself).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordParams {
    #[serde(default)]
    profile: Option<String>,
}

/// The `record_episode` tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordEpisodeParams {
    /// The finished episode.
    pub episode: Episode,
    /// Wording of the extraction prompts: alfworld, scienceworld (default),
    /// webshop or generic.
    #[serde(default)]
    pub profile: Option<String>,
}

/// The `query_by_text` tool.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextQueryParams {
    /// Tree to search, e.g. "task" or "env".
    pub tree: String,
    /// What to look for, in plain words; embedded by the server's model.
    pub text: String,
    /// How many matches to return (default 1, at most 100).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub k: Option<u32>,
}

/// The embedding model, loaded on first use from the same settings as the
/// CLI (`DELTAMEM_ASSETS`, ...); one text batch is embedded at a time.
static EMBEDDER: OnceLock<Mutex<OnnxEmbedder>> = OnceLock::new();

fn embedder() -> ApiResult<&'static Mutex<OnnxEmbedder>> {
    if let Some(loaded) = EMBEDDER.get() {
        return Ok(loaded);
    }
    let loaded =
        OnnxEmbedder::from_env().map_err(|e| ApiError::unavailable(format!("cannot load the embedding model: {e}")))?;
    Ok(EMBEDDER.get_or_init(|| Mutex::new(loaded)))
}

/// The shared model as an `Embedder` each record owns: locked per batch,
/// not for the whole record.
struct SharedEmbedder(&'static Mutex<OnnxEmbedder>);

impl SharedEmbedder {
    fn model(&self) -> std::sync::MutexGuard<'static, OnnxEmbedder> {
        // A panic mid-inference leaves no state the next call depends on.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Embedder for SharedEmbedder {
    fn dim(&self) -> usize {
        self.model().dim()
    }
    fn model_id(&self) -> String {
        self.model().model_id()
    }
    fn embed_batch(&mut self, texts: &[&str], role: TextRole) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.model().embed_batch(texts, role)
    }
}

/// The LLM client, configured as the CLI's (`DELTAMEM_LLM_BASE_URL`,
/// `_MODEL`, `_API_KEY` in the server's environment).
fn chat() -> ApiResult<HttpChat> {
    HttpChat::from_env().map_err(|e| {
        ApiError::unavailable(format!(
            "recording needs an LLM and none is configured ({e}): start the server with \
             DELTAMEM_LLM_BASE_URL and DELTAMEM_LLM_MODEL (and DELTAMEM_LLM_API_KEY if the endpoint wants one)"
        ))
    })
}

fn profile(name: Option<&str>) -> ApiResult<DomainProfile> {
    let name = name.unwrap_or("scienceworld");
    DomainProfile::by_name(name).ok_or_else(|| {
        ApiError::bad_field(
            "profile",
            format!("unknown profile {name:?} (alfworld, scienceworld, webshop, generic)"),
        )
    })
}

/// A server bank as the memory loop's store.
struct ServerStore<'a, M: Memory>(&'a M);

fn store_error(e: ApiError) -> AgentError {
    AgentError::Store(Box::new(e))
}

impl<M: Memory> BankStore for ServerStore<'_, M> {
    fn read<T>(&self, f: impl FnOnce(&Bank) -> Result<T, AgentError>) -> Result<T, AgentError> {
        self.0.read(|bank| Ok(f(bank))).map_err(store_error)?
    }

    fn commit<T>(
        &self,
        changes: Vec<Change>,
        after: impl FnOnce(&Bank, &[ChangeAck]) -> Result<T, AgentError>,
    ) -> Result<Committed<T>, AgentError> {
        let acks = match self.0.write(WriteOp::Transact(changes)).map_err(store_error)? {
            WriteDone::Transacted(acks) => acks,
            _ => return Err(store_error(super::routes::unexpected())),
        };
        // Durable now. Nodes never move and chains never change, so a
        // later view shows what the commit did.
        let after = self.read(|bank| after(bank, &acks))?;
        Ok(Committed {
            acks,
            after,
            checkpoint_failure: None,
        })
    }

    fn consolidate(&self, node: u32, fields: BTreeMap<String, String>) -> Result<Committed<u32>, AgentError> {
        match self.0.write(WriteOp::Consolidate(NodeRef::Index(node), fields)) {
            // The server's writer checkpoints on its own schedule and
            // reports its failures itself.
            Ok(WriteDone::Consolidated(done)) => Ok(Committed {
                acks: Vec::new(),
                after: done.new_root,
                checkpoint_failure: None,
            }),
            Ok(_) => Err(store_error(super::routes::unexpected())),
            // Consolidated meanwhile: name the root it went into.
            Err(e) if e.status == StatusCode::CONFLICT => {
                let root = self.read(|bank| Ok(bank.row(node)?.link))?;
                Err(AgentError::Bank(BankError::AlreadyConsolidated { node, root }))
            }
            Err(e) => Err(store_error(e)),
        }
    }
}

/// The HTTP status of an agent error: the store's own, bad input 400, an
/// LLM that failed or answered nonsense 502, a server set up wrong 503.
fn agent_error(e: AgentError) -> ApiError {
    match e {
        AgentError::Store(inner) => match inner.downcast::<ApiError>() {
            Ok(api) => *api,
            Err(other) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        },
        AgentError::Bank(e) => ApiError::from_bank(e, "episode"),
        AgentError::BadEpisode(m) => {
            // The message starts with the field it is about.
            let field = m.split([' ', ':']).next().unwrap_or("episode").to_string();
            ApiError::bad_field(&field, format!("bad episode: {m}"))
        }
        AgentError::Embed(e @ EmbedError::EmptyText { .. }) => ApiError::bad_field("text", e.to_string()),
        e @ (AgentError::Llm { .. } | AgentError::Reply { .. }) => {
            ApiError::new(StatusCode::BAD_GATEWAY, e.to_string())
        }
        e @ (AgentError::Embed(_) | AgentError::Config(_)) => ApiError::unavailable(e.to_string()),
    }
}

/// `retrieve` on the server's bank (blocking).
pub fn retrieve_with<M: Memory>(memory: &M, request: RetrieveRequest) -> ApiResult<Retrieval> {
    for (field, text) in [("task", &request.task), ("env", &request.env)] {
        if text.trim().is_empty() {
            return Err(ApiError::bad_field(
                field,
                format!("{field} is empty: nothing to search for"),
            ));
        }
    }
    let config = AgentConfig::new(PathBuf::new(), profile(request.profile.as_deref())?);
    let mut model = SharedEmbedder(embedder()?);
    ServerStore(memory)
        .read(|bank| retrieve_in(bank, &config, &mut model, &request.task, &request.env))
        .map_err(agent_error)
}

/// `record` on the server's bank (blocking; the LLM calls run with no
/// bank lock held, the commit goes through the store). Everything that
/// can refuse without the LLM (the episode's input, profile, a read-only
/// server, no LLM configured) refuses before the first LLM call.
pub fn record_with<M: Memory>(memory: &M, episode: &Episode, profile_name: Option<&str>) -> ApiResult<RecordOutcome> {
    let config = AgentConfig::new(PathBuf::new(), profile(profile_name)?);
    // Bad input is a 400 (or 404) even where no LLM is configured.
    memory.read(|bank| crate::agent::check_episode_input(bank, &config, episode).map_err(agent_error))?;
    memory.writable()?;
    let llm = chat()?;
    let mut memory_loop = MemoryLoop::new(config, SharedEmbedder(embedder()?), llm);
    memory_loop
        .record_in(&ServerStore(memory), episode)
        .map_err(agent_error)
}

/// Embeds `text` as a query and searches one tree (blocking).
pub fn query_text_with<M: Memory>(memory: &M, params: TextQueryParams) -> ApiResult<QueryReply> {
    let options = super::mcp::tool_options(params.k)?;
    let mut model = SharedEmbedder(embedder()?);
    let vector = model
        .embed(&params.text, TextRole::Query)
        .map_err(|e| agent_error(AgentError::Embed(e)))?;
    let dim = memory.read(|b| Ok(b.dim_count()))?;
    if vector.len() != dim as usize {
        return Err(ApiError::unavailable(format!(
            "the bank stores {dim}-dimensional vectors but the server's embedder ({}) makes {}",
            model.model_id(),
            vector.len()
        )));
    }
    memory.query(&params.tree, vector, options)
}

pub async fn retrieve(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<RetrieveRequest>,
) -> ApiResult<Json<Retrieval>> {
    state.blocking(move |core| retrieve_with(core, request).map(Json)).await
}

/// Not bounded by the request time limit: an answer must never say
/// "failed" for an episode that is then committed (the LLM client's own
/// timeouts bound the calls).
pub async fn record(
    State(state): State<AppState>,
    params: Result<Query<RecordParams>, QueryRejection>,
    JsonBody(episode): JsonBody<Episode>,
) -> ApiResult<Json<RecordOutcome>> {
    let profile_name = query_params(params)?.profile;
    let core: Arc<super::Core> = state.core.clone();
    tokio::task::spawn_blocking(move || record_with(&core, &episode, profile_name.as_deref()))
        .await
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the record handler panicked"))?
        .map(Json)
}

#[tool_router(router = agent_tools, vis = "pub(super)")]
impl<M: Memory> MemoryTools<M> {
    #[tool(
        description = "Before an episode: look up what the memory knows for a task and the environment it \
        starts in. Returns the best-matching chain of each tree (task skills, environment facts) and \
        `context`, both chains rendered as text to put in the agent's prompt (empty when nothing matched). \
        Pass the returned chains' node ids back as retrieved_task / retrieved_env when recording the \
        episode."
    )]
    async fn retrieve_memory(
        &self,
        Parameters(Named(p)): Parameters<Named<RetrieveRequest>>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(move |m| retrieve_with(m, p)).await
    }

    #[tool(
        description = "After an episode: learn from it. The server asks its LLM to extract a skill (task \
        tree) and environment facts (env tree) from the trajectory, stores them under the chains the \
        episode retrieved at its start (or as new roots), counts those chains' retrievals and, on \
        success, their success hits, and distils nodes that became due. Answers once durable, with \
        what was written to each tree. Takes seconds (LLM calls); needs the server's LLM configured."
    )]
    async fn record_episode(
        &self,
        Parameters(Named(p)): Parameters<Named<RecordEpisodeParams>>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(move |m| record_with(m, &p.episode, p.profile.as_deref()))
            .await
    }

    #[tool(
        description = "Search one tree with plain text: the server embeds the text with its embedding \
        model and returns the top-k stored experiences (id, score, type, label, chain of ids), failures \
        penalised in the ranking."
    )]
    async fn query_by_text(
        &self,
        Parameters(Named(p)): Parameters<Named<TextQueryParams>>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run(move |m| query_text_with(m, p)).await
    }
}
