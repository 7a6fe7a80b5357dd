//! Draws one tree of a bank as indented text with box-drawing branches.

use std::collections::BTreeMap;
use std::fmt::Write;

use deltamem::format::row::Row;
use deltamem::{Bank, BankError};

/// Scenario text longer than this is cut, to keep one node per line.
const SCENARIO_MAX_CHARS: usize = 44;

/// The scenario cut to one short line, with control characters (line
/// breaks, CR, the ESC of terminal escape sequences) written as escapes
/// (`\n`, `\u{1b}`), as SVG and DOT escape theirs: stored text must not
/// move the cursor or restyle the terminal.
fn short(text: &str) -> String {
    let mut cut = String::new();
    for c in text.chars().take(SCENARIO_MAX_CHARS) {
        match c.is_control() {
            true => cut.extend(c.escape_default()),
            false => cut.push(c),
        }
    }
    if text.chars().count() > SCENARIO_MAX_CHARS {
        cut.push('…');
    }
    cut
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
    rows: BTreeMap<u32, Row>,
    children: BTreeMap<u32, Vec<u32>>,
    out: String,
}

impl Drawing<'_> {
    fn draw(&mut self, index: u32, prefix: &str, last: bool) -> Result<(), BankError> {
        let Some(row) = self.rows.get(&index) else {
            return Ok(());
        };
        let line = node_line(self.bank, row)?;
        let branch = if last { "└─ " } else { "├─ " };
        let _ = writeln!(self.out, "{prefix}{branch}{line}");
        let below = format!("{prefix}{}", if last { "   " } else { "│  " });
        let kids = self.children.get(&index).cloned().unwrap_or_default();
        for (i, kid) in kids.iter().enumerate() {
            self.draw(*kid, &below, i + 1 == kids.len())?;
        }
        Ok(())
    }
}

/// The tree `tree_name` as text: its name (the virtual root), then every
/// top-level root with its descendants, oldest first.
pub fn draw_tree(bank: &Bank, tree_name: &str) -> Result<String, BankError> {
    let tree = bank.tree_index(tree_name)?;
    let mut drawing = Drawing {
        bank,
        rows: BTreeMap::new(),
        children: BTreeMap::new(),
        out: format!("{tree_name}\n"),
    };
    let mut roots = Vec::new();
    for index in 0..bank.node_count() {
        let row = bank.row(index)?;
        if row.tree != tree {
            continue;
        }
        match row.parent() {
            Some(p) => drawing.children.entry(p).or_default().push(index),
            None => roots.push(index),
        }
        drawing.rows.insert(index, row);
    }
    if roots.is_empty() {
        drawing.out.push_str("└─ (empty)\n");
    }
    for (i, root) in roots.iter().enumerate() {
        drawing.draw(*root, "", i + 1 == roots.len())?;
    }
    Ok(drawing.out)
}
