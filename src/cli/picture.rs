//! Pictures: a tree as Graphviz DOT or as a self-contained SVG (our own
//! layered layout, so nothing needs to be installed to view it), and the
//! depth histogram of `stats --plot` as an SVG bar chart.
//!
//! Node kinds are told apart the same way in both formats: top-level roots
//! are bold, blue and rounded; failures are red; consolidated nodes (whose
//! chain was distilled) have a dashed border; consolidated roots are gold
//! with a double border.

use std::collections::BTreeMap;
use std::fmt::Write;

use deltamem::bank::Stats;
use deltamem::format::row::{Label, NodeType, Row};
use deltamem::{Bank, BankError};

use super::draw_scope::{Scope, Selection};

/// One node as drawn.
struct Drawn {
    row: Row,
    /// 1 for the nodes the drawing starts from, 2 for their children, ...
    level: u32,
    /// Children not drawn (past `--depth`).
    hidden: usize,
    label: String,
    /// Fuller text for tooltips.
    detail: String,
}

/// The selected nodes of one tree with their children, starts in index
/// order.
pub struct TreePicture {
    /// What the drawing starts from: the tree, or a node's subtree.
    tree_name: String,
    nodes: BTreeMap<u32, Drawn>,
    children: BTreeMap<u32, Vec<u32>>,
    roots: Vec<u32>,
}

/// Text on one line: control characters and runs of blanks become one
/// space, cut to `max_chars` characters (with an ellipsis if cut).
pub fn one_line(text: &str, max_chars: usize) -> String {
    let flat: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect();
    let flat = flat.join(" ");
    if flat.chars().count() <= max_chars {
        return flat;
    }
    let mut cut: String = flat.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 allows no other control characters at all.
            c if c.is_control() && !matches!(c, '\n' | '\t') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

pub fn dot_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

impl TreePicture {
    pub fn load(bank: &Bank, selection: Selection, max_label_chars: usize) -> Result<TreePicture, BankError> {
        let mut nodes = BTreeMap::new();
        for (&index, &level) in &selection.level {
            let row = bank.row(index)?;
            let payload = bank.payload(index)?;
            let text = payload
                .fields
                .get("activation_condition")
                .filter(|a| !a.trim().is_empty())
                .unwrap_or(&payload.scenario);
            let drawn = Drawn {
                label: one_line(text, max_label_chars),
                detail: one_line(text, 400),
                level,
                hidden: selection.hidden.get(&index).copied().unwrap_or(0),
                row,
            };
            nodes.insert(index, drawn);
        }
        Ok(TreePicture {
            tree_name: selection.start_caption,
            nodes,
            children: selection.children,
            roots: selection.starts,
        })
    }

    fn kids(&self, index: u32) -> &[u32] {
        self.children.get(&index).map_or(&[], Vec::as_slice)
    }
}

fn caption(d: &Drawn) -> String {
    let row = &d.row;
    let mut text = format!("#{} {} d{}", row.index, row.node_type.as_str(), row.depth);
    if row.success_hits > 0 {
        let _ = write!(text, " hits {}", row.success_hits);
    }
    text
}

/// The caption, and how many children are not drawn, if any.
fn caption_line(d: &Drawn) -> String {
    match d.hidden {
        0 => caption(d),
        hidden => format!("{} +{hidden} not drawn", caption(d)),
    }
}

/// CSS classes of a node, from which the SVG style sheet draws it.
fn classes(row: &Row) -> String {
    let mut classes = vec!["node"];
    classes.push(if row.node_type == NodeType::Root {
        "root"
    } else {
        "residual"
    });
    classes.push(if row.label == Label::Failure {
        "failure"
    } else {
        "success"
    });
    if row.is_consolidated() {
        classes.push("consolidated");
    }
    if row.is_consolidated_root() {
        classes.push("consolidated-root");
    }
    classes.join(" ")
}

/// DOT attributes telling the node kinds apart (see the module doc).
fn dot_style(row: &Row) -> String {
    let mut style = vec!["filled"];
    let (mut fill, mut color, mut extra) = ("#ffffff", "#555555", String::new());
    if row.node_type == NodeType::Root {
        style.extend(["rounded", "bold"]);
        (fill, color) = ("#e3efff", "#1f5fbf");
    }
    if row.label == Label::Failure {
        (fill, color) = ("#fde4e4", "#c0392b");
    }
    if row.is_consolidated() {
        style.push("dashed");
    }
    if row.is_consolidated_root() {
        (fill, color) = ("#fff4c2", "#b8860b");
        extra = ", peripheries=2".into();
    }
    format!(
        "style=\"{}\", fillcolor=\"{fill}\", color=\"{color}\"{extra}",
        style.join(",")
    )
}

pub fn tree_dot(p: &TreePicture) -> String {
    let mut out = String::new();
    let name = dot_escape(&p.tree_name);
    let _ = writeln!(out, "digraph \"{name}\" {{");
    let _ = writeln!(out, "  graph [rankdir=TB, fontname=\"Helvetica\"];");
    let _ = writeln!(out, "  node [shape=box, fontname=\"Helvetica\", fontsize=10];");
    let _ = writeln!(out, "  r0 [label=\"{name}\", shape=ellipse, style=dashed];");
    for d in p.nodes.values() {
        let label = format!("{}\n{}", caption_line(d), d.label);
        let _ = writeln!(
            out,
            "  n{} [label=\"{}\", tooltip=\"{}\", {}];",
            d.row.index,
            dot_escape(&label),
            dot_escape(&d.detail),
            dot_style(&d.row)
        );
    }
    for r in &p.roots {
        let _ = writeln!(out, "  r0 -> n{r};");
    }
    for (parent, kids) in &p.children {
        for k in kids {
            let _ = writeln!(out, "  n{parent} -> n{k};");
        }
    }
    out.push_str("}\n");
    out
}

const CHAR_WIDTH_PX: f64 = 6.4;
const NODE_HEIGHT_PX: f64 = 36.0;
const LEVEL_HEIGHT_PX: f64 = 78.0;
const GAP_PX: f64 = 14.0;
const MARGIN_PX: f64 = 20.0;
const LEGEND_HEIGHT_PX: f64 = 40.0;

const SVG_STYLE: &str = "
  text { font-family: Helvetica, Arial, sans-serif; font-size: 11px; fill: #222; }
  text.caption { font-size: 9px; fill: #666; }
  .edge { stroke: #999; stroke-width: 1.2; fill: none; }
  .node rect { fill: #ffffff; stroke: #555555; stroke-width: 1.2; }
  .node.root rect { fill: #e3efff; stroke: #1f5fbf; stroke-width: 2.4; }
  .node.failure rect { fill: #fde4e4; stroke: #c0392b; }
  .node.consolidated rect { stroke-dasharray: 5 3; }
  .node.consolidated-root rect { fill: #fff4c2; stroke: #b8860b; stroke-width: 3; }
  .virtual-root ellipse { fill: #f4f4f4; stroke: #999; stroke-dasharray: 3 3; }
";

/// x centre of every node: leaves take the next free column, a parent
/// sits over the middle of its children.
fn place(p: &TreePicture, index: u32, next_column: &mut f64, x: &mut BTreeMap<u32, f64>) -> f64 {
    let kids = p.kids(index);
    let centre = if kids.is_empty() {
        let c = *next_column;
        *next_column += 1.0;
        c
    } else {
        let xs: Vec<f64> = kids.iter().map(|&k| place(p, k, next_column, x)).collect();
        (xs[0] + xs[xs.len() - 1]) / 2.0
    };
    x.insert(index, centre);
    centre
}

fn svg_legend(out: &mut String, y: f64) {
    let items = [
        ("node root success", "ROOT"),
        ("node residual success", "RESIDUAL"),
        ("node residual failure", "FAILURE"),
        ("node residual success consolidated", "consolidated"),
        ("node root success consolidated-root", "consolidated root"),
    ];
    let _ = writeln!(out, "<g class=\"legend\">");
    for (i, (class, name)) in items.iter().enumerate() {
        let x = MARGIN_PX + i as f64 * 130.0;
        // Styled like nodes through `as-` classes: legend entries must
        // not be `.node` elements, so counting those counts tree nodes.
        let _ = writeln!(
            out,
            "  <g class=\"legend-item {}\"><rect x=\"{x}\" y=\"{y}\" width=\"22\" height=\"14\" rx=\"3\"/><text x=\"{}\" y=\"{}\">{name}</text></g>",
            class
                .split(' ')
                .skip(1)
                .map(|c| format!("as-{c}"))
                .collect::<Vec<_>>()
                .join(" "),
            x + 28.0,
            y + 11.0
        );
    }
    let _ = writeln!(out, "</g>");
}

pub fn tree_svg(p: &TreePicture, max_label_chars: usize) -> String {
    let width_px = (max_label_chars.max(12) as f64 * CHAR_WIDTH_PX + 16.0).min(900.0);
    let column_px = width_px + GAP_PX;
    let mut x = BTreeMap::new();
    let mut next_column = 0.0;
    for &r in &p.roots {
        place(p, r, &mut next_column, &mut x);
    }
    let columns = next_column.max(1.0);
    let max_level = p.nodes.values().map(|d| d.level).max().unwrap_or(0);
    let canvas_w = (columns * column_px + 2.0 * MARGIN_PX).max(5.0 * 130.0 + 2.0 * MARGIN_PX);
    let canvas_h = LEGEND_HEIGHT_PX + f64::from(max_level) * LEVEL_HEIGHT_PX + NODE_HEIGHT_PX + 2.0 * MARGIN_PX;
    let centre_x = |c: f64| MARGIN_PX + c * column_px + width_px / 2.0;
    let top_y = |level: u32| MARGIN_PX + LEGEND_HEIGHT_PX + f64::from(level) * LEVEL_HEIGHT_PX;
    let mut out = String::new();
    let _ = writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{canvas_w:.0}\" height=\"{canvas_h:.0}\" viewBox=\"0 0 {canvas_w:.0} {canvas_h:.0}\">"
    );
    let _ = writeln!(
        out,
        "<title>tree {}: {} nodes</title>",
        xml_escape(&p.tree_name),
        p.nodes.len()
    );
    let legend_css = SVG_STYLE
        .replace(".node.", ".as-")
        .replace(".node rect", ".legend rect");
    let _ = writeln!(out, "<style>{SVG_STYLE}{legend_css}</style>");
    svg_legend(&mut out, MARGIN_PX);
    let root_x = centre_x((columns - 1.0) / 2.0);
    let root_y = top_y(0) + NODE_HEIGHT_PX / 2.0;
    for (index, d) in &p.nodes {
        let (cx, y) = (centre_x(x[index]), top_y(d.level));
        // A start's parent, if it has one, is not drawn.
        let (px, py) = match d.row.parent().filter(|_| d.level > 1) {
            Some(parent) => (centre_x(x[&parent]), top_y(d.level - 1) + NODE_HEIGHT_PX),
            None => (root_x, root_y + NODE_HEIGHT_PX / 2.0),
        };
        let _ = writeln!(
            out,
            "<line class=\"edge\" x1=\"{px:.1}\" y1=\"{py:.1}\" x2=\"{cx:.1}\" y2=\"{y:.1}\"/>"
        );
    }
    let _ = writeln!(
        out,
        "<g class=\"virtual-root\"><ellipse cx=\"{root_x:.1}\" cy=\"{root_y:.1}\" rx=\"{:.1}\" ry=\"16\"/><text x=\"{root_x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text></g>",
        // Wide enough for its text ("task: under #1000121").
        (p.tree_name.chars().count() as f64 * CHAR_WIDTH_PX * 0.6 + 16.0).max(60.0),
        root_y + 4.0,
        xml_escape(&p.tree_name)
    );
    for (index, d) in &p.nodes {
        let (left, y) = (centre_x(x[index]) - width_px / 2.0, top_y(d.level));
        let corner = if d.row.node_type == NodeType::Root { 8 } else { 2 };
        let _ = writeln!(
            out,
            "<g class=\"{}\" id=\"node-{index}\"><title>{}</title><rect x=\"{left:.1}\" y=\"{y:.1}\" width=\"{width_px:.1}\" height=\"{NODE_HEIGHT_PX}\" rx=\"{corner}\"/><text class=\"caption\" x=\"{:.1}\" y=\"{:.1}\">{}</text><text x=\"{:.1}\" y=\"{:.1}\">{}</text></g>",
            classes(&d.row),
            xml_escape(&format!(
                "{} {}: {}{}",
                caption(d),
                d.row.label.as_str(),
                d.detail,
                match d.hidden {
                    0 => String::new(),
                    hidden => format!(" ({hidden} children not drawn)"),
                }
            )),
            left + 6.0,
            y + 12.0,
            xml_escape(&caption_line(d)),
            left + 6.0,
            y + 28.0,
            xml_escape(&d.label)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The depth histogram of every tree as side-by-side bar charts.
pub fn depth_plot_svg(stats: &Stats) -> String {
    const PANEL_W: f64 = 260.0;
    const PLOT_H: f64 = 160.0;
    const BAR_GAP: f64 = 6.0;
    let panels = stats.trees.len().max(1) as f64;
    let canvas_w = panels * (PANEL_W + MARGIN_PX) + MARGIN_PX;
    let canvas_h = PLOT_H + 90.0;
    let mut out = String::new();
    let _ = writeln!(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{canvas_w:.0}\" height=\"{canvas_h:.0}\" viewBox=\"0 0 {canvas_w:.0} {canvas_h:.0}\">"
    );
    let _ = writeln!(out, "<title>nodes per depth, per tree</title>");
    let _ = writeln!(
        out,
        "<style>text {{ font-family: Helvetica, Arial, sans-serif; font-size: 11px; fill: #222; }} .bar {{ fill: #4a7fc1; }} .axis {{ stroke: #444; }}</style>"
    );
    for (t, tree) in stats.trees.iter().enumerate() {
        let left = MARGIN_PX + t as f64 * (PANEL_W + MARGIN_PX);
        let base_y = 40.0 + PLOT_H;
        let widest = tree.depth_histogram.iter().copied().max().unwrap_or(0).max(1) as f64;
        let slots = tree.depth_histogram.len().max(1) as f64;
        let bar_w = PANEL_W / slots - BAR_GAP;
        let _ = writeln!(out, "<g class=\"panel\" data-tree=\"{}\">", xml_escape(&tree.name));
        let _ = writeln!(
            out,
            "  <text x=\"{left}\" y=\"24\">tree {} ({} nodes)</text>",
            xml_escape(&tree.name),
            tree.nodes
        );
        let _ = writeln!(
            out,
            "  <line class=\"axis\" x1=\"{left}\" y1=\"{base_y}\" x2=\"{}\" y2=\"{base_y}\"/>",
            left + PANEL_W
        );
        for (d, &count) in tree.depth_histogram.iter().enumerate() {
            let h = count as f64 / widest * PLOT_H;
            let x = left + d as f64 * (bar_w + BAR_GAP) + BAR_GAP / 2.0;
            let _ = writeln!(
                out,
                "  <rect class=\"bar\" data-depth=\"{}\" data-count=\"{count}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar_w:.1}\" height=\"{h:.1}\"><title>depth {}: {count} nodes</title></rect>",
                d + 1,
                base_y - h,
                d + 1
            );
            let mid = x + bar_w / 2.0;
            let _ = writeln!(
                out,
                "  <text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{count}</text>",
                base_y - h - 4.0
            );
            let _ = writeln!(
                out,
                "  <text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\">d{}</text>",
                base_y + 16.0,
                d + 1
            );
        }
        let _ = writeln!(out, "</g>");
    }
    out.push_str("</svg>\n");
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DrawFormat {
    /// Indented text with box-drawing branches.
    Text,
    /// Graphviz DOT (render with `dot -Tpng`).
    Dot,
    /// A standalone SVG picture.
    Svg,
}

/// `deltamem draw`: the picture of what `scope` selects, on stdout or in
/// `out` (written through a temporary file); nothing is written when the
/// selection is refused.
pub fn run_draw(
    path: &std::path::Path,
    tree: &str,
    scope: &Scope,
    format: DrawFormat,
    out: Option<&std::path::Path>,
    max_label_chars: usize,
) -> anyhow::Result<super::Status> {
    use anyhow::Context;
    use std::io::Write as _;
    let bank = super::open_read(path)?;
    let selection = super::draw_scope::select(&bank, path, tree, scope)?;
    let text = match format {
        DrawFormat::Text => super::draw::draw_tree(&bank, &selection)?,
        DrawFormat::Dot => tree_dot(&TreePicture::load(&bank, selection, max_label_chars)?),
        DrawFormat::Svg => tree_svg(&TreePicture::load(&bank, selection, max_label_chars)?, max_label_chars),
    };
    match out {
        Some(file) => super::scratch::write_atomically(file, |w| {
            w.write_all(text.as_bytes())
                .map_err(|e| deltamem::interop::InteropError::io("write", file)(e))
        })?,
        None => {
            let mut stdout = super::stdout();
            stdout.write_all(text.as_bytes()).context("cannot write to stdout")?;
            stdout.flush().context("cannot write to stdout")?;
        }
    }
    Ok(super::Status::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_flattened_cut_and_escaped() {
        assert_eq!(one_line("a\n\tb   c", 10), "a b c");
        assert_eq!(one_line("abcdefghij", 5), "abcd…");
        assert_eq!(xml_escape("<a & \"b\">\u{1}"), "&lt;a &amp; &quot;b&quot;&gt; ");
        assert_eq!(dot_escape("say \"hi\"\\n"), "say \\\"hi\\\"\\\\n");
    }
}
