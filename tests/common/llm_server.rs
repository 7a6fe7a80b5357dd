//! A scripted chat-completions server on 127.0.0.1 for the agent tests:
//! a real TCP listener speaking enough HTTP/1.1 for the client, answering
//! a script of canned replies in order (not a mock object).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

// ---------------------------------------------------------------- server

/// One scripted answer.
pub enum Canned {
    /// 200 with a chat completion whose assistant text is this.
    Content(String),
    /// This status with this body.
    Status(u16, String),
    /// This status with a Retry-After header (seconds).
    RetryAfter(u16, u64),
    /// 200 with this raw body.
    Body(String),
    /// Wait, then answer.
    Slow(Duration, Box<Canned>),
    /// Run this first (while the client waits), then answer.
    Hook(Box<dyn FnOnce() + Send>, Box<Canned>),
}

pub fn content(text: &str) -> Canned {
    Canned::Content(text.to_string())
}

#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Value,
}

impl Request {
    pub fn user_text(&self) -> String {
        self.body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string()
    }
}

pub struct Server {
    pub url: String,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<usize>>,
}

impl Server {
    /// Serves the script in order on 127.0.0.1 (port chosen by the OS),
    /// one request per connection; once the script is used up it answers
    /// 500 "script exhausted". The thread stops when asked, or after 60 s.
    pub fn start(script: Vec<Canned>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, halt) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut script = script.into_iter();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut served = 0;
            while !halt.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let canned = script
                            .next()
                            .unwrap_or_else(|| Canned::Status(500, "script exhausted".into()));
                        serve(stream, canned, &reqs);
                        served += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(_) => break,
                }
            }
            served
        });
        Server {
            url,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut stream: TcpStream, canned: Canned, log: &Mutex<Vec<Request>>) {
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    if let Some(request) = read_request(&mut stream) {
        log.lock().unwrap().push(request);
    }
    let (status, body, extra) = answer(canned);
    let reason = match status {
        200 => "OK",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    // The client may have given up (timeout tests): ignore write errors.
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body.as_bytes());
    let _ = stream.flush();
}

fn answer(canned: Canned) -> (u16, String, String) {
    match canned {
        Canned::Content(text) => {
            let body = json!({
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "created": 0,
                "model": "scripted-model",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop"
                }]
            });
            (200, body.to_string(), String::new())
        }
        Canned::Status(code, body) => (code, body, String::new()),
        Canned::RetryAfter(code, secs) => (
            code,
            "{\"error\":\"slow down\"}".into(),
            format!("Retry-After: {secs}\r\n"),
        ),
        Canned::Body(body) => (200, body, String::new()),
        Canned::Slow(pause, inner) => {
            std::thread::sleep(pause);
            answer(*inner)
        }
        Canned::Hook(hook, inner) => {
            hook();
            answer(*inner)
        }
    }
}

/// Reads one HTTP/1.1 request with a Content-Length body.
fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let header_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if data.len() > 1 << 20 {
            return None;
        }
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..header_end]).to_string();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers.get("content-length")?.parse().ok()?;
    while data.len() < header_end + length {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    }
    let body = serde_json::from_slice(&data[header_end..header_end + length]).ok()?;
    Some(Request { path, headers, body })
}
