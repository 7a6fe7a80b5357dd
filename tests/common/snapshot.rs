//! A comparable picture of a whole bank, for tests that check two banks
//! (or one bank before and after) hold the same nodes.
#![allow(dead_code)]

use deltamem::Bank;

/// Everything observable of every node, creation times aside: its row,
/// its payload and its vector's bits.
pub fn node_snapshot(bank: &Bank) -> Vec<String> {
    (0..bank.node_count())
        .map(|i| {
            let mut row = bank.row(i).unwrap();
            row.created_unix_ms = 0;
            let bits: Vec<u32> = bank.vector(i).unwrap().iter().map(|x| x.to_bits()).collect();
            format!("{row:?} {:?} {bits:?}", bank.payload(i).unwrap())
        })
        .collect()
}
