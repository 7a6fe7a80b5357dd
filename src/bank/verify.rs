//! `verify`: checks every checksum and structural invariant and reports
//! each problem with its file and offset, instead of stopping at the first.

use super::open::{WAL_READ_ATTEMPTS, read_manifest, scan_wal};
use super::{Bank, BankError, external_key};
use crate::format::payload::decode_record;
use crate::format::row::{ROW_SIZE_BYTES, Row};
use crate::format::{NODE_NONE, crc32};
use crate::storage::{
    MANIFEST_FILE, StorageError, WAL_FILE, payload_file, qvector_segment_file, table_segment_file, vector_segment_file,
};

#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub file: String,
    pub offset_bytes: u64,
    pub detail: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct VerifyReport {
    pub nodes_checked: u64,
    pub wal_records: u64,
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// How much of a bank `verify_scope` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyScope {
    /// Every file: WAL, rows, vectors, int8 rows, payload records.
    Everything,
    /// All but the vector columns (f32/f16 and int8): WAL, rows and their
    /// links, payload records. For a copy whose vectors were checked in
    /// memory as they were copied (`freeze`): the column is most of a
    /// bank's bytes, and the scan checks it on first read anyway.
    SkipVectorColumns,
}

/// Most views a reader's verify checks while its writer's compacts move
/// the bank to new generations under it.
const VERIFY_VIEWS: usize = 4;

/// More problems than this and the rest are not listed one by one.
const MAX_PROBLEMS: usize = 1000;

impl VerifyReport {
    /// Adds a problem unless the same one (file, offset, detail) is
    /// listed: a damaged row fails both the row's read and its segment's
    /// mapping, and was counted twice.
    fn add(&mut self, file: String, offset_bytes: u64, detail: String) {
        if self.problems.len() >= MAX_PROBLEMS {
            return;
        }
        let listed = self
            .problems
            .iter()
            .any(|p| p.offset_bytes == offset_bytes && p.file == file && p.detail == detail);
        if !listed {
            self.problems.push(Problem {
                file,
                offset_bytes,
                detail,
            });
        }
    }

    fn add_error(&mut self, bank_dir: &str, e: BankError) {
        let p = Problem::from_error(bank_dir, e);
        self.add(p.file, p.offset_bytes, p.detail);
    }
}

impl Problem {
    /// The problem an error names: its file and offset when it is
    /// corruption, else the bank directory as a whole (also for an error
    /// that stops the bank from opening, e.g. a damaged MANIFEST).
    pub fn from_error(bank_dir: &str, e: BankError) -> Problem {
        let (file, offset_bytes, detail) = match e {
            BankError::Corrupt {
                file,
                offset_bytes,
                detail,
            } => (file, offset_bytes, detail),
            BankError::Storage(StorageError::Corrupt {
                file,
                offset_bytes,
                error,
            }) => (file, offset_bytes, error.to_string()),
            BankError::WalDamaged {
                ref file, offset_bytes, ..
            } => (file.clone(), offset_bytes, e.to_string()),
            // A file that cannot be opened or read: the file, not the
            // bank as a whole, is what the problem is about.
            BankError::Storage(StorageError::Io { ref file, .. }) => (file.clone(), 0, e.to_string()),
            BankError::ManifestMissing { .. } => {
                let manifest = format!("{}/{MANIFEST_FILE}", bank_dir.trim_end_matches('/'));
                (manifest, 0, e.to_string())
            }
            other => (bank_dir.to_string(), 0, other.to_string()),
        };
        Problem {
            file,
            offset_bytes,
            detail,
        }
    }
}

/// What checking one node-table segment found.
#[derive(Default)]
struct SegmentCheck {
    report: VerifyReport,
    /// Payload log offsets of the segment's first record and of the end
    /// of its last (for the contiguity check across segments); None when
    /// that row could not be read (it is reported once, as itself).
    payload_start: Option<(u32, u64)>,
    payload_end: Option<u64>,
    /// A hash of each external id in the segment, with its row.
    external_ids: Vec<(u64, u32)>,
}

impl Bank {
    /// Checks every WAL record, row, vector, int8 row and payload record
    /// and lists every problem. Segments are checked on parallel threads
    /// (checksums and payload decompression are the bottleneck), each
    /// streaming its payload records in large reads; memory is bounded by
    /// one segment's rows per thread.
    pub fn verify(&self) -> Result<VerifyReport, BankError> {
        self.verify_scope(VerifyScope::Everything)
    }

    /// `verify` of what `scope` covers; with `SkipVectorColumns` no vector
    /// segment is mapped or read.
    ///
    /// A reader whose bank was compacted by its writer between reading the
    /// manifest and opening the files finds them gone, which is not
    /// damage: while the manifest names another generation than the view
    /// checked, the check runs again on a fresh view (at most
    /// `VERIFY_VIEWS` views in all). Found beside a compact in another
    /// process: 15 of 466 verifies of a sound bank said it was damaged.
    pub fn verify_scope(&self, scope: VerifyScope) -> Result<VerifyReport, BankError> {
        let mut report = self.verify_view(scope)?;
        let mut generation = self.manifest.generation;
        for _ in 1..VERIFY_VIEWS {
            // The manifest is read again only for a reader that found
            // problems.
            if report.is_ok()
                || self.writer.is_some()
                || !read_manifest(self.storage.as_ref()).is_ok_and(|m| m.generation != generation)
            {
                break;
            }
            let fresh = self.reopened()?;
            generation = fresh.manifest.generation;
            report = fresh.verify_view(scope)?;
        }
        Ok(report)
    }

    fn verify_view(&self, scope: VerifyScope) -> Result<VerifyReport, BankError> {
        let mut report = VerifyReport::default();
        self.verify_wal(&mut report)?;
        // A payload log that cannot be opened is one problem, not one per
        // node (nor a failed verify): without it the rows, vectors and
        // links are still checked, the payload records are not.
        let payloads_readable = match self.base.payload_handle() {
            Ok(_) => true,
            Err(e) => {
                report.add_error(&self.storage.describe(""), e);
                false
            }
        };
        let segments = self.base.node_count.div_ceil(self.base.rows_per_segment);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let per_thread = segments.div_ceil(threads.max(1)).max(1);
        let parts: Vec<Result<Vec<SegmentCheck>, BankError>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..segments.div_ceil(per_thread))
                .map(|t| {
                    let range = t * per_thread..((t + 1) * per_thread).min(segments);
                    s.spawn(move || {
                        range
                            .map(|segment| self.verify_segment(segment, scope, payloads_readable))
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        });
        let mut expected_payload_offset = Some(0u64);
        let mut external_ids = Vec::new();
        for check in parts.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().flatten() {
            if let Some((index, start)) = check.payload_start
                && expected_payload_offset.is_some_and(|expected| start != expected)
            {
                report.add(
                    self.storage.describe(&table_segment_file(
                        self.manifest.generation,
                        index / self.base.rows_per_segment,
                    )),
                    self.row_offset_bytes(index),
                    format!("node {index}: payload record not contiguous with the previous one"),
                );
            }
            expected_payload_offset = check.payload_end;
            external_ids.extend(check.external_ids);
            report.nodes_checked += check.report.nodes_checked;
            for p in check.report.problems {
                report.add(p.file, p.offset_bytes, p.detail);
            }
        }
        if let Some(end) = expected_payload_offset
            && end != self.manifest.payload_end_bytes
            && report.is_ok()
        {
            report.add(
                self.storage.describe(&payload_file(self.manifest.generation)),
                end,
                "payload log end disagrees with the manifest".into(),
            );
        }
        self.verify_unused_space(&mut report, scope)?;
        for index in self.base.node_count..self.node_count() {
            report.nodes_checked += 1;
            let row = self.row(index)?;
            if let Err(e) = self.check_links(&row) {
                report.add_error(&self.storage.describe(""), e);
            }
            // Replay checked the payload record's framing and CRC; what it
            // holds is read here, as for checkpointed nodes.
            if let Err(e) = self.payload(index) {
                report.add_error(&self.storage.describe(""), e);
            }
            if row.external_id_text().is_some() {
                external_ids.push((hash_external_id(&row), index));
            }
        }
        self.verify_external_ids_unique(external_ids, &mut report)?;
        Ok(report)
    }

    /// Reports each row whose external id an earlier row holds. Rows are
    /// compared by a 64-bit hash of their id (16 bytes a row, not a map
    /// of every id), and rows whose hashes collide are read again.
    fn verify_external_ids_unique(&self, mut ids: Vec<(u64, u32)>, report: &mut VerifyReport) -> Result<(), BankError> {
        ids.sort_unstable();
        for run in ids.chunk_by(|a, b| a.0 == b.0).filter(|run| run.len() > 1) {
            let rows = run
                .iter()
                .map(|&(_, index)| self.row(index))
                .collect::<Result<Vec<_>, _>>()?;
            for (at, row) in rows.iter().enumerate().skip(1) {
                let key = external_key(row.external_id, row.flags);
                if let Some(first) = rows[..at].iter().find(|r| external_key(r.external_id, r.flags) == key) {
                    report.add_error(&self.storage.describe(""), self.duplicate_external_id(first.index, row));
                }
            }
        }
        Ok(())
    }

    /// Rows, vectors (in `scope`) and payload records of one segment's nodes.
    fn verify_segment(
        &self,
        segment: u32,
        scope: VerifyScope,
        payloads_readable: bool,
    ) -> Result<SegmentCheck, BankError> {
        let mut check = SegmentCheck::default();
        let report = &mut check.report;
        let first = segment * self.base.rows_per_segment;
        let last = (first + self.base.rows_per_segment).min(self.base.node_count);
        let mut rows = Vec::with_capacity((last - first) as usize);
        for index in first..last {
            report.nodes_checked += 1;
            match self.base.row(index) {
                // A reader (a freeze beside a writer) may see a source row
                // that a later checkpoint rewrote with a link to a root past
                // its view: hidden as every read of the row hides it, not a
                // dangling link. A writer's view has no such row, so its
                // dangling link is damage.
                Ok(mut row) if self.writer.is_none() => {
                    self.hide_future_consolidation(&mut row);
                    rows.push(row);
                }
                Ok(row) => rows.push(row),
                // A row torn by a crashed checkpoint is superseded by its
                // WAL image and rewritten by the next checkpoint.
                Err(_) if self.overlay.patched.contains_key(&index) => rows.push(self.row(index)?),
                Err(e) => report.add_error(&self.storage.describe(""), e),
            }
        }
        // Contiguity is judged only between rows read one after the other:
        // a row that could not be read is reported once, as itself.
        let mut expected = None;
        let mut previous = None;
        for row in &rows {
            if previous.is_some_and(|p: u32| p + 1 != row.index) {
                expected = None;
            }
            previous = Some(row.index);
            if row.external_id_text().is_some() {
                check.external_ids.push((hash_external_id(row), row.index));
            }
            if expected.is_some_and(|at| at != row.payload_offset_bytes) {
                report.add(
                    self.storage
                        .describe(&table_segment_file(self.manifest.generation, segment)),
                    self.row_offset_bytes(row.index),
                    format!(
                        "node {}: payload record not contiguous with the previous one",
                        row.index
                    ),
                );
            }
            if row.index == first {
                check.payload_start = Some((row.index, row.payload_offset_bytes));
            }
            expected = Some(row.payload_offset_bytes + u64::from(row.payload_size_bytes));
        }
        check.payload_end = expected.filter(|_| previous == Some(last - 1));
        // verify_node skips the vector checks without maps (a failed
        // mapping is reported here, once).
        let maps = match scope {
            VerifyScope::SkipVectorColumns => None,
            VerifyScope::Everything => match self.base.segment_unverified(segment) {
                Ok(maps) => Some(maps),
                Err(e) => {
                    report.add_error(&self.storage.describe(""), e);
                    None
                }
            },
        };
        // A row superseded by its WAL image is checked as that image: its
        // vector, lane sums and payload record are the node's all the same.
        if !payloads_readable {
            rows.iter()
                .for_each(|row| self.verify_node(row, maps.as_deref(), None, report));
            return Ok(check);
        }
        self.base.for_each_payload_record(&rows, |row, record| {
            self.verify_node(row, maps.as_deref(), Some(record), report);
            Ok(())
        })?;
        Ok(check)
    }

    /// The WAL's scan, read again (up to `WAL_READ_ATTEMPTS` in all) while
    /// it shows damage, or for a reader a header that fails its checks: a
    /// read racing an append, or a recycling checkpoint's header rewrite.
    fn scan_wal_settled(&self) -> Result<crate::storage::wal::WalScan, BankError> {
        let reader = self.writer.is_none();
        let mut attempt = 1;
        loop {
            let last = attempt == WAL_READ_ATTEMPTS;
            attempt += 1;
            match scan_wal(self.storage.as_ref(), &self.manifest) {
                Ok(wal) if wal.damage.is_some() && !last => {}
                Err(BankError::Storage(StorageError::Corrupt { .. })) if reader && !last => {}
                scanned => return scanned,
            }
        }
    }

    fn verify_wal(&self, report: &mut VerifyReport) -> Result<(), BankError> {
        // Like opening, read again if damage shows: a read racing an
        // append must not be reported (see `open::read_consistent_state`).
        let wal = self.scan_wal_settled()?;
        report.wal_records = wal.records.len() as u64;
        if self.manifest.is_frozen() && (!wal.records.is_empty() || wal.stop_reason.is_some()) {
            let detail = "a frozen bank's WAL must hold its header only".to_string();
            report.add(
                self.storage.describe(WAL_FILE),
                crate::format::wal::WAL_HEADER_SIZE_BYTES as u64,
                detail,
            );
        }
        if wal.header.salt != self.manifest.wal_salt {
            return Ok(());
        }
        if let Some(damage) = &wal.damage {
            let e = BankError::wal_damaged(self.storage.describe(WAL_FILE), damage);
            report.add(self.storage.describe(WAL_FILE), damage.offset_bytes, e.to_string());
        }
        // A torn tail is not reported: without the lock, verify cannot
        // tell a crash's leftover (truncated by the next writer) from the
        // record a running writer is appending right now (FORMAT.md §8).
        Ok(())
    }

    /// The row's lane sums against its (checked) vector and int8 row: the
    /// scan checks first reads with them, so a row whose sums are wrong
    /// under a valid CRC (a forged row) would fail scans of a good vector.
    fn verify_lane_sums(&self, row: &Row, stored: &[u8], qrow: Option<&[u8]>, report: &mut VerifyReport) {
        use crate::format::row::{ROW_QVECTOR_SUM_OFFSET, ROW_VECTOR_SUM_OFFSET};
        let want = super::VectorChecks::of_stored(self.base.version, stored, qrow);
        let fields = [
            (want.sum32, row.vector_sum32, ROW_VECTOR_SUM_OFFSET, "vector_sum32"),
            (want.qsum32, row.qvector_sum32, ROW_QVECTOR_SUM_OFFSET, "qvector_sum32"),
        ];
        for (want, have, offset, name) in fields {
            // An int8 row that failed its own check was reported already.
            if want != have && (offset == ROW_VECTOR_SUM_OFFSET || qrow.is_some()) {
                let segment = row.index / self.base.rows_per_segment;
                let row_at = self.row_offset_bytes(row.index) as usize;
                report.add(
                    self.storage
                        .describe(&crate::storage::table_segment_file(self.manifest.generation, segment)),
                    (row_at + offset) as u64,
                    format!(
                        "{name} of node {} is {have:#010x}, its bytes give {want:#010x}",
                        row.index
                    ),
                );
            }
        }
    }

    /// Row shape, links, vector checksum and norm, padding, payload record.
    fn verify_node(
        &self,
        row: &Row,
        maps: Option<&super::base::SegmentMaps>,
        record: Option<Result<&[u8], BankError>>,
        report: &mut VerifyReport,
    ) {
        if let Err(e) = self.check_links(row) {
            report.add_error(&self.storage.describe(""), e);
        }
        let segment = row.index / self.base.rows_per_segment;
        // Named only when a problem is reported (a path per node was a
        // visible share of verify's time).
        let vec_desc = || {
            self.storage
                .describe(&vector_segment_file(self.manifest.generation, segment))
        };
        // A segment whose mapping failed was reported once by verify_segment.
        if let Some(maps) = maps {
            let range = self.base.vector_range(row.index);
            let stored = &maps.vectors[range.clone()];
            if crc32(stored) != row.vector_crc32 {
                report.add(
                    vec_desc(),
                    range.start as u64,
                    format!("vector of node {} fails its checksum", row.index),
                );
            } else {
                let v = self.base.decode_vector(stored);
                if let Some(norm) = super::off_unit_norm(&v) {
                    report.add(
                        vec_desc(),
                        range.start as u64,
                        format!("vector of node {} has norm {norm}", row.index),
                    );
                }
                // The int8 row is derived from the (now checked) f32
                // vector: equality with the recomputation is its check.
                let mut qrow = None;
                if let Some(quant) = &maps.quant {
                    let stored_q = &quant[self.base.qvector_range(row.index)];
                    match self.base.check_qvector(row.index, &v, stored_q, &mut Vec::new()) {
                        Ok(()) => qrow = Some(stored_q),
                        Err(e) => report.add_error(&self.storage.describe(""), e),
                    }
                }
                self.verify_lane_sums(row, stored, qrow, report);
            }
            let pad_end = range.start + self.base.stride_bytes as usize;
            if let Some(at) = maps.vectors[range.end..pad_end].iter().position(|&b| b != 0) {
                report.add(
                    vec_desc(),
                    (range.end + at) as u64,
                    format!("padding after the vector of node {} is not zero", row.index),
                );
            }
        }
        // None: the payload log could not be opened (reported once).
        match record {
            None => {}
            Some(Ok(record)) => {
                if let Err(e) = decode_record(record, row.index) {
                    report.add(
                        self.storage.describe(&payload_file(self.manifest.generation)),
                        row.payload_offset_bytes + e.offset_bytes(),
                        e.to_string(),
                    );
                }
            }
            Some(Err(e)) => report.add_error(&self.storage.describe(""), e),
        }
    }

    /// Parent, depth, type and consolidation links of one row.
    fn check_links(&self, row: &Row) -> Result<(), BankError> {
        let bad = |detail: String| {
            // A node the WAL added since the checkpoint is the WAL's (its
            // record's offset is not kept); it blamed the segment.
            let (file, offset_bytes) = match row.index >= self.overlay.base_count {
                true => (self.storage.describe(crate::storage::WAL_FILE), 0),
                false => (
                    self.storage.describe(&table_segment_file(
                        self.manifest.generation,
                        row.index / self.base.rows_per_segment,
                    )),
                    self.row_offset_bytes(row.index),
                ),
            };
            Err(BankError::Corrupt {
                file,
                offset_bytes,
                detail,
            })
        };
        let rule =
            crate::tree::shape_violation(row, self.manifest.trees.len(), self.manifest.max_depth, |p| self.row(p))?;
        if let Some(detail) = rule {
            return bad(detail);
        }
        // An imported consolidation has no link (the source tree did not
        // record the partner); a link, when present, must be mutual.
        if (row.is_consolidated() || row.is_consolidated_root()) && row.link != NODE_NONE {
            let other = if row.link >= self.node_count() {
                return bad(format!(
                    "node {}: consolidation link {} is dangling",
                    row.index, row.link
                ));
            } else {
                self.row(row.link)?
            };
            if other.link != row.index || other.is_consolidated_root() == row.is_consolidated_root() {
                return bad(format!(
                    "node {}: consolidation link to {} is not mutual",
                    row.index, row.link
                ));
            }
        }
        Ok(())
    }

    /// Rows and vectors past the last node of the last segment: in a frozen
    /// bank they are never written, so anything but zeros is damage. In a
    /// live bank a checkpoint that crashed may have left rows there; they
    /// are outside the checkpoint and get overwritten, so are not checked.
    fn verify_unused_space(&self, report: &mut VerifyReport, scope: VerifyScope) -> Result<(), BankError> {
        self.verify_payload_length(report)?;
        let count = self.base.node_count;
        let rps = self.base.rows_per_segment;
        if count.is_multiple_of(rps) || !self.manifest.is_frozen() {
            return Ok(());
        }
        let segment = count / rps;
        let used_rows = (count % rps) as usize;
        // A segment that cannot be mapped was reported with its rows.
        let Ok(table) = self.base.table_unverified(segment) else {
            return Ok(());
        };
        let mut checks = vec![(
            table_segment_file(self.manifest.generation, segment),
            &table[..],
            used_rows * ROW_SIZE_BYTES,
        )];
        let maps = match scope {
            VerifyScope::Everything => self.base.segment_unverified(segment).ok(),
            VerifyScope::SkipVectorColumns => None,
        };
        if let Some(maps) = &maps {
            checks.push((
                vector_segment_file(self.manifest.generation, segment),
                &maps.vectors[..],
                used_rows * self.base.stride_bytes as usize,
            ));
            if let (Some(quant), Some(qstride)) = (&maps.quant, self.base.qstride_bytes) {
                checks.push((
                    qvector_segment_file(self.manifest.generation, segment),
                    &quant[..],
                    used_rows * qstride as usize,
                ));
            }
        }
        for (name, bytes, from) in checks {
            if let Some(at) = bytes[from..].iter().position(|&b| b != 0) {
                report.add(
                    self.storage.describe(&name),
                    (from + at) as u64,
                    "unused space past the last node is not zero".into(),
                );
            }
        }
        Ok(())
    }

    /// The payload log must reach the manifest's payload end. Read through
    /// the handle's own payload file (a reader opens it at open): a compact
    /// by the writer since then deletes the name, not the file.
    fn verify_payload_length(&self, report: &mut VerifyReport) -> Result<(), BankError> {
        let name = payload_file(self.manifest.generation);
        // One that cannot be opened was reported by `verify_scope`.
        let Ok(payload) = self.base.payload_handle() else {
            return Ok(());
        };
        let len = payload
            .len_bytes()
            .map_err(StorageError::io("stat", self.storage.describe(&name)))?;
        if len < self.manifest.payload_end_bytes {
            report.add(
                self.storage.describe(&name),
                len,
                format!(
                    "file ends before the manifest's payload end {}",
                    self.manifest.payload_end_bytes
                ),
            );
        }
        Ok(())
    }
}

fn hash_external_id(row: &Row) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(external_key(row.external_id, row.flags))
}
