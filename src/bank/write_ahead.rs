//! Vectors written ahead of the checkpoint (`Bank::write_vectors_ahead`):
//! a thread of the bank's own writes committed nodes' vectors into the
//! segment files, past the checkpoint's bounds, while commits go on. A
//! checkpoint then writes only the few vectors not sent yet and fsyncs.
//!
//! Why: a server under a stream of inserts applies no write while its
//! checkpoint runs, and most of a checkpoint was copying a WAL's worth of
//! vectors (~64 MiB) into fresh page-cache pages: 23-24% of a 32-client
//! insert run (`examples/server_load.rs`). The bytes are the same and go
//! through the page cache the same way (queries soon read them); only
//! when and on which thread changes. Nothing refers to them until the
//! checkpoint's manifest does (FORMAT.md §7), so a crash leaves them as
//! leftovers, like an interrupted checkpoint's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::BankError;
use super::segment_writer::SegmentWriter;

/// Vectors per piece handed to the thread, in bytes: large enough that a
/// piece costs one write and one wake-up per ~340 768-dim inserts, small
/// enough that a checkpoint finds at most this much left to write.
const PIECE_BYTES: usize = 1 << 20;

/// Pieces queued for the thread at most; past that a commit sends
/// nothing (the checkpoint writes those vectors itself, or a later commit
/// sends them) rather than wait, and copies nothing.
const QUEUE_PIECES: usize = 16;

enum Job {
    /// A new checkpoint cycle: vectors go through this writer (made for
    /// the current manifest, so for the current data files). Boxed: a
    /// piece, the common job, is small.
    Start(Box<SegmentWriter>),
    /// Vectors of consecutive nodes from this index.
    Piece(u32, Vec<f32>),
    /// Hand back the cycle's writer (its files to fsync), or the first
    /// write error, once every piece before this is written.
    Finish(Sender<Result<Option<SegmentWriter>, BankError>>),
}

/// The bank's side of the thread.
pub(super) struct WriteAhead {
    /// Under a mutex: a checkpoint's first half runs on a shared borrow.
    state: Mutex<State>,
    thread: Option<JoinHandle<()>>,
    /// Send once this many bytes of vectors are waiting (`PIECE_BYTES`).
    piece_bytes: usize,
    /// Pieces sent and not written yet (the thread counts them down).
    in_flight: Arc<AtomicUsize>,
}

struct State {
    jobs: Option<SyncSender<Job>>,
    spare: Receiver<Vec<f32>>,
    /// The nodes from the overlay's base up to here were sent in this
    /// cycle; None between a checkpoint's first half and the next cycle.
    sent_end: Option<u32>,
}

impl WriteAhead {
    /// Starts the thread and a first cycle from `base_count`.
    pub fn start(writer: SegmentWriter, base_count: u32, piece_bytes: usize) -> WriteAhead {
        let (jobs_tx, jobs_rx) = std::sync::mpsc::sync_channel(QUEUE_PIECES);
        let (spare_tx, spare_rx) = std::sync::mpsc::channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let written = in_flight.clone();
        let thread = std::thread::Builder::new()
            .name("deltamem-ahead".into())
            .spawn(move || run(jobs_rx, spare_tx, &written))
            .expect("spawning the write-ahead thread");
        let ahead = WriteAhead {
            state: Mutex::new(State {
                jobs: Some(jobs_tx),
                spare: spare_rx,
                sent_end: None,
            }),
            thread: Some(thread),
            piece_bytes,
            in_flight,
        };
        ahead.restart(writer, base_count);
        ahead
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new cycle from `base_count` with `writer` (after the manifest
    /// changed: a checkpoint, a compaction).
    pub fn restart(&self, writer: SegmentWriter, base_count: u32) {
        let mut state = self.state();
        let sent = state
            .jobs
            .as_ref()
            .is_some_and(|j| j.send(Job::Start(Box::new(writer))).is_ok());
        state.sent_end = sent.then_some(base_count);
    }

    /// Sends the vectors of committed nodes not sent yet, once they fill
    /// a piece: `vectors` holds those of nodes `base_count..`.
    pub fn offer(&self, base_count: u32, dim_count: usize, vectors: &[f32]) {
        let mut state = self.state();
        let Some(sent_end) = state.sent_end else {
            return;
        };
        let total = base_count + (vectors.len() / dim_count.max(1)) as u32;
        assert!(
            (base_count..=total).contains(&sent_end),
            "sent past the committed nodes"
        );
        let from = (sent_end - base_count) as usize * dim_count;
        let waiting_bytes = (vectors.len() - from) * size_of::<f32>();
        // A full queue (a slow disk): left for later, with no copy made.
        if waiting_bytes < self.piece_bytes.max(1) || self.in_flight.load(Ordering::Acquire) >= QUEUE_PIECES {
            return;
        }
        let mut piece = state.spare.try_recv().unwrap_or_default();
        piece.clear();
        piece.extend_from_slice(&vectors[from..]);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        match state.jobs.as_ref().map(|j| j.try_send(Job::Piece(sent_end, piece))) {
            Some(Ok(())) => state.sent_end = Some(total),
            Some(Err(TrySendError::Full(_))) => {
                self.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
            Some(Err(TrySendError::Disconnected(_))) | None => state.sent_end = None,
        }
    }

    /// Ends the cycle once everything sent is written: how far it reached
    /// (nodes from the base up to there are written) and the writer whose
    /// files the checkpoint must fsync; None if no cycle ran. A write
    /// error ends it too, and is the checkpoint's.
    pub fn finish(&self) -> Result<Option<(u32, SegmentWriter)>, BankError> {
        let mut state = self.state();
        let Some(sent_end) = state.sent_end.take() else {
            return Ok(None);
        };
        let (tx, rx) = std::sync::mpsc::channel();
        if state.jobs.as_ref().is_none_or(|j| j.send(Job::Finish(tx)).is_err()) {
            return Ok(None);
        }
        // The thread answers every Finish unless it panicked.
        Ok(rx.recv().unwrap_or(Ok(None))?.map(|writer| (sent_end, writer)))
    }
}

impl Drop for WriteAhead {
    /// Stops the thread after its queue, so no write of it lands after the
    /// bank (and its writer lock) is gone.
    fn drop(&mut self) {
        self.state().jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: writes each piece with the cycle's writer, keeping the
/// first error for `Finish`; returns the buffers for reuse.
fn run(jobs: Receiver<Job>, spare: Sender<Vec<f32>>, in_flight: &AtomicUsize) {
    let mut writer: Option<SegmentWriter> = None;
    let mut failed: Option<BankError> = None;
    for job in jobs {
        match job {
            Job::Start(w) => (writer, failed) = (Some(*w), None),
            Job::Piece(first, values) => {
                if let (Some(w), None) = (writer.as_mut(), failed.as_ref()) {
                    failed = w.put_vectors(first, &values).err();
                }
                in_flight.fetch_sub(1, Ordering::AcqRel);
                let _ = spare.send(values);
            }
            Job::Finish(reply) => {
                let outcome = match failed.take() {
                    Some(e) => Err(e),
                    None => Ok(writer.take()),
                };
                let _ = reply.send(outcome);
            }
        }
    }
}

impl super::Bank {
    /// Writes committed nodes' vectors into the data files on a thread of
    /// its own while commits go on, instead of all at the next checkpoint
    /// (see this module): for a server, whose writes wait while it
    /// checkpoints. A writer's option; nothing changes on disk but when
    /// the vectors are written. No effect on a reader or a second call.
    pub fn write_vectors_ahead(&mut self) {
        self.write_vectors_ahead_in_pieces(PIECE_BYTES);
    }

    /// As `write_vectors_ahead`, sending vectors to the thread once
    /// `piece_bytes` of them wait (1: after every commit that adds a node),
    /// for crash tests whose banks are too small to fill a piece.
    #[doc(hidden)]
    pub fn write_vectors_ahead_in_pieces(&mut self, piece_bytes: usize) {
        let segments = SegmentWriter::new(self.storage.clone(), &self.manifest, false);
        let base_count = self.overlay.base_count;
        if let Some(w) = self.writer.as_mut()
            && w.ahead.is_none()
        {
            w.ahead = Some(WriteAhead::start(segments, base_count, piece_bytes));
        }
    }

    fn ahead(&self) -> Option<&WriteAhead> {
        self.writer.as_ref()?.ahead.as_ref()
    }

    /// After a commit: hands the thread the committed vectors not sent
    /// yet, once they fill a piece (not during a bulk load, whose vectors
    /// have a writer thread of their own).
    pub(super) fn offer_ahead(&self) {
        if let Some(ahead) = self.ahead()
            && self.overlay.handoff.is_none()
        {
            let ov = &self.overlay;
            ahead.offer(ov.base_count, ov.dim_count as usize, &ov.vectors);
        }
    }

    /// Ends the thread's cycle for a checkpoint: how far it wrote, and
    /// the writer whose files to fsync (None without a cycle).
    pub(super) fn finish_ahead(&self) -> Result<Option<(u32, SegmentWriter)>, BankError> {
        self.ahead().map_or(Ok(None), WriteAhead::finish)
    }

    /// A new cycle after the manifest changed (new base, new generation).
    pub(super) fn restart_ahead(&self) {
        if let Some(ahead) = self.ahead() {
            let segments = SegmentWriter::new(self.storage.clone(), &self.manifest, false);
            ahead.restart(segments, self.overlay.base_count);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::format::row::Label;
    use crate::storage::{CountingStorage, MemStorage, Storage, data_file_generation};
    use crate::{Attach, Bank, BankConfig, NewNode, OpenOptions, SyncPolicy};

    const DIM: usize = 256; // 1 KiB vectors: 1,024 to a piece

    fn node(k: usize) -> NewNode {
        NewNode {
            tree: "task".into(),
            attach: Attach::Root,
            label: Label::Success,
            payload: crate::Payload {
                scenario: format!("node {k}"),
                fields: Default::default(),
            },
            embedding: (0..DIM).map(|i| ((i * 31 + k * 7) % 97) as f32 - 48.0).collect(),
            external_id: None,
        }
    }

    fn vector_bytes(storage: &CountingStorage<MemStorage>) -> u64 {
        let counts = storage.counts();
        counts
            .written_bytes
            .iter()
            .filter(|(n, _)| n.starts_with("vectors"))
            .map(|(_, b)| b)
            .sum()
    }

    /// Vector bytes written so far, once the thread has written at least
    /// `at_least` (it writes on its own time; bounded wait).
    fn settled(storage: &CountingStorage<MemStorage>, at_least: u64) -> u64 {
        let started = Instant::now();
        while vector_bytes(storage) < at_least && started.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        vector_bytes(storage)
    }

    /// Each node's stored vector is its embedding, normalised.
    fn assert_holds(bank: &Bank, count: usize) {
        assert!(bank.verify().unwrap().problems.is_empty());
        for k in (0..count).step_by(97).chain([count - 1]) {
            let raw = node(k).embedding;
            let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
            let stored = bank.vector(k as u32).unwrap();
            let cosine = stored.iter().zip(&raw).map(|(s, r)| s * r).sum::<f32>() / norm;
            assert!((cosine - 1.0).abs() < 1e-5, "node {k}: {cosine}");
        }
    }

    /// Commits hand whole pieces to the thread as they come; the
    /// checkpoint then writes only the vectors not sent (not all of them
    /// again); the bank reads back whole, before and after a compaction,
    /// which moves later writes ahead to the new generation's files.
    #[test]
    fn a_checkpoint_writes_only_the_vectors_not_written_ahead() {
        let storage = Arc::new(CountingStorage::new(MemStorage::new()));
        let options = OpenOptions {
            sync: SyncPolicy::None,
            checkpoint_wal_bytes: u64::MAX,
            ..OpenOptions::default()
        };
        Bank::create(storage.clone(), BankConfig::new(DIM as u32))
            .unwrap()
            .close()
            .unwrap();
        let mut bank = Bank::open(storage.clone(), options).unwrap();
        bank.write_vectors_ahead();
        storage.reset();
        let stride = (DIM * 4) as u64;
        for k in 0..3000 {
            bank.insert(node(k)).unwrap();
        }
        // Pieces of 1,024 vectors went at 1,024 and 2,048 commits.
        assert_eq!(settled(&storage, 2048 * stride), 2048 * stride);
        storage.reset();
        bank.checkpoint().unwrap();
        assert_eq!(vector_bytes(&storage), (3000 - 2048) * stride);
        assert_holds(&bank, 3000);
        bank.compact().unwrap();
        storage.reset();
        for k in 3000..4500 {
            bank.insert(node(k)).unwrap();
        }
        assert_eq!(settled(&storage, 1024 * stride), 1024 * stride);
        bank.close().unwrap();
        let names = storage.list().unwrap();
        let generations: Vec<_> = names.iter().filter_map(|n| data_file_generation(n)).collect();
        assert!(generations.iter().all(|&g| g == 1), "{names:?}");
        let reopened = Bank::open(storage, OpenOptions::default()).unwrap();
        assert_eq!(reopened.node_count(), 4500);
        assert_holds(&reopened, 4500);
    }

    /// A bulk load after vectors were written ahead: the load waits for the
    /// thread, its checkpoint writes every new vector, and the bank reads
    /// back whole, the loaded nodes and the committed ones before them.
    #[test]
    fn a_load_after_writes_ahead_reads_back_whole() {
        let storage = Arc::new(CountingStorage::new(MemStorage::new()));
        let mut bank = Bank::create(storage.clone(), BankConfig::new(DIM as u32)).unwrap();
        bank.write_vectors_ahead();
        for k in 0..1500 {
            bank.insert_with(node(k), Some(SyncPolicy::None)).unwrap();
        }
        let changes: Vec<crate::Change> = (1500..2500).map(|k| crate::Change::Insert(node(k))).collect();
        bank.load(&changes).unwrap();
        assert_holds(&bank, 2500);
        drop(bank);
        let reopened = Bank::open(storage, OpenOptions::default()).unwrap();
        assert_eq!(reopened.node_count(), 2500);
        assert_holds(&reopened, 2500);
    }
}
