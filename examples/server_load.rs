//! Load benchmark of `deltamem serve` on loopback (docs/SERVER.md).
//!
//! Builds a bank of N x 768 random unit vectors (default 100k) with a bulk
//! load, runs the server in this process on 127.0.0.1 (port chosen by the
//! OS), and measures, each bounded in count and time:
//!   - the library call `Bank::query` (the peer the server is compared to);
//!   - single HTTP queries with 1, 8 and 32 concurrent clients;
//!   - durable single-node inserts (sync always) with 1, 8 and 32 clients,
//!     once with embeddings as JSON arrays and once as base64 (`INSERT_SPELLING`),
//!     each run into an empty bank of its own under a server of its own
//!     (`RunServer`; `INSERT_BANK=shared`: one bank for all runs, growing):
//!     each run lasts `INSERT_RUN` (at most
//!     `INSERT_RUN_MAX` inserts), the three client counts are run in turn
//!     `INSERT_ROUNDS` times (default 3) and the medians compared; each
//!     run's CPU per insert is split between the server and the load
//!     generator's client threads (each client thread measures its own
//!     CPU), with context switches, inserts per fsync and per write round.
//!     Each client has a thread of its own (blocking sockets, as separate
//!     agent processes), or with `INSERT_DRIVER=loop` all of them share
//!     one thread's event loop (as one process driving many episodes, or
//!     wrk): the same requests, less of the two cores spent on clients.
//!     `INSERT_TRANSPORT=unix` serves the inserts on a Unix socket beside
//!     the bank instead of loopback TCP (the clients connect through it).
//!     `INSERT_INTO=PATH` runs them into that existing bank (768 dims; a
//!     copy: the run adds to it) instead of an empty one.
//!     `INSERT_SYNC=none` runs the inserts on a server that never fsyncs
//!     (the peer that shows what group commit leaves on the table: the
//!     insert target is about durable writes and is not judged then).
//!
//! Prints throughput and p50/p99 latency and checks the targets.
//! The query runs also print each latency without each client's first
//! request, and those first requests on their own: at the start every
//! client sends at the same instant to an idle server, a burst (one
//! query's pass, then one rotation for the rest) rather than the load as
//! it runs. The query target is judged without them, on both sides of
//! the ratio, and the ratio with them is printed beside it.
//!
//! The server's overhead is measured against the library call in the same
//! run, interleaved (library query, then the same query over HTTP, round
//! after round), so both sides see the same machine load. The library side
//! times `Bank::query` on its own read-only handle of the same bank with
//! the same scan threads as the server; the HTTP side times the client's
//! whole round trip (send the JSON body, the server parses it, scans,
//! builds and sends the JSON answer, the client reads it).
//!
//!   cargo run --release --example server_load [-- NODES [PHASES]]
//!
//! PHASES is a comma-separated subset of `overhead,batch,query,insert`
//! (default all), e.g. to profile one phase with `perf record`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use deltamem::api::embedding::encode_base64_f32;
use deltamem::server::{Limits, ListenAddr, ServeConfig, serve_until};
use deltamem::storage::sim::Rng;
use deltamem::{Attach, Bank, BankConfig, Change, Label, NewNode, OpenOptions, Payload, QueryOptions, SyncPolicy};

const DIM: usize = 768;
/// No phase runs longer than this.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

fn random_unit(rng: &mut Rng) -> Vec<f32> {
    let v: Vec<f32> = (0..DIM).map(|_| rng.next_f32() - 0.5).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

fn build_bank(path: &Path, nodes: usize) {
    let mut bank = Bank::create_dir(path, BankConfig::new(DIM as u32)).unwrap();
    let mut rng = Rng(7);
    let mut changes = Vec::with_capacity(nodes);
    let mut column = Vec::with_capacity(nodes * DIM);
    for i in 0..nodes {
        column.extend(random_unit(&mut rng));
        changes.push(Change::Insert(NewNode {
            tree: "task".into(),
            attach: Attach::Root,
            label: Label::Success,
            payload: Payload {
                scenario: format!("node {i}"),
                fields: BTreeMap::new(),
            },
            embedding: Vec::new(),
            external_id: None,
        }));
    }
    bank.load_column(&changes, &column).unwrap();
    bank.close().unwrap();
}

/// Starts a server on `path` listening on `listen`; its base URL
/// (`http://ADDR`), or `unix:PATH` for a Unix socket.
fn start(path: &Path, sync: SyncPolicy, listen: ListenAddr) -> String {
    start_until(path, sync, listen, std::future::pending()).0
}

/// As `start`, until `stop` resolves; the server's thread ends once it
/// has checkpointed.
fn start_until(
    path: &Path,
    sync: SyncPolicy,
    listen: ListenAddr,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (String, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let config = ServeConfig {
        bank: path.to_path_buf(),
        listen,
        token: None,
        threads: threads(),
        sync,
        read_only: false,
        checkpoint_wal_bytes: OpenOptions::default().checkpoint_wal_bytes,
        lock_wait: std::time::Duration::ZERO,
        on_lock_wait: None,
        limits: Limits::default(),
    };
    let thread = std::thread::spawn(move || {
        serve_until(config, |bound: &ListenAddr| tx.send(bound.clone()).unwrap(), stop).unwrap()
    });
    (rx.recv().unwrap().to_string(), thread)
}

fn loopback() -> ListenAddr {
    ListenAddr::Tcp("127.0.0.1:0".parse().unwrap())
}

/// Where the insert server listens: loopback TCP, or with
/// `INSERT_TRANSPORT=unix` a Unix socket beside the bank (the clients then
/// connect through it too).
fn insert_listen(bank: &Path) -> ListenAddr {
    match std::env::var("INSERT_TRANSPORT").is_ok_and(|t| t == "unix") {
        true => ListenAddr::Unix(bank.with_extension("sock")),
        false => loopback(),
    }
}

struct Run {
    seconds: f64,
    /// CPU seconds the whole process (server and clients) used.
    cpu_seconds: f64,
    latencies_ms: Vec<f64>,
    /// Of the query runs (empty for inserts), `latencies_ms` split in
    /// two: each client's first request, and all the others.
    first_ms: Vec<f64>,
    steady_ms: Vec<f64>,
}

/// The `p` quantile of `ms` (nearest rank).
fn quantile(ms: &[f64], p: f64) -> f64 {
    let mut l = ms.to_vec();
    l.sort_by(f64::total_cmp);
    l[((l.len() - 1) as f64 * p).round() as usize]
}

impl Run {
    fn pct(&self, p: f64) -> f64 {
        quantile(&self.latencies_ms, p)
    }

    /// The `p` quantile without each client's first request: the latency
    /// of the load once it runs, without the start, where every client
    /// sends at the same instant to an idle server (`first_ms`).
    fn steady_pct(&self, p: f64) -> f64 {
        quantile(&self.steady_ms, p)
    }
    fn rate(&self) -> f64 {
        self.latencies_ms.len() as f64 / self.seconds
    }
}

/// `clients` threads each sending up to `per_client` requests made by `body`.
fn drive(url: &str, clients: usize, per_client: usize, body: impl Fn(usize, usize) -> String + Sync) -> Run {
    let started = Instant::now();
    let cpu_before = cpu_seconds();
    let per_client: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let body = &body;
                scope.spawn(move || post_until(url, started, PHASE_LIMIT, per_client, |i| body(c, i)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Run {
        seconds: started.elapsed().as_secs_f64(),
        cpu_seconds: cpu_seconds() - cpu_before,
        first_ms: per_client.iter().filter_map(|l| l.first().copied()).collect(),
        steady_ms: per_client.iter().flat_map(|l| l.iter().skip(1).copied()).collect(),
        latencies_ms: per_client.concat(),
    }
}

fn library_bank(path: &Path) -> Bank {
    let mut bank = Bank::open_dir(
        path,
        OpenOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    bank.set_query_threads(threads());
    bank
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn median(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

/// Medians of the library call and of the same query over HTTP (one
/// client), interleaved round by round: (library ms, HTTP ms).
fn overhead_ms(library: &Bank, url: &str, queries: &[Vec<f32>], bodies: &[String]) -> (f64, f64) {
    let options = QueryOptions::default();
    let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
    let post = |body: &str| {
        let mut r = agent
            .post(url)
            .header("content-type", "application/json")
            .send(body)
            .unwrap();
        r.body_mut().read_to_string().unwrap()
    };
    // Warm both: the first scan of each handle maps and checks the column.
    std::hint::black_box(library.query("task", &queries[0], &options).unwrap());
    std::hint::black_box(post(&bodies[0]));
    let (mut lib, mut http) = (Vec::new(), Vec::new());
    for round in 0..120 {
        let i = round % queries.len();
        let t = Instant::now();
        std::hint::black_box(library.query("task", &queries[i], &options).unwrap());
        lib.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(post(&bodies[i]));
        http.push(t.elapsed().as_secs_f64() * 1e3);
    }
    (median(lib), median(http))
}

/// Throughput and latency of single queries with 1, 8 and 32 clients;
/// prints each and the queries the server scored per pass.
fn query_phase(base: &str, bodies: &[String]) -> Vec<Run> {
    let url = format!("{base}/v1/trees/task/query");
    let mut runs = Vec::new();
    for clients in [1, 8, 32] {
        // About 2,000 queries with 8 and 32 clients (a p99 of 640 was its
        // sixth-worst query, and moved 5x-8x between runs), 400 with one.
        let per_client = (2000 / clients).clamp(60, 400);
        let before = batch_counters(base);
        let run = drive(&url, clients, per_client, |c, i| {
            bodies[(c * 7 + i) % bodies.len()].clone()
        });
        let after = batch_counters(base);
        let (queries, passes) = (after.0 - before.0, after.1 - before.1);
        println!(
            "query  {clients:>2} clients: {:>8.1} q/s  p50 {:>7.3} ms  p99 {:>7.3} ms  ({} queries, {:.1} per pass); \
             without each client's first: p50 {:.3} ms  p99 {:.3} ms; the {} first (sent at once): p50 {:.3} ms  max {:.3} ms",
            run.rate(),
            run.pct(0.5),
            run.pct(0.99),
            run.latencies_ms.len(),
            queries / passes.max(1.0),
            run.steady_pct(0.5),
            run.steady_pct(0.99),
            run.first_ms.len(),
            quantile(&run.first_ms, 0.5),
            quantile(&run.first_ms, 1.0),
        );
        runs.push(run);
    }
    runs
}

/// Two counters from the server's `/metrics` (0 if absent).
fn counters(base: &str, names: [&str; 2]) -> (f64, f64) {
    let metrics = match base.strip_prefix("http://") {
        Some(_) => ureq::get(&format!("{base}/metrics"))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap(),
        None => {
            let mut connection = Connection::open(base);
            let request = format!("GET /metrics HTTP/1.1\r\nhost: {}\r\n\r\n", host_of(base));
            assert_eq!(connection.round_trip(request.as_bytes()), 200);
            let head = connection.buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            String::from_utf8_lossy(&connection.buf[head..]).into_owned()
        }
    };
    let counter = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (counter(names[0]), counter(names[1]))
}

/// The server's (queries, passes) counters.
fn batch_counters(base: &str) -> (f64, f64) {
    counters(base, ["deltamem_queries_total", "deltamem_query_batches_total"])
}

/// How long each insert run lasts, and the most inserts it sends.
const INSERT_RUN: Duration = Duration::from_secs(4);
const INSERT_RUN_MAX: usize = 200_000;
/// Distinct bodies per client, cycled (made before the clock starts).
const BODIES_PER_CLIENT: usize = 64;
/// Most insert clients `INSERT_CLIENTS` may ask for.
const MAX_INSERT_CLIENTS: usize = 128;

/// One insert run: the rate, and where the CPU went.
struct InsertRun {
    run: Run,
    /// CPU seconds of the client threads (the load generator) and of the
    /// rest of the process (the server).
    client_cpu_s: f64,
    server_cpu_s: f64,
    /// Context switches (voluntary + involuntary) of the whole process and
    /// of the client threads.
    switches: f64,
    client_switches: f64,
    /// The server's fsyncs and write rounds during the run.
    syncs: f64,
    rounds: f64,
    /// Seconds the writer thread spent in checkpoints during the run
    /// (both halves; it applies no write meanwhile).
    checkpoint_s: f64,
}

impl InsertRun {
    fn per_insert_us(&self, seconds: f64) -> f64 {
        seconds / self.run.latencies_ms.len().max(1) as f64 * 1e6
    }
}

/// Durable single-node inserts with 1, 8 and 32 clients into `empty`,
/// `rounds` times over (1, 8, 32, 1, 8, 32, ...: the rounds see the same
/// machine load); returns each client count's runs.
fn insert_phase(dir: &Path, spelling: &str, rounds: usize, counts: &[usize]) -> BTreeMap<usize, Vec<InsertRun>> {
    // Bodies are made before any clock starts: the load generator shares
    // the machine with the server and must not spend its time printing
    // floats (each run wraps them in requests for its own address).
    let clients = counts.iter().copied().max().unwrap_or(1);
    let bodies: Vec<Vec<String>> = (0..clients)
        .map(|c| (0..BODIES_PER_CLIENT).map(|i| insert_body(c, i, spelling)).collect())
        .collect();
    let shared = std::env::var("INSERT_INTO").ok().map(PathBuf::from).or_else(|| {
        let shared = std::env::var("INSERT_BANK").is_ok_and(|b| b == "shared");
        shared.then(|| empty_bank(&dir.join(format!("shared-{spelling}"))))
    });
    let shared_server = shared.map(|bank| RunServer::start(bank, false));
    let mut runs: BTreeMap<usize, Vec<InsertRun>> = BTreeMap::new();
    for round in 0..rounds {
        for &clients in counts {
            let fresh = shared_server.is_none().then(|| {
                let bank = empty_bank(&dir.join(format!("run-{spelling}-{round}-{clients}")));
                RunServer::start(bank, true)
            });
            let server = fresh.as_ref().or(shared_server.as_ref()).expect("a server");
            let addr = server.base.strip_prefix("http://").unwrap_or(&server.base);
            let requests: Vec<Vec<Vec<u8>>> = bodies
                .iter()
                .map(|b| b.iter().map(|body| post_request(addr, "/v1/nodes", body)).collect())
                .collect();
            let run = insert_run(&server.base, addr, clients, &requests);
            print_insert_run(spelling, round, clients, &run);
            runs.entry(clients).or_default().push(run);
            if let Some(server) = fresh {
                server.stop();
            }
        }
    }
    runs
}

/// The server of an insert run. By default each run inserts into an empty
/// bank under a server of its own, both gone (the bank deleted) before
/// the next run: every run starts from the same state. On this project's
/// VMs the page cache fills pages it takes for the first time ~10x slower
/// than pages just freed (415 against 4,700 MB/s, a plain C write loop), so
/// with one bank growing across runs (`INSERT_BANK=shared`), later runs
/// measured the VM's memory more than the server. `INSERT_INTO=PATH` runs
/// them all into that existing bank instead.
struct RunServer {
    base: String,
    bank: PathBuf,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
    /// Removed with its bank when stopped.
    owned: bool,
}

impl RunServer {
    fn start(bank: PathBuf, owned: bool) -> RunServer {
        let (stop, asked) = tokio::sync::oneshot::channel::<()>();
        let (base, thread) = start_until(&bank, insert_sync(), insert_listen(&bank), async move {
            let _ = asked.await;
        });
        RunServer {
            base,
            bank,
            stop,
            thread,
            owned,
        }
    }

    /// Stops the server (it checkpoints), then removes its bank.
    fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
        if self.owned {
            std::fs::remove_dir_all(&self.bank).unwrap();
        }
    }
}

/// A fresh empty bank of 768 dimensions at `path`.
fn empty_bank(path: &Path) -> PathBuf {
    Bank::create_dir(path, BankConfig::new(DIM as u32))
        .unwrap()
        .close()
        .unwrap();
    path.to_path_buf()
}

/// An insert body with its embedding spelled as a JSON array (each f32
/// in the shortest decimal that reads back exactly, ~10 KB for 768) or
/// as base64 of its little-endian bytes (4 KB).
fn insert_body(c: usize, i: usize, spelling: &str) -> String {
    let mut r = Rng((c * 100_000 + i) as u64 + 1);
    let v = random_unit(&mut r);
    let embedding = match spelling {
        "base64" => serde_json::json!(encode_base64_f32(&v)),
        _ => serde_json::json!(v),
    };
    serde_json::json!({"tree": "task", "attach": "root", "label": "SUCCESS",
        "scenario": format!("c{c} i{i}"), "payload": {}, "embedding": embedding})
    .to_string()
}

/// The insert server's sync policy: always, or none with
/// `INSERT_SYNC=none` (the peer without fsyncs).
fn insert_sync() -> SyncPolicy {
    match std::env::var("INSERT_SYNC").is_ok_and(|s| s == "none") {
        true => SyncPolicy::None,
        false => SyncPolicy::Always,
    }
}

/// Whether the insert clients run on one event loop (`INSERT_DRIVER=loop`)
/// instead of a thread each.
fn event_loop_driver() -> bool {
    std::env::var("INSERT_DRIVER").is_ok_and(|d| d == "loop")
}

/// (latencies, CPU seconds, context switches) of the load generator.
type Driven = (Vec<f64>, f64, f64);

/// Each client on a thread of its own (`send_until`), as separate agent
/// processes would be; each thread measures its CPU.
fn drive_from_threads(addr: &str, started: Instant, clients: usize, count: usize, requests: &[Vec<Vec<u8>>]) -> Driven {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let requests = &requests[c];
                std::thread::Builder::new()
                    .name(format!("load-client-{c}"))
                    .spawn_scoped(scope, move || {
                        let before = usage(libc::RUSAGE_THREAD);
                        let out = send_until(addr, started, count, requests);
                        let after = usage(libc::RUSAGE_THREAD);
                        (out, after.0 - before.0, after.1 - before.1)
                    })
                    .unwrap()
            })
            .collect();
        let mut all = (Vec::new(), 0.0, 0.0);
        for h in handles {
            let (latencies, cpu, switches) = h.join().unwrap();
            all.0.extend(latencies);
            all.1 += cpu;
            all.2 += switches;
        }
        all
    })
}

/// Every client on one thread's event loop (`send_all_until`), as one
/// process driving many episodes (or wrk) would.
fn drive_from_one_loop(
    addr: &str,
    started: Instant,
    clients: usize,
    count: usize,
    requests: &[Vec<Vec<u8>>],
) -> Driven {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("load-loop".into())
            .spawn_scoped(scope, || {
                let before = usage(libc::RUSAGE_THREAD);
                let out = send_all_until(addr, started, clients, count, requests);
                let after = usage(libc::RUSAGE_THREAD);
                (out, after.0 - before.0, after.1 - before.1)
            })
            .unwrap()
            .join()
            .unwrap()
    })
}

/// `clients` clients posting inserts for `INSERT_RUN` (at most
/// `INSERT_RUN_MAX` in all), on threads or one event loop
/// (`INSERT_DRIVER`); the load generator reports the CPU it used, so its
/// share is told from the server's.
fn insert_run(base: &str, addr: &str, clients: usize, requests: &[Vec<Vec<u8>>]) -> InsertRun {
    let before = (usage(libc::RUSAGE_SELF), write_counters(base), checkpoint_seconds(base));
    let started = Instant::now();
    let per_client = INSERT_RUN_MAX / clients;
    let (latencies_ms, client_cpu_s, client_switches) = match event_loop_driver() {
        true => drive_from_one_loop(addr, started, clients, per_client, requests),
        false => drive_from_threads(addr, started, clients, per_client, requests),
    };
    let seconds = started.elapsed().as_secs_f64();
    let after = (usage(libc::RUSAGE_SELF), write_counters(base), checkpoint_seconds(base));
    let process_cpu_s = after.0.0 - before.0.0;
    InsertRun {
        run: Run {
            seconds,
            cpu_seconds: process_cpu_s,
            latencies_ms,
            first_ms: Vec::new(),
            steady_ms: Vec::new(),
        },
        client_cpu_s,
        server_cpu_s: process_cpu_s - client_cpu_s,
        switches: after.0.1 - before.0.1,
        client_switches,
        syncs: after.1.0 - before.1.0,
        rounds: after.1.1 - before.1.1,
        checkpoint_s: after.2 - before.2,
    }
}

/// One client's closed loop: post, read the answer, again, until `limit`
/// has passed since `started` or `count` requests were sent; the latencies.
fn post_until<S: AsRef<str>>(
    url: &str,
    started: Instant,
    limit: Duration,
    count: usize,
    body: impl Fn(usize) -> S,
) -> Vec<f64> {
    let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
    let mut out = Vec::new();
    for i in 0..count {
        if started.elapsed() > limit {
            break;
        }
        let text = body(i);
        let t = Instant::now();
        let mut r = agent
            .post(url)
            .header("content-type", "application/json")
            .send(text.as_ref())
            .unwrap();
        let _ = r.body_mut().read_to_string().unwrap();
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out
}

/// A whole HTTP/1.1 POST of a JSON `body`, headers and body in one buffer.
fn post_request(addr: &str, path: &str, body: &str) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        host_of(addr),
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    request
}

/// The Host header for `addr` (a Unix socket has no host name).
fn host_of(addr: &str) -> &str {
    match addr.starts_with("unix:") {
        true => "localhost",
        false => addr,
    }
}

/// One insert client's closed loop on one keep-alive connection, as
/// `post_until` but lean: each request (built beforehand) goes out in one
/// write, so the server reads it in one go, and the answer is read with
/// one parse of its head. The load generator shares the two cores with
/// the server; ureq's per-request work (a liveness check of the pooled
/// connection, headers and body in two writes, URL and timeout handling)
/// was about a third of the CPU of an insert at 32 clients.
fn send_until(addr: &str, started: Instant, count: usize, requests: &[Vec<u8>]) -> Vec<f64> {
    let mut connection = Connection::open(addr);
    let mut out = Vec::new();
    for i in 0..count {
        if started.elapsed() > INSERT_RUN {
            break;
        }
        let t = Instant::now();
        let status = connection.round_trip(&requests[i % requests.len()]);
        assert_eq!(status, 200, "insert refused");
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out
}

/// `clients` closed loops as `send_until`, each on its own keep-alive
/// connection, all driven by one thread's event loop (as wrk drives its
/// connections): the load generator then costs a thread's wake-up per
/// batch of ready answers instead of one per answer.
fn send_all_until(addr: &str, started: Instant, clients: usize, count: usize, requests: &[Vec<Vec<u8>>]) -> Vec<f64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..clients)
            .map(|c| tokio::spawn(closed_loop(addr.to_string(), started, count, requests[c].clone())))
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    })
}

/// One client of `send_all_until`: `send_until` on a non-blocking socket.
async fn closed_loop(addr: String, started: Instant, count: usize, requests: Vec<Vec<u8>>) -> Vec<f64> {
    match addr.strip_prefix("unix:") {
        Some(path) => {
            let stream = tokio::net::UnixStream::connect(path).await.unwrap();
            closed_loop_on(stream, started, count, requests).await
        }
        None => {
            let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
            stream.set_nodelay(true).unwrap();
            closed_loop_on(stream, started, count, requests).await
        }
    }
}

/// What `closed_loop` needs of a tokio stream (TCP and Unix have the
/// same methods, but no trait of tokio's names them).
trait Nonblocking {
    async fn writable(&self) -> std::io::Result<()>;
    async fn readable(&self) -> std::io::Result<()>;
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize>;
    fn try_read(&self, buf: &mut [u8]) -> std::io::Result<usize>;
}

macro_rules! nonblocking {
    ($stream:ty) => {
        impl Nonblocking for $stream {
            async fn writable(&self) -> std::io::Result<()> {
                <$stream>::writable(self).await
            }
            async fn readable(&self) -> std::io::Result<()> {
                <$stream>::readable(self).await
            }
            fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
                <$stream>::try_write(self, buf)
            }
            fn try_read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
                <$stream>::try_read(self, buf)
            }
        }
    };
}
nonblocking!(tokio::net::TcpStream);
nonblocking!(tokio::net::UnixStream);

async fn closed_loop_on<S: Nonblocking>(stream: S, started: Instant, count: usize, requests: Vec<Vec<u8>>) -> Vec<f64> {
    let (mut out, mut buf) = (Vec::new(), Vec::with_capacity(4096));
    for i in 0..count {
        if started.elapsed() > INSERT_RUN {
            break;
        }
        let t = Instant::now();
        let request = &requests[i % requests.len()];
        let mut sent = 0;
        while sent < request.len() {
            stream.writable().await.unwrap();
            match stream.try_write(&request[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        buf.clear();
        let mut chunk = [0u8; 4096];
        let status = loop {
            stream.readable().await.unwrap();
            match stream.try_read(&mut chunk) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("{e}"),
            }
            if let Some((status, len)) = complete_response(&buf) {
                assert_eq!(len, buf.len(), "bytes after the answer");
                break status;
            }
        };
        assert_eq!(status, 200, "insert refused");
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out
}

/// A keep-alive HTTP/1.1 connection for `send_until`, over TCP or, for
/// `unix:PATH`, a Unix socket.
struct Connection {
    stream: Box<dyn ReadWrite>,
    buf: Vec<u8>,
}

trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

impl Connection {
    fn open(addr: &str) -> Connection {
        let stream: Box<dyn ReadWrite> = match addr.strip_prefix("unix:") {
            Some(path) => Box::new(std::os::unix::net::UnixStream::connect(path).unwrap()),
            None => {
                let stream = std::net::TcpStream::connect(addr).unwrap();
                stream.set_nodelay(true).unwrap();
                Box::new(stream)
            }
        };
        Connection {
            stream,
            buf: Vec::with_capacity(4096),
        }
    }

    /// Sends one request and reads its whole answer; the status.
    fn round_trip(&mut self, request: &[u8]) -> u16 {
        use std::io::{Read, Write};
        self.stream.write_all(request).unwrap();
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
            if let Some((status, len)) = complete_response(&self.buf) {
                assert_eq!(len, self.buf.len(), "bytes after the answer");
                return status;
            }
        }
    }
}

/// (status, length) of the response `buf` starts with, once all of it
/// (head and `content-length` bytes of body) has arrived.
fn complete_response(buf: &[u8]) -> Option<(u16, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head) = response.parse(buf).unwrap() else {
        return None;
    };
    let body: usize = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
        .expect("an answer with a content-length");
    (buf.len() >= head + body).then_some((response.code.unwrap(), head + body))
}

fn print_insert_run(spelling: &str, round: usize, clients: usize, r: &InsertRun) {
    let n = r.run.latencies_ms.len() as f64;
    println!(
        "insert ({spelling}) {clients:>2} clients (round {round}): {:>8.1} w/s  p50 {:>6.3} ms  p99 {:>6.3} ms  {:>4.1}% over 1 ms  {:>6} inserts; \
         CPU/insert {:>5.0} us = server {:>5.0} + clients {:>4.0}; switches {:.1} + {:.1}, {:.1} inserts/fsync, {:.1}/round; checkpoints {:.0}% of the run; load {}",
        r.run.rate(),
        r.run.pct(0.5),
        r.run.pct(0.99),
        100.0 * r.run.latencies_ms.iter().filter(|&&ms| ms > 1.0).count() as f64 / n.max(1.0),
        n,
        r.per_insert_us(r.run.cpu_seconds),
        r.per_insert_us(r.server_cpu_s),
        r.per_insert_us(r.client_cpu_s),
        (r.switches - r.client_switches) / n.max(1.0),
        r.client_switches / n.max(1.0),
        n / r.syncs.max(1.0),
        n / r.rounds.max(1.0),
        100.0 * r.checkpoint_s / r.run.seconds,
        load_average()
    );
}

/// (CPU seconds, user + system; context switches) of this process or thread.
fn usage(who: libc::c_int) -> (f64, f64) {
    // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage; `who` is RUSAGE_SELF or RUSAGE_THREAD.
    if unsafe { libc::getrusage(who, &mut u) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(u.ru_utime) + secs(u.ru_stime), (u.ru_nvcsw + u.ru_nivcsw) as f64)
}

/// The server's (fsyncs, write rounds) counters.
fn write_counters(base: &str) -> (f64, f64) {
    counters(base, ["deltamem_wal_syncs_total", "deltamem_write_rounds_total"])
}

/// Seconds the server's checkpoints took so far, both halves.
fn checkpoint_seconds(base: &str) -> f64 {
    let (prepare, publish) = counters(
        base,
        [
            "deltamem_checkpoint_prepare_seconds_total",
            "deltamem_checkpoint_publish_seconds_total",
        ],
    );
    prepare + publish
}

/// CPU seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    usage(libc::RUSAGE_SELF).0
}

/// The batch kernel in the library: 32 queries in one `query_batch` pass
/// against the same 32 as single queries, interleaved; GFLOP/s per wall
/// second and per CPU second (the latter is what a loaded machine still
/// lets one see of the kernel's speed).
fn batch_phase(library: &Bank, queries: &[Vec<f32>], nodes: usize) {
    let options = QueryOptions::default();
    let batch = &queries[..32];
    let flop = 2.0 * (batch.len() * nodes * DIM) as f64;
    let (mut pass, mut singles) = (Vec::new(), Vec::new());
    let (mut pass_cpu, mut singles_cpu) = (0.0, 0.0);
    for _ in 0..5 {
        let (t, c) = (Instant::now(), cpu_seconds());
        std::hint::black_box(library.query_batch("task", batch, &options).unwrap());
        pass.push(t.elapsed().as_secs_f64());
        pass_cpu += cpu_seconds() - c;
        let (t, c) = (Instant::now(), cpu_seconds());
        for q in batch {
            std::hint::black_box(library.query("task", q, &options).unwrap());
        }
        singles.push(t.elapsed().as_secs_f64());
        singles_cpu += cpu_seconds() - c;
    }
    let (pass, singles) = (median(pass), median(singles));
    println!(
        "query_batch of 32: one pass {:.1} ms ({:.1} GFLOP/s wall, {:.1} GFLOP/s per CPU second); \
         32 single queries {:.1} ms ({:.1} GFLOP/s per CPU second); pass/singles time {:.2}",
        pass * 1e3,
        flop / pass / 1e9,
        5.0 * flop / pass_cpu.max(1e-9) / 1e9,
        singles * 1e3,
        5.0 * flop / singles_cpu.max(1e-9) / 1e9,
        pass / singles
    );
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .next()
        .unwrap_or("?")
        .to_string()
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

/// Prints each client count's medians; the ratio target when both 1 and
/// 32 clients ran.
fn insert_summary(
    runs: &BTreeMap<usize, Vec<InsertRun>>,
    spelling: &str,
    rounds: usize,
    counts: &[usize],
) -> Option<String> {
    let rate = |clients: usize| median(runs[&clients].iter().map(|r| r.run.rate()).collect());
    let cpu_us = |clients: usize, part: fn(&InsertRun) -> f64| {
        median(runs[&clients].iter().map(|r| r.per_insert_us(part(r))).collect())
    };
    for &clients in counts {
        println!(
            "insert ({spelling}) {clients:>2} clients, median of {rounds}: {:>8.1} w/s, CPU/insert server {:.0} us + clients {:.0} us",
            rate(clients),
            cpu_us(clients, |r| r.server_cpu_s),
            cpu_us(clients, |r| r.client_cpu_s)
        );
    }
    if !(runs.contains_key(&1) && runs.contains_key(&32)) {
        return None;
    }
    let ratio = rate(32) / rate(1);
    if insert_sync() == SyncPolicy::None {
        println!("inserts without fsync (INSERT_SYNC=none), {spelling}: 32 clients = {ratio:.1}x one client");
        return None;
    }
    let verdict = verdict(ratio >= 10.0);
    let driver = match event_loop_driver() {
        true => "one event loop",
        false => "a thread each",
    };
    Some(format!(
        "32-client durable inserts, embeddings as {spelling}, clients on {driver} = {ratio:.1}x the 1-client rate, medians (>= 10x): {verdict}"
    ))
}

fn main() {
    let nodes: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let phases = std::env::args()
        .nth(2)
        .unwrap_or_else(|| "overhead,batch,query,insert".into());
    let wants = |phase: &str| phases.split(',').any(|p| p == phase);
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big");
    build_bank(&big, nodes);
    let mut rng = Rng(11);
    let queries: Vec<Vec<f32>> = (0..64).map(|_| random_unit(&mut rng)).collect();
    let bodies: Vec<String> = queries
        .iter()
        .map(|q| serde_json::json!({"embedding": q}).to_string())
        .collect();
    println!(
        "bank: {nodes} x {DIM} f32, {} scan threads, load average at start {}",
        threads(),
        load_average()
    );
    let mut targets = Vec::new();
    let base = start(&big, SyncPolicy::Always, loopback());
    if wants("overhead") {
        let library = library_bank(&big);
        let (lib_ms, http_ms) = overhead_ms(&library, &format!("{base}/v1/trees/task/query"), &queries, &bodies);
        let over = http_ms - lib_ms;
        println!("1 client, interleaved: library Bank::query median {lib_ms:.3} ms, HTTP query median {http_ms:.3} ms");
        targets.push(format!(
            "server overhead at 1 client = {over:.3} ms over the library median (< 0.3 ms): {}",
            verdict(over < 0.3)
        ));
    }
    if wants("batch") {
        batch_phase(&library_bank(&big), &queries, nodes);
    }
    if wants("query") {
        let runs = query_phase(&base, &bodies);
        // Judged on the load as it runs: each client's first request is
        // left out on both sides. At the start all 32 clients send at the
        // same instant to an idle server (one query's pass, then a
        // rotation for the other 31): a burst, printed in the run's line
        // above and in the ratio with it below, not the sustained load.
        let p99_ratio = runs[2].steady_pct(0.99) / runs[0].steady_pct(0.5);
        let with_first = runs[2].pct(0.99) / runs[0].pct(0.5);
        targets.push(format!(
            "query p99 at 32 clients = {p99_ratio:.2}x the 1-client median, each client's first request left out \
             ({with_first:.2}x with it) (< 5x): {}",
            verdict(p99_ratio < 5.0)
        ));
    }
    if wants("insert") {
        let rounds = std::env::var("INSERT_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(3);
        // INSERT_CLIENTS=32 runs only that count (to profile it); up to
        // 128, to see whether durable inserts still grow with clients
        // (the target is judged at 32).
        let counts: Vec<usize> = std::env::var("INSERT_CLIENTS")
            .ok()
            .map(|c| {
                c.split(',')
                    .filter_map(|n| n.parse().ok())
                    .filter(|n| (1..=MAX_INSERT_CLIENTS).contains(n))
                    .collect()
            })
            .unwrap_or_else(|| vec![1, 8, 32]);
        // INSERT_SPELLING=base64 runs only that spelling of the embedding.
        let spellings = std::env::var("INSERT_SPELLING").unwrap_or_else(|_| "array,base64".into());
        for spelling in spellings.split(',').filter(|s| ["array", "base64"].contains(s)) {
            let runs = insert_phase(dir.path(), spelling, rounds, &counts);
            targets.extend(insert_summary(&runs, spelling, rounds, &counts));
        }
    }
    println!("load average (1 min) at the end: {}", load_average());
    println!("targets:");
    for t in targets {
        println!("  {t}");
    }
    // `exit` (the servers' threads never end) skips destructors: remove
    // the banks (~1.3 GB at 100k nodes) first, or every run leaves them in
    // the temporary directory.
    if let Err(e) = dir.close() {
        eprintln!("server_load: cannot remove its banks: {e}");
    }
    std::process::exit(0);
}
