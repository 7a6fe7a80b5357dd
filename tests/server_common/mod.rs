//! A real `deltamem serve` process on 127.0.0.1 (port chosen by the OS)
//! and a small HTTP client for the server tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub struct Server {
    pub child: Child,
    pub base: String,
    pub token: Option<String>,
    agent: ureq::Agent,
}

/// A fresh bank of dimension `dim` in a temp dir.
pub fn bank(dim: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bank");
    let out = Command::new(env!("CARGO_BIN_EXE_deltamem"))
        .args(["init", path.to_str().unwrap(), "--dim", &dim.to_string(), "--quiet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (dir, path)
}

impl Server {
    /// `host:port` of the server, for raw TCP clients.
    pub fn address(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    /// Starts `deltamem serve BANK --listen 127.0.0.1:0 EXTRA..` and waits
    /// for the line naming its address.
    pub fn start(bank: &Path, extra: &[&str]) -> Server {
        Server::start_with_env(bank, extra, &[])
    }

    /// `start` with these environment variables set; the LLM settings
    /// (`DELTAMEM_LLM_*`) come only from `env`, never from the caller's
    /// environment.
    pub fn start_with_env(bank: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_deltamem"));
        for name in ["DELTAMEM_LLM_BASE_URL", "DELTAMEM_LLM_MODEL", "DELTAMEM_LLM_API_KEY"] {
            command.env_remove(name);
        }
        command
            .envs(env.iter().copied())
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        let mut child = command
            .args([
                "serve",
                bank.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--threads",
                "2",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn deltamem serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let base = loop {
            assert!(Instant::now() < deadline, "server did not start");
            let line = lines.next().expect("server exited before listening").unwrap();
            if let Some(at) = line.find("http://") {
                break line[at..].trim().to_string();
            }
        };
        // Keep draining stderr so the server never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        Server {
            child,
            base,
            token: None,
            agent,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// (status, body text).
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        self.call_with(method, path, body, self.token.as_deref())
    }

    pub fn call_with(&self, method: &str, path: &str, body: Option<&str>, token: Option<&str>) -> (u16, String) {
        let url = self.url(path);
        let auth = token.map(|t| format!("Bearer {t}"));
        let response = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                r.call()
            }
            ("DELETE", _) => {
                let mut r = self.agent.delete(&url);
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                r.call()
            }
            (m, b) => {
                let mut r = self.agent.post(&url).header("content-type", "application/json");
                if m == "PUT" {
                    r = self.agent.put(&url).header("content-type", "application/json");
                }
                if let Some(a) = &auth {
                    r = r.header("authorization", a);
                }
                r.send(b.unwrap_or(""))
            }
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let text = response.into_body().read_to_string().unwrap();
        (status, text)
    }

    /// GET expecting 200 and JSON.
    pub fn get(&self, path: &str) -> Value {
        let (status, text) = self.call("GET", path, None);
        assert_eq!(status, 200, "GET {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"))
    }

    /// POST expecting 200 and JSON.
    pub fn post(&self, path: &str, body: &Value) -> Value {
        let (status, text) = self.call("POST", path, Some(&body.to_string()));
        assert_eq!(status, 200, "POST {path} {body}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"))
    }

    /// A request that must fail with `status`; returns the error JSON.
    pub fn fails(&self, method: &str, path: &str, body: Option<&str>, status: u16) -> Value {
        let (got, text) = self.call(method, path, body);
        assert_eq!(got, status, "{method} {path}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"))
    }

    /// SIGTERM, then the exit code (panics if it takes over 60 s).
    pub fn terminate(mut self) -> i32 {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().expect("exited, not killed by a signal");
            }
            assert!(Instant::now() < deadline, "no exit within 60 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An insert body: a root or auto node with a one-hot-ish vector.
pub fn node(tree: &str, attach: Value, scenario: &str, embedding: &[f32]) -> Value {
    json!({
        "tree": tree, "attach": attach, "label": "SUCCESS", "scenario": scenario,
        "payload": {"execution_procedure": format!("steps for {scenario}")},
        "embedding": embedding,
    })
}

/// A deterministic vector of `dim` components for seed `i`.
pub fn vector(dim: usize, i: u64) -> Vec<f32> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..dim)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}
