//! A blocking client for OpenAI-compatible chat-completions endpoints
//! (vLLM, llama.cpp server, Ollama, DeepSeek, OpenAI, ...).
//!
//! Temperature 0 by default, connect and read timeouts, bounded retries
//! with exponential backoff on 429, 5xx, connection failures and timeouts.
//! Every failure is a typed [`LlmError`]; nothing here panics on what a
//! server sends.

use std::io::Read;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;

use super::prompts::PromptKind;

/// Environment variables read by [`LlmConfig::from_env`].
pub const ENV_BASE_URL: &str = "DELTAMEM_LLM_BASE_URL";
pub const ENV_MODEL: &str = "DELTAMEM_LLM_MODEL";
pub const ENV_API_KEY: &str = "DELTAMEM_LLM_API_KEY";

/// Largest response body read, in bytes.
const MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;
/// How much of an error body is kept in an error.
const ERROR_BODY_CHARS: usize = 400;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmConfig {
    /// Up to and including the API version, e.g. `http://127.0.0.1:8000/v1`;
    /// `/chat/completions` is appended unless already there.
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer ...` when set.
    #[serde(default, skip_serializing)]
    pub api_key: Option<String>,
    pub temperature: f32,
    /// `max_tokens` of the request; None lets the server decide.
    pub max_tokens: Option<u32>,
    /// TCP connect (and TLS handshake) limit per attempt.
    pub connect_timeout: Duration,
    /// Limit for the response headers and again for the body, per attempt.
    pub read_timeout: Duration,
    /// Attempts in all (1 = no retry).
    pub max_attempts: u32,
    /// Wait before the second attempt; doubles each time up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl LlmConfig {
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> LlmConfig {
        LlmConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            temperature: 0.0,
            max_tokens: None,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(300),
            max_attempts: 4,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(8),
        }
    }

    /// From `DELTAMEM_LLM_BASE_URL`, `DELTAMEM_LLM_MODEL` and the optional
    /// `DELTAMEM_LLM_API_KEY`.
    pub fn from_env() -> Result<LlmConfig, LlmError> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let base_url = get(ENV_BASE_URL).ok_or_else(|| LlmError::Config(format!("{ENV_BASE_URL} is not set")))?;
        let model = get(ENV_MODEL).ok_or_else(|| LlmError::Config(format!("{ENV_MODEL} is not set")))?;
        let mut config = LlmConfig::new(base_url, model);
        config.api_key = get(ENV_API_KEY);
        Ok(config)
    }

    /// The full chat-completions URL.
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim().trim_end_matches('/');
        if base.ends_with("/chat/completions") {
            base.to_string()
        } else {
            format!("{base}/chat/completions")
        }
    }

    fn validate(&self) -> Result<(), LlmError> {
        let url = self.endpoint();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(LlmError::Config(format!(
                "base URL {:?} must start with http:// or https://",
                self.base_url
            )));
        }
        if self.model.trim().is_empty() {
            return Err(LlmError::Config("model name is empty".into()));
        }
        if self.max_attempts == 0 {
            return Err(LlmError::Config("max_attempts must be at least 1".into()));
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(LlmError::Config(format!(
                "temperature {} is not a finite non-negative number",
                self.temperature
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Error)]
pub enum LlmError {
    #[error("LLM client configuration: {0}")]
    Config(String),
    #[error("LLM request to {url} timed out ({detail}) after {attempts} attempt(s)")]
    Timeout { url: String, detail: String, attempts: u32 },
    #[error("cannot reach the LLM at {url}: {detail} (after {attempts} attempt(s))")]
    Connection { url: String, detail: String, attempts: u32 },
    #[error("LLM at {url} answered HTTP {status} after {attempts} attempt(s): {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
        attempts: u32,
    },
    #[error("LLM at {url} sent a response that is not a chat completion ({detail}): {excerpt:?}")]
    BadResponse {
        url: String,
        detail: String,
        excerpt: String,
    },
    /// A chat model other than the HTTP client (a caller's own, e.g. a
    /// Python callable) failed; not retried here.
    #[error("chat model {model} failed: {detail}")]
    Failed { model: String, detail: String },
}

impl LlmError {
    /// Whether another attempt could succeed.
    fn is_transient(&self) -> bool {
        match self {
            LlmError::Timeout { .. } | LlmError::Connection { .. } => true,
            LlmError::Status { status, .. } => *status == 408 || *status == 409 || *status == 429 || *status >= 500,
            LlmError::Config(_) | LlmError::BadResponse { .. } | LlmError::Failed { .. } => false,
        }
    }

    fn set_attempts(&mut self, n: u32) {
        match self {
            LlmError::Timeout { attempts, .. }
            | LlmError::Connection { attempts, .. }
            | LlmError::Status { attempts, .. } => *attempts = n,
            LlmError::Config(_) | LlmError::BadResponse { .. } | LlmError::Failed { .. } => {}
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: "system".into(),
            content: content.into(),
        }
    }

    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: "user".into(),
            content: content.into(),
        }
    }
}

/// Why the memory loop asks: which prompt, for which episode, over which
/// chain. A real model needs only the messages; a stand-in (the replay of
/// a recorded run, `super::replay`) answers from this without parsing
/// prompt text, so prompt wording can change without breaking it.
#[derive(Debug, Clone, Copy)]
pub struct PromptPurpose<'a> {
    pub kind: PromptKind,
    /// The episode's caller-given id (None for distillation, which serves
    /// a node rather than an episode).
    pub episode: Option<&'a str>,
    /// The scenario text of the entry to write (the episode's task or env
    /// text; for distillation, the due node's scenario).
    pub scenario: &'a str,
    /// The rendered chain shown to the model (residual and distill kinds).
    pub chain: Option<&'a str>,
}

/// Anything that answers a chat: the HTTP client, or a scripted stand-in.
pub trait ChatModel {
    /// The assistant's reply text.
    fn complete(&self, messages: &[ChatMessage]) -> Result<String, LlmError>;
    /// Names the model in provenance records.
    fn model_id(&self) -> String;
    /// The memory loop's entry point: by default the messages alone decide.
    fn answer(&self, purpose: &PromptPurpose<'_>, messages: &[ChatMessage]) -> Result<String, LlmError> {
        let _ = purpose;
        self.complete(messages)
    }
}

/// The HTTP chat-completions client.
pub struct HttpChat {
    config: LlmConfig,
    agent: ureq::Agent,
    endpoint: String,
}

impl std::fmt::Debug for HttpChat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpChat")
            .field("endpoint", &self.endpoint)
            .field("model", &self.config.model)
            .finish_non_exhaustive()
    }
}

impl HttpChat {
    pub fn new(config: LlmConfig) -> Result<HttpChat, LlmError> {
        config.validate()?;
        let endpoint = config.endpoint();
        let mut builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(config.connect_timeout))
            .timeout_send_request(Some(config.connect_timeout.max(config.read_timeout)))
            .timeout_send_body(Some(config.read_timeout))
            .timeout_recv_response(Some(config.read_timeout))
            .timeout_recv_body(Some(config.read_timeout))
            .user_agent(concat!("deltamem/", env!("CARGO_PKG_VERSION")));
        if is_loopback(&endpoint) {
            // A proxy from the environment must not capture local servers.
            builder = builder.proxy(None);
        }
        let agent = builder.build().new_agent();
        Ok(HttpChat {
            config,
            agent,
            endpoint,
        })
    }

    /// [`HttpChat::new`] with [`LlmConfig::from_env`].
    pub fn from_env() -> Result<HttpChat, LlmError> {
        HttpChat::new(LlmConfig::from_env()?)
    }

    pub fn config(&self) -> &LlmConfig {
        &self.config
    }

    fn request_body(&self, messages: &[ChatMessage]) -> String {
        let mut body = json!({
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "stream": false,
        });
        if let Some(n) = self.config.max_tokens {
            body["max_tokens"] = json!(n);
        }
        body.to_string()
    }

    /// One HTTP exchange; `Err` carries the server's retry hint if any.
    fn attempt(&self, body: &str) -> Result<String, (LlmError, Option<Duration>)> {
        let mut request = self
            .agent
            .post(&self.endpoint)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json");
        if let Some(key) = &self.config.api_key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut response = request.send(body).map_err(|e| (self.transport_error(e), None))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut text = String::new();
        let read = response
            .body_mut()
            .as_reader()
            .take(MAX_RESPONSE_BYTES)
            .read_to_string(&mut text);
        if let Err(e) = read {
            let err = match e.kind() {
                std::io::ErrorKind::TimedOut => LlmError::Timeout {
                    url: self.endpoint.clone(),
                    detail: format!("reading the response body: {e}"),
                    attempts: 1,
                },
                std::io::ErrorKind::InvalidData if status < 300 => LlmError::BadResponse {
                    url: self.endpoint.clone(),
                    detail: format!("body is not UTF-8 text: {e}"),
                    excerpt: String::new(),
                },
                _ => match e.downcast::<ureq::Error>() {
                    Ok(inner) => self.transport_error(inner),
                    Err(e) => LlmError::Connection {
                        url: self.endpoint.clone(),
                        detail: format!("reading the response body: {e}"),
                        attempts: 1,
                    },
                },
            };
            return Err((err, retry_after));
        }
        if !(200..300).contains(&status) {
            let body: String = text.chars().take(ERROR_BODY_CHARS).collect();
            return Err((
                LlmError::Status {
                    url: self.endpoint.clone(),
                    status,
                    body,
                    attempts: 1,
                },
                retry_after,
            ));
        }
        parse_completion(&self.endpoint, &text).map_err(|e| (e, None))
    }

    fn transport_error(&self, e: ureq::Error) -> LlmError {
        let url = self.endpoint.clone();
        match e {
            ureq::Error::Timeout(t) => LlmError::Timeout {
                url,
                detail: t.to_string(),
                attempts: 1,
            },
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => LlmError::Timeout {
                url,
                detail: io.to_string(),
                attempts: 1,
            },
            ureq::Error::BadUri(_) | ureq::Error::Http(_) | ureq::Error::InvalidProxyUrl => {
                LlmError::Config(format!("request to {url} cannot be built: {e}"))
            }
            ureq::Error::Protocol(_) => LlmError::BadResponse {
                url,
                detail: format!("HTTP protocol error: {e}"),
                excerpt: String::new(),
            },
            other => LlmError::Connection {
                url,
                detail: other.to_string(),
                attempts: 1,
            },
        }
    }
}

impl ChatModel for HttpChat {
    fn complete(&self, messages: &[ChatMessage]) -> Result<String, LlmError> {
        let body = self.request_body(messages);
        let mut wait = self.config.backoff_initial;
        let mut attempt = 1;
        loop {
            match self.attempt(&body) {
                Ok(text) => return Ok(text),
                Err((mut e, hint)) => {
                    if !e.is_transient() || attempt >= self.config.max_attempts {
                        e.set_attempts(attempt);
                        return Err(e);
                    }
                    let pause = hint.unwrap_or(wait).min(self.config.backoff_max);
                    std::thread::sleep(pause);
                    wait = (wait * 2).min(self.config.backoff_max);
                    attempt += 1;
                }
            }
        }
    }

    fn model_id(&self) -> String {
        self.config.model.clone()
    }
}

/// The assistant text of a chat-completions response body.
fn parse_completion(url: &str, text: &str) -> Result<String, LlmError> {
    let bad = |detail: &str| LlmError::BadResponse {
        url: url.to_string(),
        detail: detail.to_string(),
        excerpt: super::reply::excerpt(text),
    };
    let value: Value = serde_json::from_str(text).map_err(|e| bad(&format!("body is not JSON: {e}")))?;
    if let Some(err) = value.get("error").filter(|e| !e.is_null()) {
        let message = err
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| err.to_string(), str::to_string);
        return Err(bad(&format!("the server reported an error: {message}")));
    }
    let choice = value
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| bad("no choices[0]"))?;
    let content = choice
        .get("message")
        .and_then(|m| m.get("content"))
        .or_else(|| choice.get("text"));
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        // Some servers send content as a list of typed parts.
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("")),
        _ => Err(bad("choices[0].message.content is missing or not text")),
    }
}

fn is_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host_port = rest.split('/').next().unwrap_or("");
    let host = if let Some(stripped) = host_port.strip_prefix('[') {
        stripped.split(']').next().unwrap_or("")
    } else {
        host_port.rsplit_once(':').map_or(host_port, |(h, _)| h)
    };
    host.eq_ignore_ascii_case("localhost")
        || host == "::1"
        || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_and_loopback() {
        let c = LlmConfig::new("http://127.0.0.1:8000/v1/", "m");
        assert_eq!(c.endpoint(), "http://127.0.0.1:8000/v1/chat/completions");
        let c = LlmConfig::new("https://x.example/v1/chat/completions", "m");
        assert_eq!(c.endpoint(), "https://x.example/v1/chat/completions");
        assert!(is_loopback("http://127.0.0.1:9/v1"));
        assert!(is_loopback("http://localhost/v1"));
        assert!(is_loopback("http://[::1]:80/v1"));
        assert!(!is_loopback("https://api.example.com/v1"));
    }

    #[test]
    fn completion_shapes() {
        let ok = r#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#;
        assert_eq!(parse_completion("u", ok).unwrap(), "hi");
        let parts = r#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}}]}"#;
        assert_eq!(parse_completion("u", parts).unwrap(), "ab");
        for bad in [
            "not json",
            "[]",
            r#"{"choices":[]}"#,
            r#"{"choices":[{"message":{"content":null}}]}"#,
            r#"{"error":{"message":"overloaded"}}"#,
        ] {
            assert!(
                matches!(parse_completion("u", bad), Err(LlmError::BadResponse { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn config_checks() {
        assert!(HttpChat::new(LlmConfig::new("ftp://x", "m")).is_err());
        assert!(HttpChat::new(LlmConfig::new("http://x", " ")).is_err());
        let mut c = LlmConfig::new("http://x", "m");
        c.max_attempts = 0;
        assert!(HttpChat::new(c).is_err());
    }
}
