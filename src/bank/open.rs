//! Creating and opening banks, and recovery (WAL replay into the overlay).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::base::Base;
use super::overlay::Overlay;
use super::{Bank, BankError, SyncPolicy, Writer};
use crate::format::default_rows_per_segment;
use crate::format::manifest::{Manifest, Precision, Settings, TreeSpec};
use crate::format::wal::{WalHeader, WalOp, decode_ops};
use crate::storage::wal::{WalDamage, WalScan, WalWriter, scan, scan_torn_header};
use crate::storage::{
    FileStorage, MANIFEST_FILE, MANIFEST_TMP_FILE, OpenMode, Storage, StorageError, WAL_FILE, payload_file, read_all,
    replace_atomically,
};

/// Parameters fixed at `init`.
#[derive(Debug, Clone, PartialEq)]
pub struct BankConfig {
    pub dim_count: u32,
    pub trees: Vec<TreeSpec>,
    /// Failure penalty subtracted from a FAILURE node's similarity.
    pub eps: f32,
    /// D_max: the longest chain, in nodes.
    pub max_depth: u8,
    /// K_cons: success hits that make a residual node due for consolidation.
    pub consolidate_after: u32,
    /// Rows per segment file; None picks a ~64 MiB vector segment.
    pub rows_per_segment: Option<u32>,
    /// How the vector column is stored (FORMAT.md §1): f32 (default), f16
    /// (half the size, scores within a small bound), or f32 plus an int8
    /// side column (faster scans, same answers).
    pub precision: Precision,
}

impl BankConfig {
    /// The paper's two trees with the reference's ScienceWorld thresholds.
    pub fn new(dim_count: u32) -> BankConfig {
        BankConfig {
            dim_count,
            trees: vec![
                TreeSpec {
                    name: "task".into(),
                    tau: 0.82,
                },
                TreeSpec {
                    name: "env".into(),
                    tau: 0.82,
                },
            ],
            eps: 0.05,
            max_depth: 5,
            consolidate_after: 3,
            rows_per_segment: None,
            precision: Precision::F32,
        }
    }

    /// Checks every option and names the bad one; runs before anything
    /// touches the disk. The rules are the manifest's (`Settings`).
    pub fn validate(&self) -> Result<(), BankError> {
        let settings = Settings {
            dim_count: self.dim_count,
            // The value `create` will use, so a default is checked too.
            rows_per_segment: self
                .rows_per_segment
                .unwrap_or_else(|| default_rows_per_segment(self.dim_count)),
            eps: self.eps,
            max_depth: self.max_depth,
            consolidate_after: self.consolidate_after,
            trees: &self.trees,
        };
        settings.check().map_err(|(_, detail)| BankError::BadConfig(detail))
    }
}

/// How to open an existing bank.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    pub read_only: bool,
    pub sync: SyncPolicy,
    /// Checkpoint once the WAL grows past this; bounds recovery time and
    /// overlay memory.
    pub checkpoint_wal_bytes: u64,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions {
            read_only: false,
            sync: SyncPolicy::Always,
            checkpoint_wal_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Writer {
    /// Poisons the bank with a failed write or fsync of the WAL, whose
    /// error is returned: the on-disk state is unknown from here on.
    pub(super) fn poisoned_by(&mut self, e: StorageError) -> BankError {
        self.poisoned = Some(e.to_string());
        e.into()
    }

    /// Why the bank refuses writes, if it does.
    pub(super) fn poison_reason(&self) -> Option<&String> {
        self.poisoned.as_ref().or(self.poisoned_shared.get())
    }

    fn new(lock: Box<dyn Send + Sync>, wal: WalWriter, policy: SyncPolicy, checkpoint_wal_bytes: u64) -> Writer {
        Writer {
            ahead: None,
            _lock: lock,
            wal,
            policy,
            poisoned: None,
            poisoned_shared: Default::default(),
            checkpoint_failure: None,
            last_sync: Instant::now(),
            checkpoint_wal_bytes,
            checkpoints_deferred: false,
            recycle_wals: false,
            record_buffer: Vec::new(),
            vector_buffer: Vec::new(),
            load_pieces: Vec::new(),
        }
    }
}

pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A fresh WAL salt, different from `previous`. Not cryptographic: it only
/// has to tell WAL generations apart.
pub(crate) fn new_salt(previous: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ (u64::from(std::process::id()) << 32) ^ previous.rotate_left(17);
    // splitmix64 finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    if x == previous { x ^ 1 } else { x }
}

/// 0..=3 ms, different per process and per try.
fn retry_jitter_ms(attempt: u32) -> u64 {
    u64::from((std::process::id() ^ attempt.wrapping_mul(2_654_435_761)) % 4)
}

impl Bank {
    /// Creates a bank in directory `path` (created if missing, must not
    /// already hold a bank).
    pub fn create_dir(path: impl AsRef<Path>, config: BankConfig) -> Result<Bank, BankError> {
        config.validate()?; // before the directory exists: a bad config leaves nothing behind
        let path = path.as_ref();
        std::fs::create_dir_all(path).map_err(StorageError::io("create directory", path.display().to_string()))?;
        Bank::create(Arc::new(FileStorage::new(path)), config)
    }

    pub fn open_dir(path: impl AsRef<Path>, options: OpenOptions) -> Result<Bank, BankError> {
        Bank::open(Arc::new(FileStorage::new(path.as_ref())), options)
    }

    /// Opens as `open_dir` does, but while another process holds the
    /// writer lock it tries again until `lock_wait` has passed. Processes
    /// that each write briefly (`deltamem mcp`, the CLI, the agent loop)
    /// then take turns instead of failing on a lock held for milliseconds.
    /// The pause between tries grows from 1 ms to 8 ms (short: a waiter
    /// that backs off further keeps losing the lock to newcomers) and is
    /// varied per process, so waiters do not retry in step. After the
    /// wait, the error is the lock's own, saying how long it waited.
    pub fn open_dir_waiting(
        path: impl AsRef<Path>,
        options: OpenOptions,
        lock_wait: Duration,
    ) -> Result<Bank, BankError> {
        Bank::open_dir_noting_wait(path, options, lock_wait, || {})
    }

    /// `open_dir_waiting`, calling `waiting` once, when the first try
    /// finds the lock held and the wait begins: a long-running face
    /// (`deltamem serve`) says why it has not started yet.
    pub fn open_dir_noting_wait(
        path: impl AsRef<Path>,
        options: OpenOptions,
        lock_wait: Duration,
        waiting: impl FnOnce(),
    ) -> Result<Bank, BankError> {
        Bank::open_dir_waiting_with(path.as_ref(), options, lock_wait, waiting, || false)
    }

    /// `open_dir_waiting` that asks `interrupted` before each pause and
    /// stops waiting (with the lock's error) once it says so: a face that
    /// must answer a signal while it waits (Ctrl-C in the Python binding)
    /// checks for it there.
    pub fn open_dir_waiting_unless(
        path: impl AsRef<Path>,
        options: OpenOptions,
        lock_wait: Duration,
        interrupted: impl FnMut() -> bool,
    ) -> Result<Bank, BankError> {
        Bank::open_dir_waiting_with(path.as_ref(), options, lock_wait, || {}, interrupted)
    }

    fn open_dir_waiting_with(
        path: &Path,
        options: OpenOptions,
        lock_wait: Duration,
        waiting: impl FnOnce(),
        mut interrupted: impl FnMut() -> bool,
    ) -> Result<Bank, BankError> {
        let started = Instant::now();
        let (mut pause_ms, mut attempt) = (1u64, 0u32);
        let mut waiting = Some(waiting);
        loop {
            attempt = attempt.wrapping_add(1);
            match Bank::open_dir(path, options.clone()) {
                Err(e) if e.is_locked() && started.elapsed() < lock_wait && !interrupted() => {
                    if let Some(note) = waiting.take() {
                        note();
                    }
                    let left = lock_wait.saturating_sub(started.elapsed());
                    std::thread::sleep(Duration::from_millis(pause_ms + retry_jitter_ms(attempt)).min(left));
                    pause_ms = (pause_ms * 2).min(8);
                }
                Err(BankError::Storage(StorageError::Locked { file, .. })) => {
                    let waited_ms = started.elapsed().as_millis() as u64;
                    return Err(BankError::Storage(StorageError::Locked { file, waited_ms }));
                }
                other => return other,
            }
        }
    }

    /// Creates a bank. The manifest is written last: it is what makes the
    /// directory a bank, so a crash during creation leaves no half bank.
    pub fn create(storage: Arc<dyn Storage>, config: BankConfig) -> Result<Bank, BankError> {
        config.validate()?;
        let lock = storage.try_lock_writer()?;
        if storage
            .exists(MANIFEST_FILE)
            .map_err(StorageError::io("stat", storage.describe(MANIFEST_FILE)))?
        {
            return Err(BankError::AlreadyExists {
                path: storage.describe(""),
            });
        }
        refuse_orphaned_data(storage.as_ref())?;
        let rows_per_segment = config
            .rows_per_segment
            .unwrap_or_else(|| default_rows_per_segment(config.precision.vector_stride_bytes(config.dim_count)));
        let salt = new_salt(0);
        let manifest = Manifest {
            version: crate::format::FORMAT_VERSION,
            sequence: 1,
            flags: 0,
            dim_count: config.dim_count,
            row_stride_bytes: config.precision.vector_stride_bytes(config.dim_count),
            rows_per_segment,
            precision: config.precision,
            eps: config.eps,
            max_depth: config.max_depth,
            consolidate_after: config.consolidate_after,
            generation: 0,
            checkpoint_lsn: 0,
            node_count: 0,
            payload_end_bytes: 0,
            wal_salt: salt,
            created_unix_ms: now_unix_ms(),
            trees: config.trees.clone(),
        };
        manifest.validate().map_err(|e| BankError::BadConfig(e.to_string()))?;
        let payload = storage
            .open(&payload_file(0), OpenMode::Create)
            .map_err(StorageError::io("create", storage.describe(&payload_file(0))))?;
        payload
            .set_len(0)
            .map_err(StorageError::io("truncate", storage.describe(&payload_file(0))))?;
        let wal = WalWriter::create(storage.as_ref(), WalHeader { salt, start_lsn: 1 })?;
        replace_atomically(storage.as_ref(), MANIFEST_FILE, MANIFEST_TMP_FILE, &manifest.encode())?;
        let writer = Writer::new(
            lock,
            wal,
            SyncPolicy::Always,
            OpenOptions::default().checkpoint_wal_bytes,
        );
        Ok(Bank::assemble(storage, manifest, Some(writer)))
    }

    fn assemble(storage: Arc<dyn Storage>, manifest: Manifest, writer: Option<Writer>) -> Bank {
        let count = manifest.node_count as u32;
        Bank {
            base: Base::new(storage.clone(), &manifest),
            overlay: Overlay::new(count, manifest.dim_count, manifest.payload_end_bytes),
            storage,
            manifest,
            writer,
            external_ids: Mutex::new(None),
            query_threads: 1,
            wal_seen: None,
        }
    }

    /// Opens a bank: as the single writer (taking the lock and recovering
    /// the WAL), or read-only (no lock; the WAL is replayed in memory only).
    pub fn open(storage: Arc<dyn Storage>, options: OpenOptions) -> Result<Bank, BankError> {
        Bank::open_dropping(storage, options, false).map(|(bank, _)| bank)
    }

    /// Opens as the writer even when the WAL is damaged in the middle,
    /// dropping the intact records after the damage (FORMAT.md §8), and
    /// closes (checkpoints) the bank. Only for an explicit repair: those
    /// records may hold acknowledged changes. Returns what was dropped
    /// (None: the WAL had no such damage and nothing was dropped).
    pub fn repair(storage: Arc<dyn Storage>) -> Result<Option<WalDamage>, BankError> {
        let (bank, damage) = Bank::open_dropping(storage, OpenOptions::default(), true)?;
        bank.close()?;
        Ok(damage)
    }

    /// What a writer's open (so a repair) would refuse before replaying,
    /// checked from a read-only handle without the lock: a frozen bank, and
    /// a manifest naming live files that are missing. For a repair's dry
    /// run, which otherwise sees only the WAL.
    pub fn check_writer_open(&self) -> Result<(), BankError> {
        if self.manifest.is_frozen() {
            return Err(BankError::ReadOnly(format!(
                "{} is frozen; open it read-only",
                self.storage.describe("")
            )));
        }
        super::compact::refuse_missing_live_files(self.storage.as_ref(), &self.manifest)
    }

    pub fn repair_dir(path: impl AsRef<Path>) -> Result<Option<WalDamage>, BankError> {
        Bank::repair(Arc::new(FileStorage::new(path.as_ref())))
    }

    /// `open`; `drop_damaged` lets a writer truncate a WAL damaged in the
    /// middle. Returns the damage it dropped.
    fn open_dropping(
        storage: Arc<dyn Storage>,
        options: OpenOptions,
        drop_damaged: bool,
    ) -> Result<(Bank, Option<WalDamage>), BankError> {
        if !options.read_only && read_manifest(storage.as_ref())?.is_frozen() {
            // Checked before locking so a frozen directory is never written.
            return Err(BankError::ReadOnly(format!(
                "{} is frozen; open it read-only",
                storage.describe("")
            )));
        }
        let lock = if options.read_only {
            None
        } else {
            Some(storage.try_lock_writer()?)
        };
        let (manifest, mut wal_scan) = read_consistent_state(storage.as_ref(), options.read_only)?;
        if manifest.is_frozen() && !options.read_only {
            return Err(BankError::ReadOnly(format!(
                "{} is frozen; open it read-only",
                storage.describe("")
            )));
        }
        if lock.is_some() {
            super::compact::refuse_missing_live_files(storage.as_ref(), &manifest)?;
        }
        let stale = wal_scan.header.salt != manifest.wal_salt;
        check_wal_start(storage.as_ref(), &manifest, &wal_scan, lock.is_some())?;
        let may_drop = drop_damaged && lock.is_some();
        let mut damage = if stale { None } else { wal_scan.damage.clone() };
        if let Some(d) = &damage
            && !may_drop
        {
            return Err(BankError::wal_damaged(storage.describe(WAL_FILE), d));
        }
        let fresh = || {
            let mut bank = Bank::assemble(storage.clone(), manifest.clone(), None);
            bank.base.retry_torn_rows = options.read_only;
            if options.read_only {
                bank.base.hold_files();
            }
            bank
        };
        let mut bank = fresh();
        if !stale {
            if let Err(refused) = bank.replay(&wal_scan) {
                let (index, detail) = refused.into_record()?;
                let refused = wal_scan.refused(index, detail);
                if !may_drop {
                    return Err(BankError::wal_damaged(storage.describe(WAL_FILE), &refused));
                }
                // Replayed again from nothing: the torn rows' images the
                // dropped records held must not stay behind.
                wal_scan.cut_before(index, refused.clone(), storage.describe(WAL_FILE));
                damage = Some(refused);
                bank = fresh();
                if let Err(again) = bank.replay(&wal_scan) {
                    let (index, detail) = again.into_record()?;
                    return Err(BankError::wal_damaged(
                        storage.describe(WAL_FILE),
                        &wal_scan.refused(index, detail),
                    ));
                }
            }
            bank.wal_seen = options.read_only.then(|| wal_scan.position());
        }
        if let Some(lock) = lock {
            let wal = if stale {
                // Every record of a stale WAL is covered by the checkpoint.
                let header = WalHeader {
                    salt: bank.manifest.wal_salt,
                    start_lsn: bank.manifest.checkpoint_lsn + 1,
                };
                WalWriter::create(storage.as_ref(), header)?
            } else {
                WalWriter::resume(storage.as_ref(), &wal_scan, drop_damaged)?
            };
            bank.writer = Some(Writer::new(lock, wal, options.sync, options.checkpoint_wal_bytes));
            // Files of other generations are what a crashed compact left
            // (`refuse_missing_live_files` has checked the live ones).
            let live = bank.manifest.generation;
            bank.remove_data_files(|g| g != live)?;
        }
        Ok((bank, damage))
    }

    /// Applies the records the checkpoint lacks. A record whose CRC holds
    /// but whose ops do not decode or contradict the bank is damage, not a
    /// torn tail: replay stops there and says which record it was.
    fn replay(&mut self, wal_scan: &WalScan) -> Result<(), Refused> {
        let mut txns = Vec::new();
        for (index, record) in wal_scan.records.iter().enumerate() {
            if record.lsn <= self.manifest.checkpoint_lsn {
                continue;
            }
            let ops = decode_ops(wal_scan.body(record), record.op_count, self.manifest.dim_count).map_err(|e| {
                Refused::Record {
                    index,
                    detail: format!("its ops do not decode: {e}"),
                }
            })?;
            txns.push((index, ops));
        }
        self.seed_torn_rows(txns.iter().map(|(_, ops)| ops));
        for (index, ops) in txns {
            self.apply_txn(ops).map_err(|e| match e {
                BankError::Storage(_) => Refused::Bank(e),
                e => Refused::Record {
                    index,
                    detail: format!("it cannot be applied: {e}"),
                },
            })?;
        }
        Ok(())
    }

    /// A checkpoint rewrites checkpointed rows in place; a crash in the
    /// middle can tear one. Every such row has a full image in the WAL
    /// (that is why it was being rewritten), so a row that no longer
    /// decodes but is rewritten by the WAL takes its first WAL image: its
    /// immutable fields, all that validation reads, are the same in all.
    fn seed_torn_rows<'a>(&mut self, txns: impl Iterator<Item = &'a Vec<WalOp>>) {
        for op in txns.flatten() {
            if let WalOp::PutRow { row } = op
                && row.index < self.base.node_count
                && !self.overlay.patched.contains_key(&row.index)
                && self.base.row(row.index).is_err()
            {
                self.overlay.patched.insert(row.index, row.clone());
                self.base.superseded.insert(row.index, row.clone());
            }
        }
    }
}

/// Why replay stopped.
enum Refused {
    /// Record `index` of the scan is intact but cannot be taken: its ops
    /// do not decode or contradict the bank. It is damage in the middle
    /// (`WalScan::refused`), which `repair` can drop with what follows.
    Record { index: usize, detail: String },
    /// The bank's own files failed (an I/O error, a damaged row the record
    /// reads): not the record's fault, so no repair drops it.
    Bank(BankError),
}

impl Refused {
    /// The refused record's index and why, or the bank's own error.
    fn into_record(self) -> Result<(usize, String), BankError> {
        match self {
            Refused::Record { index, detail } => Ok((index, detail)),
            Refused::Bank(e) => Err(e),
        }
    }
}

/// How often a reader reads the WAL again before it believes what it saw.
pub(crate) const WAL_READ_ATTEMPTS: u32 = 5;

/// Reads the manifest and the WAL. A reader can race a writer's checkpoint
/// (new manifest, then new WAL) and see the old manifest with the new WAL;
/// the salts then differ, so it reads both again. It also reads again when
/// the WAL looks damaged in the middle, in case it caught a write in
/// progress; a record still being written is always the last one, so it
/// reads as a torn tail, never as damage, once it is whole. A writer holds
/// the lock, so for it a salt mismatch is a real stale WAL left by a crash.
fn read_consistent_state(storage: &dyn Storage, read_only: bool) -> Result<(Manifest, WalScan), BankError> {
    let mut attempt = 0;
    loop {
        let manifest = read_manifest(storage)?;
        attempt += 1;
        let last = !read_only || attempt == WAL_READ_ATTEMPTS;
        // A reader may read the header while a recycling checkpoint
        // rewrites it in place (FORMAT.md §7 step 5): not settled either.
        let wal_scan = match scan_wal(storage, &manifest) {
            Err(e) if !last && matches!(e, BankError::Storage(StorageError::Corrupt { .. })) => continue,
            scanned => scanned?,
        };
        let settled = wal_scan.header.salt == manifest.wal_salt && wal_scan.damage.is_none();
        if last || settled {
            return Ok((manifest, wal_scan));
        }
    }
}

/// The WAL's scan (`wal::scan`). A header that fails its checks with no
/// live record after it is what a recycling checkpoint's torn header
/// write leaves (FORMAT.md §8 step 5), read as the stale WAL it is
/// (`wal::scan_torn_header`); over a live record it stays an error.
pub(crate) fn scan_wal(storage: &dyn Storage, manifest: &Manifest) -> Result<WalScan, BankError> {
    match scan(storage) {
        // Only the header's checks make `scan` fail as corrupt.
        Err(header_error @ StorageError::Corrupt { .. }) => {
            let expected = WalHeader {
                salt: manifest.wal_salt,
                start_lsn: manifest.checkpoint_lsn + 1,
            };
            scan_torn_header(storage, expected)?.ok_or_else(|| header_error.into())
        }
        scanned => Ok(scanned?),
    }
}

/// Refuses a WAL whose first LSN contradicts the manifest. A checkpoint
/// writes its manifest, then a WAL (of the manifest's salt) that starts
/// right after the checkpoint's LSN, so a WAL of the manifest's salt starts
/// exactly there, and a stale one (a crash between the two) starts at or
/// before it. A WAL that starts later is newer than the manifest (an older
/// MANIFEST put back over the bank): treated as stale, its acknowledged
/// records would be ignored, and the next writer would truncate them.
/// A reader may have caught a checkpoint between the two files: the
/// refusal is made only if the manifest is still the one it read.
fn check_wal_start(
    storage: &dyn Storage,
    manifest: &Manifest,
    wal_scan: &WalScan,
    locked: bool,
) -> Result<(), BankError> {
    let (start, expected) = (wal_scan.header.start_lsn, manifest.checkpoint_lsn + 1);
    let stale = wal_scan.header.salt != manifest.wal_salt;
    // A WAL of an older generation is one the checkpoint that ended at
    // `checkpoint_lsn` replaced: it holds no record past that LSN (a record
    // past it would be a change no data file holds, and the writer would
    // put a new WAL over it).
    // Records after damage in it count too: a stale WAL is dropped whole.
    let past = wal_scan
        .damage
        .as_ref()
        .map_or(0, |d| *d.dropped_lsns.end())
        .max(wal_scan.next_lsn().saturating_sub(1));
    let contradicts = if stale {
        start > expected || past >= expected
    } else {
        start != expected
    };
    if !contradicts || (!locked && read_manifest(storage)?.sequence != manifest.sequence) {
        return Ok(());
    }
    let detail = if stale && start <= expected {
        format!(
            "the WAL's salt is not the MANIFEST's (a WAL its last checkpoint replaced), but it holds records up to \
             LSN {past}, past the checkpoint's LSN {}: the two files are not of one bank state, and the records \
             past it are kept",
            manifest.checkpoint_lsn
        )
    } else {
        format!(
            "the WAL starts at LSN {start}, but the MANIFEST's checkpoint ends at LSN {} (so it should start at \
             {expected}{}): the two files are not of one bank state",
            manifest.checkpoint_lsn,
            if stale { " or before" } else { "" },
        )
    };
    Err(BankError::Corrupt {
        file: storage.describe(WAL_FILE),
        offset_bytes: 0,
        detail,
    })
}

/// Refuses a directory without a MANIFEST that holds what only a bank
/// that once had one writes: a segment, payload bytes, or a WAL longer than
/// its header. `create` would truncate them (a crash in `create`, before
/// its manifest, leaves only an empty payload log and a bare WAL header).
fn refuse_orphaned_data(storage: &dyn Storage) -> Result<(), BankError> {
    let names = match storage.list() {
        Ok(names) => names,
        // No directory: nothing to protect (the caller says "not a bank").
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StorageError::io("list", storage.describe(""))(e).into()),
    };
    let mut found = Vec::new();
    for name in names {
        let is_data = crate::storage::data_file_generation(&name).is_some();
        if !is_data && name != WAL_FILE {
            continue;
        }
        let len_bytes = storage
            .open(&name, OpenMode::Read)
            .and_then(|f| f.len_bytes())
            .map_err(StorageError::io("stat", storage.describe(&name)))?;
        let empty_bytes = match is_data {
            true => 0,
            false => crate::format::wal::WAL_HEADER_SIZE_BYTES as u64,
        };
        if len_bytes > empty_bytes {
            found.push(name);
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    found.sort();
    Err(BankError::ManifestMissing {
        path: storage.describe(""),
        files: found.join(", "),
    })
}

/// Reads and decodes MANIFEST, telling "not a bank" apart from corruption.
pub(crate) fn read_manifest(storage: &dyn Storage) -> Result<Manifest, BankError> {
    let desc = storage.describe(MANIFEST_FILE);
    if !storage
        .exists(MANIFEST_FILE)
        .map_err(StorageError::io("stat", desc.clone()))?
    {
        refuse_orphaned_data(storage)?;
        return Err(BankError::NotABank {
            path: storage.describe(""),
        });
    }
    let bytes = read_all(storage, MANIFEST_FILE)?;
    Manifest::decode(&bytes).map_err(|e| StorageError::corrupt(desc, 0, e).into())
}

impl Bank {
    /// For read-only handles: picks up what the writer committed since this
    /// handle was opened (new manifest, new WAL records). A no-op for the
    /// writer, which always sees its own state.
    pub fn refresh(&mut self) -> Result<(), BankError> {
        if self.writer.is_some() {
            return Ok(());
        }
        *self = self.reopened()?;
        Ok(())
    }

    /// A new read-only handle on this handle's bank, with its settings:
    /// built beside this one, so queries can go on using this one until
    /// the new one takes its place.
    pub fn reopened(&self) -> Result<Bank, BankError> {
        let options = OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        };
        let mut fresh = Bank::open(self.storage.clone(), options)?;
        fresh.set_query_threads(self.query_threads);
        Ok(fresh)
    }

    /// For read-only handles: whether the writer has made anything new
    /// this handle does not show, a new manifest (a checkpoint, or another
    /// bank put in its place) or an
    /// intact WAL record after the ones it read. Small reads (the manifest,
    /// a record header where the next record would start, and that record
    /// only when the file holds all of it), so a long-lived reader can ask
    /// often and `refresh` only when it is worth it: a torn record left by
    /// a dead writer, or a stale WAL, is news only once a writer has
    /// replaced it. False for the writer, which always sees its own state.
    pub fn has_news(&self) -> Result<bool, BankError> {
        if self.writer.is_some() {
            return Ok(false);
        }
        // Sequence, salt and creation time: another bank put in this one's
        // place can have reached the same sequence, never the same salt.
        let on_disk = read_manifest(self.storage.as_ref())?;
        let seen = &self.manifest;
        if (on_disk.sequence, on_disk.wal_salt, on_disk.created_unix_ms)
            != (seen.sequence, seen.wal_salt, seen.created_unix_ms)
        {
            return Ok(true);
        }
        let desc = self.storage.describe(WAL_FILE);
        let wal = self
            .storage
            .open(WAL_FILE, OpenMode::Read)
            .map_err(StorageError::io("open", desc.clone()))?;
        match self.wal_seen {
            Some(at) => Ok(crate::storage::wal::intact_record_at(wal.as_ref(), &desc, at)?),
            // A stale WAL (a checkpoint's crash left the old one): news once
            // a writer has replaced it with one of the manifest's salt.
            None => {
                let mut head = [0u8; crate::format::wal::WAL_HEADER_SIZE_BYTES];
                let read = wal.read_exact_at(&mut head, 0);
                let header = read.ok().and_then(|()| WalHeader::decode(&head).ok());
                Ok(header.is_some_and(|h| h.salt == self.manifest.wal_salt))
            }
        }
    }
}
