//! The fuzz targets' bodies, shared by fuzz/ (included there by path) and
//! by tests/fuzz_corpus.rs, which replays the committed seed corpus so the
//! normal test suite runs every body. Each body must never panic on any
//! input except through its own assertions, which compare against a model
//! or a ledger.
#![allow(dead_code)]

use deltamem::SyncPolicy;
use deltamem::format::manifest::{MANIFEST_SIZE_BYTES, Manifest};
use deltamem::format::payload::{decode_record, encode_record};
use deltamem::format::row::{ROW_SIZE_BYTES, Row};
use deltamem::format::wal::{
    RECORD_HEADER_SIZE_BYTES, WAL_HEADER_SIZE_BYTES, WalHeader, decode_ops, encode_ops, verify_record,
};
use deltamem::storage::{FaultKind, FaultPlan, Loss, SimStorage};

use super::crashkit::{Bytes, check_recovery, drive, ledger_of, workload_from};

/// Any bytes: an error, or a manifest that re-encodes to the same bytes
/// (the CRC covers everything and reserved bytes must be zero).
pub fn decode_manifest(data: &[u8]) {
    if let Ok(m) = Manifest::decode(data) {
        assert_eq!(&m.encode()[..], &data[..MANIFEST_SIZE_BYTES]);
    }
}

/// First 4 bytes: the expected index; then the row; then, optionally, the
/// bank's tree count and D_max (one byte each; 2 and 5 if absent). A row
/// that decodes re-encodes to the same 128 bytes, and its range check
/// accepts exactly the rows whose tree, depth and parent a reader can
/// index with.
pub fn decode_row(data: &[u8]) {
    let Some((index, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    if let Ok(row) = Row::decode(rest, u32::from_le_bytes(*index)) {
        assert_eq!(&row.encode()[..], &rest[..ROW_SIZE_BYTES]);
        let tree_count = rest.get(ROW_SIZE_BYTES).map_or(2, |&b| usize::from(b));
        let max_depth = rest.get(ROW_SIZE_BYTES + 1).copied().unwrap_or(5);
        let usable = usize::from(row.tree) < tree_count
            && (1..=max_depth).contains(&row.depth)
            && row.parent().is_none_or(|p| p < row.index);
        assert_eq!(row.check_ranges(tree_count, max_depth).is_ok(), usable, "{row:?}");
    }
}

/// Payload records: bounded decompression; what decodes round-trips.
pub fn decode_payload(data: &[u8]) {
    let index = data
        .get(8..12)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    if let Ok(p) = decode_record(data, index) {
        assert_eq!(
            decode_record(&encode_record(index, &p), index).expect("own encoding"),
            p
        );
    }
}

/// A WAL file: header, chained records, ops (dimension 4). What validates
/// decodes into ops that re-encode to the same body.
pub fn decode_wal(data: &[u8]) {
    let Ok(header) = WalHeader::decode(data) else { return };
    let mut prev = header.chain_seed();
    let mut lsn = header.start_lsn;
    let mut rest = &data[WAL_HEADER_SIZE_BYTES..];
    for _ in 0..64 {
        let Ok(h) = verify_record(prev, lsn, rest) else { return };
        let end = RECORD_HEADER_SIZE_BYTES + h.body_size_bytes as usize;
        let body = &rest[RECORD_HEADER_SIZE_BYTES..end];
        if let Ok(ops) = decode_ops(body, h.op_count, 4) {
            assert_eq!(encode_ops(&ops), body);
        }
        prev = h.crc;
        // Wrapping: a forged header may start at u64::MAX.
        lsn = lsn.wrapping_add(1);
        rest = &rest[end..];
    }
}

/// An operation sequence over the simulated store with one injected fault:
/// bytes 0-1 pick the I/O operation that faults, byte 2 the kind (crash or
/// EIO) and the sync policy, byte 3 the loss model; the rest drive the
/// workload. The recovered bank must equal a ledger state that holds every
/// acknowledged op, pass verify and take new writes.
pub fn ops_with_faults(data: &[u8]) {
    let Some((control, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let ledger = ledger_of(workload_from(&mut Bytes(rest), 24));
    if ledger.io_ops == 0 {
        return;
    }
    let at_op = u64::from(u16::from_le_bytes([control[0], control[1]])) % ledger.io_ops;
    let kind = if control[2] & 1 == 0 {
        FaultKind::Crash
    } else {
        FaultKind::Fail
    };
    let policy = if control[2] & 2 == 0 {
        SyncPolicy::Always
    } else {
        SyncPolicy::Batch {
            records: 3,
            interval_ms: u64::MAX,
        }
    };
    let seed = u64::from(control[3]) + 1;
    let loss = match control[3] % 4 {
        0 => Loss::KeepAll,
        1 => Loss::LoseUnsynced,
        2 => Loss::TornLast { seed },
        _ => Loss::Subset { seed },
    };
    let storage = SimStorage::new();
    storage.set_plan(Some(FaultPlan { at_op, kind }));
    let out = drive(&storage, &ledger.ops, policy);
    check_recovery(
        &ledger,
        &storage.crash_image(loss),
        &out,
        &format!("fuzz {kind:?} at op {at_op} {loss:?}"),
    );
}
