//! The `agent` feature: the paper's online memory loop on top of the bank.
//!
//! - [`embed`]: the [`Embedder`] trait and [`OnnxEmbedder`], local BERT-family
//!   sentence embeddings through ONNX Runtime (loaded at run time from a
//!   shared library; nothing is downloaded).
//! - [`llm`]: [`HttpChat`], a blocking client for OpenAI-compatible
//!   chat-completions endpoints, behind the [`ChatModel`] trait.
//! - [`reply`]: robust extraction of one JSON object from an LLM reply.
//! - [`prompts`]: the extraction and consolidation prompts and the
//!   per-benchmark [`DomainProfile`]s.
//! - [`replay`]: [`ReplayChat`], a chat model answering the loop's prompts
//!   with what an LLM wrote during a recorded run (offline demos, tests).
//! - [`memory_loop`]: [`MemoryLoop`] with `retrieve` (before an episode)
//!   and `record` (after it), returning serde-serialisable results.
//! - [`store`]: [`BankStore`], where `record` reads and commits: a bank
//!   directory ([`DirStore`]) or a server's own bank.
//!
//! See `docs/AGENT.md` for setup and a walk-through.

pub mod embed;
pub mod llm;
pub mod memory_loop;
pub mod prompts;
pub mod replay;
pub mod reply;
pub mod store;

pub use embed::{EmbedError, Embedder, OnnxConfig, OnnxEmbedder, Pooling, TextRole};
pub use llm::{ChatMessage, ChatModel, HttpChat, LlmConfig, LlmError, PromptPurpose};
pub use memory_loop::{
    AgentConfig, AgentError, ConsolidationOutcome, ConsolidationStatus, Embedding, Episode, HitCount, MatchedChain,
    MemoryLoop, RecordOutcome, Retrieval, TreeWrite, WriteAction, check_episode_input, embed_text,
};
pub use prompts::{DomainProfile, PromptKind, TreeKind};
pub use replay::ReplayChat;
pub use reply::{Reply, ReplyError};
pub use store::{BankStore, Committed, DirStore};
