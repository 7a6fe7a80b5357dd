//! Counters for `/metrics` (Prometheus text exposition format).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::bank::Stats;

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS_S: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// One route's requests by status and its latency histogram.
#[derive(Default)]
struct Route {
    statuses: BTreeMap<u16, u64>,
    counts: [u64; BUCKETS_S.len()],
    total: u64,
    sum_s: f64,
}

#[derive(Default)]
pub struct Metrics {
    /// Route label -> its counters: one lock per request, and a route's
    /// label is allocated once, at its first request.
    routes: Mutex<BTreeMap<String, Route>>,
    wal_syncs: AtomicU64,
    write_rounds: AtomicU64,
    writes: AtomicU64,
    query_batches: AtomicU64,
    queries: AtomicU64,
    checkpoints: Checkpoints,
}

/// What the server's checkpoints cost, in microseconds: the first half
/// runs beside queries (read lock), the second holds the bank's exclusive
/// lock, so its time is what a query may wait behind a checkpoint.
#[derive(Default)]
struct Checkpoints {
    count: AtomicU64,
    prepare_us: AtomicU64,
    publish_us: AtomicU64,
    publish_max_us: AtomicU64,
}

impl Metrics {
    pub fn request(&self, route: &str, status: u16, seconds: f64) {
        let Ok(mut routes) = self.routes.lock() else { return };
        if !routes.contains_key(route) {
            routes.insert(route.to_string(), Route::default());
        }
        let entry = routes.get_mut(route).expect("inserted above");
        *entry.statuses.entry(status).or_default() += 1;
        for (count, bound) in entry.counts.iter_mut().zip(BUCKETS_S) {
            *count += u64::from(seconds <= bound);
        }
        entry.total += 1;
        entry.sum_s += seconds;
    }

    pub fn wal_sync(&self) {
        self.wal_syncs.fetch_add(1, Ordering::Relaxed);
    }

    pub fn write_round(&self, writes: usize) {
        self.write_rounds.fetch_add(1, Ordering::Relaxed);
        self.writes.fetch_add(writes as u64, Ordering::Relaxed);
    }

    /// A pass scored `queries` together.
    pub fn query_batch(&self, queries: usize) {
        self.query_pass();
        self.queries_scored(queries);
    }

    /// A pass over the column began: a lone pass, or a rotation of the
    /// circular scan (at its first chunk).
    pub fn query_pass(&self) {
        self.query_batches.fetch_add(1, Ordering::Relaxed);
    }

    /// Queries answered.
    pub fn queries_scored(&self, queries: usize) {
        self.queries.fetch_add(queries as u64, Ordering::Relaxed);
    }

    /// A checkpoint ran: `prepare` beside queries, `publish` under the
    /// exclusive lock.
    pub fn checkpoint(&self, prepare: Duration, publish: Duration) {
        let c = &self.checkpoints;
        let publish_us = publish.as_micros() as u64;
        c.count.fetch_add(1, Ordering::Relaxed);
        c.prepare_us.fetch_add(prepare.as_micros() as u64, Ordering::Relaxed);
        c.publish_us.fetch_add(publish_us, Ordering::Relaxed);
        c.publish_max_us.fetch_max(publish_us, Ordering::Relaxed);
    }

    pub fn wal_sync_count(&self) -> u64 {
        self.wal_syncs.load(Ordering::Relaxed)
    }

    pub fn write_round_count(&self) -> u64 {
        self.write_rounds.load(Ordering::Relaxed)
    }

    /// The exposition text; `stats` adds the bank's gauges.
    pub fn render(&self, stats: Option<&Stats>) -> String {
        let mut out = String::new();
        counter(
            &mut out,
            "deltamem_wal_syncs_total",
            "WAL fsyncs run by the writer.",
            &self.wal_syncs,
        );
        counter(
            &mut out,
            "deltamem_write_rounds_total",
            "Group-commit rounds (one fsync each).",
            &self.write_rounds,
        );
        counter(&mut out, "deltamem_writes_total", "Writes applied.", &self.writes);
        counter(
            &mut out,
            "deltamem_query_batches_total",
            "Passes over the column scoring queued queries together (a lone pass, or a rotation of the circular scan).",
            &self.query_batches,
        );
        counter(
            &mut out,
            "deltamem_queries_total",
            "Single queries scored.",
            &self.queries,
        );
        self.render_checkpoints(&mut out);
        out.push_str("# HELP deltamem_http_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE deltamem_http_requests_total counter\n");
        if let Ok(routes) = self.routes.lock() {
            for (route, r) in routes.iter() {
                for (status, n) in &r.statuses {
                    let _ = writeln!(
                        out,
                        "deltamem_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                    );
                }
            }
        }
        self.render_latency(&mut out);
        if let Some(s) = stats {
            render_stats(&mut out, s);
        }
        out
    }

    fn render_checkpoints(&self, out: &mut String) {
        let c = &self.checkpoints;
        counter(
            out,
            "deltamem_checkpoints_total",
            "Checkpoints run by the writer.",
            &c.count,
        );
        let seconds = |us: &AtomicU64| us.load(Ordering::Relaxed) as f64 / 1e6;
        metric(
            out,
            "deltamem_checkpoint_prepare_seconds_total",
            "counter",
            "Checkpoint time spent beside queries (read lock).",
            seconds(&c.prepare_us),
        );
        metric(
            out,
            "deltamem_checkpoint_publish_seconds_total",
            "counter",
            "Checkpoint time holding the bank's exclusive lock.",
            seconds(&c.publish_us),
        );
        metric(
            out,
            "deltamem_checkpoint_publish_seconds_max",
            "gauge",
            "The longest exclusive hold of one checkpoint.",
            seconds(&c.publish_max_us),
        );
    }

    fn render_latency(&self, out: &mut String) {
        out.push_str("# HELP deltamem_http_request_seconds HTTP request latency by route.\n");
        out.push_str("# TYPE deltamem_http_request_seconds histogram\n");
        let Ok(l) = self.routes.lock() else { return };
        for (route, h) in l.iter() {
            let name = "deltamem_http_request_seconds";
            for (count, bound) in h.counts.iter().zip(BUCKETS_S) {
                let _ = writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"{bound}\"}} {count}");
            }
            let _ = writeln!(out, "{name}_bucket{{route=\"{route}\",le=\"+Inf\"}} {}", h.total);
            let _ = writeln!(out, "{name}_sum{{route=\"{route}\"}} {}", h.sum_s);
            let _ = writeln!(out, "{name}_count{{route=\"{route}\"}} {}", h.total);
        }
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: &AtomicU64) {
    metric(out, name, "counter", help, value.load(Ordering::Relaxed));
}

/// One unlabelled metric with its HELP and TYPE lines.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

fn render_stats(out: &mut String, s: &Stats) {
    out.push_str("# HELP deltamem_nodes Nodes per tree.\n# TYPE deltamem_nodes gauge\n");
    for t in &s.trees {
        let _ = writeln!(
            out,
            "deltamem_nodes{{tree=\"{}\"}} {}",
            t.name.escape_default(),
            t.nodes
        );
    }
    out.push_str("# HELP deltamem_bank_bytes Bank bytes by part.\n# TYPE deltamem_bank_bytes gauge\n");
    for (part, bytes) in [
        ("vectors", s.vector_bytes),
        ("table", s.table_bytes),
        ("payload", s.payload_bytes),
        ("wal", s.wal_bytes),
    ] {
        let _ = writeln!(out, "deltamem_bank_bytes{{part=\"{part}\"}} {bytes}");
    }
}
