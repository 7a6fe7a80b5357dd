//! Draws one tree of a bank as indented text with box-drawing branches.

use std::fmt::Write;

use deltamem::format::row::Row;
use deltamem::{Bank, BankError};

use super::draw_scope::Selection;

/// Scenario text longer than this is cut, to keep one node per line.
const SCENARIO_MAX_CHARS: usize = 44;

/// One line per node: a scenario's own line breaks would break the tree.
fn short(text: &str) -> String {
    super::picture::one_line(text, SCENARIO_MAX_CHARS + 1)
}

fn node_line(bank: &Bank, row: &Row) -> Result<String, BankError> {
    let scenario = bank.payload(row.index)?.scenario;
    let mut line = format!(
        "#{} {} {} d={} hits={} \"{}\"",
        row.index,
        row.node_type.as_str(),
        row.label.as_str(),
        row.depth,
        row.success_hits,
        short(&scenario)
    );
    if let (true, Some(root)) = (row.is_consolidated(), row.link()) {
        let _ = write!(line, "  [consolidated into #{root}]");
    }
    if let (true, Some(source)) = (row.is_consolidated_root(), row.link()) {
        let _ = write!(line, "  [distilled root, from #{source}]");
    }
    Ok(line)
}

struct Drawing<'a> {
    bank: &'a Bank,
    selection: &'a Selection,
    out: String,
}

impl Drawing<'_> {
    fn draw(&mut self, index: u32, prefix: &str, last: bool) -> Result<(), BankError> {
        let row = self.bank.row(index)?;
        let mut line = node_line(self.bank, &row)?;
        if let Some(hidden) = self.selection.hidden.get(&index) {
            let _ = write!(line, "  [+{hidden} not drawn]");
        }
        let branch = if last { "└─ " } else { "├─ " };
        let _ = writeln!(self.out, "{prefix}{branch}{line}");
        let below = format!("{prefix}{}", if last { "   " } else { "│  " });
        let selection = self.selection;
        let kids = selection.kids(index);
        for (i, kid) in kids.iter().enumerate() {
            self.draw(*kid, &below, i + 1 == kids.len())?;
        }
        Ok(())
    }
}

/// The selected part of a tree as text: what it starts from (the tree's
/// name, the virtual root), then every start with its drawn descendants,
/// oldest first. A node whose children are not drawn (`--depth`) says how
/// many it has.
pub fn draw_tree(bank: &Bank, selection: &Selection) -> Result<String, BankError> {
    let mut drawing = Drawing {
        bank,
        selection,
        out: format!("{}\n", selection.start_caption),
    };
    if selection.starts.is_empty() {
        drawing.out.push_str("└─ (empty)\n");
    }
    for (i, start) in selection.starts.iter().enumerate() {
        drawing.draw(*start, "", i + 1 == selection.starts.len())?;
    }
    Ok(drawing.out)
}
