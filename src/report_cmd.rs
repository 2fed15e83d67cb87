//! `dsc report`: a self-contained HTML page of plots (inline SVG, no scripts, no network).

use crate::args::ReportArgs;
use crate::output::outln;
use anyhow::Context as _;
use dsc_format::{Manifest, Stats};
use std::fmt::Write as _;

/// Fill colours, one per kind of plot, so a rendered page can be checked plot by plot.
pub const LENGTH_COLOUR: &str = "#1f77b4";
pub const COLUMN_COLOUR: &str = "#2ca02c";
pub const SHARD_COLOUR: &str = "#d62728";
pub const SPLIT_COLOUR: &str = "#9467bd";

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A bar chart as inline SVG: one bar per value, labels under the first and last bar.
fn bar_chart(title: &str, labels: &[String], values: &[f64], colour: &str) -> String {
    let (w, h, left, bottom, top) = (560.0, 220.0, 56.0, 36.0, 28.0);
    let plot_w = w - left - 12.0;
    let plot_h = h - bottom - top;
    let max = values.iter().copied().fold(0.0f64, f64::max).max(1e-12);
    let n = values.len().max(1) as f64;
    let bar_w = plot_w / n;
    let mut svg = format!(
        "<figure><figcaption>{}</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"{}\">",
        escape(title),
        escape(title)
    );
    let _ = write!(
        svg,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/>",
        top + plot_h,
        left + plot_w,
        top + plot_h
    );
    let _ = write!(
        svg,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
        left - 4.0,
        top + 10.0,
        escape(&crate::output::num(max))
    );
    for (i, &v) in values.iter().enumerate() {
        let bh = (v / max * plot_h).max(if v > 0.0 { 1.0 } else { 0.0 });
        let x = left + i as f64 * bar_w;
        let label = labels.get(i).map(String::as_str).unwrap_or("");
        let _ = write!(
            svg,
            "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.2}\" fill=\"{colour}\"><title>{}: {}</title></rect>",
            x + 0.5,
            top + plot_h - bh,
            (bar_w - 1.0).max(1.0),
            bh,
            escape(label),
            escape(&crate::output::num(v))
        );
    }
    for (i, anchor) in [(0usize, "start"), (values.len().saturating_sub(1), "end")] {
        if let Some(label) = labels.get(i) {
            let x = if anchor == "start" {
                left
            } else {
                left + plot_w
            };
            let _ = write!(
                svg,
                "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"{anchor}\" font-size=\"11\">{}</text>",
                h - 16.0,
                escape(label)
            );
        }
    }
    svg.push_str("</svg></figure>\n");
    svg
}

/// The whole page.
pub fn render(manifest: &Manifest, stats: &Stats) -> String {
    let mut body = String::new();
    let total: u64 = manifest.shards().iter().map(|s| s.bytes).sum();
    let _ = write!(
        body,
        "<h1>dsc cache report</h1><p>format v{}, dsc {}, inputs {} · {} contexts · {} shards · {} · L = {}</p>",
        manifest.format_version(),
        escape(manifest.dsc_version()),
        escape(&manifest.inputs().fingerprint),
        manifest.summary().contexts,
        manifest.shards().len(),
        crate::output::bytes(total),
        manifest.max_len()
    );
    if let Some(all) = stats.split("all") {
        let h = &all.lengths.histogram;
        let labels: Vec<String> = h.iter().map(|b| format!("{}–{}", b.lo, b.hi)).collect();
        let values: Vec<f64> = h.iter().map(|b| b.count as f64).collect();
        body.push_str("<h2>Sequence lengths</h2>");
        body.push_str(&bar_chart(
            "contexts per sequence length (power-of-two bins, before truncation)",
            &labels,
            &values,
            LENGTH_COLOUR,
        ));
        body.push_str("<h2>Columns</h2><div class=\"grid\">");
        for c in &all.columns {
            if let Some(n) = &c.numeric {
                let mut labels: Vec<String> = n
                    .histogram
                    .iter()
                    .map(|b| crate::output::num(b.lo))
                    .collect();
                if let Some(last) = labels.last_mut() {
                    *last = crate::output::num(n.max);
                }
                let values: Vec<f64> = n.histogram.iter().map(|b| b.count as f64).collect();
                let title = format!(
                    "{} ({}, {}): mean {}, std {}",
                    c.name,
                    c.table,
                    c.source_type,
                    crate::output::num(n.mean),
                    crate::output::num(n.std)
                );
                body.push_str(&bar_chart(&title, &labels, &values, COLUMN_COLOUR));
            } else if let Some(vocab) = &c.vocabulary {
                let top: Vec<_> = vocab.iter().take(20).collect();
                let labels: Vec<String> = top.iter().map(|v| v.value.to_string()).collect();
                let values: Vec<f64> = top.iter().map(|v| v.count as f64).collect();
                let title = format!(
                    "{} ({}): {} values, top {}",
                    c.name,
                    c.table,
                    vocab.len(),
                    top.len()
                );
                body.push_str(&bar_chart(&title, &labels, &values, COLUMN_COLOUR));
            }
        }
        body.push_str("</div>");
    }
    let labels: Vec<String> = manifest
        .shards()
        .iter()
        .map(|s| s.file.trim_start_matches("shards/").to_string())
        .collect();
    let values: Vec<f64> = manifest
        .shards()
        .iter()
        .map(|s| s.bytes as f64 / f64::from(1u32 << 20))
        .collect();
    body.push_str("<h2>Shards</h2>");
    body.push_str(&bar_chart("MiB per shard", &labels, &values, SHARD_COLOUR));
    let labels: Vec<String> = manifest.splits().iter().map(|s| s.name.clone()).collect();
    let values: Vec<f64> = manifest
        .splits()
        .iter()
        .map(|s| s.contexts as f64)
        .collect();
    body.push_str("<h2>Splits</h2>");
    body.push_str(&bar_chart(
        "contexts per split",
        &labels,
        &values,
        SPLIT_COLOUR,
    ));
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dsc cache report</title><style>\
body{{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}}\
figure{{margin:8px;display:inline-block}}figcaption{{font-size:13px;margin-bottom:4px}}\
.grid{{display:flex;flex-wrap:wrap}}h2{{margin-top:28px}}</style></head><body>\n{body}</body></html>\n"
    )
}

pub fn run(a: ReportArgs) -> anyhow::Result<u8> {
    let (manifest, stats) = dsc_loader::read_meta(&a.cache, &a.remote.options_at(&a.at)?)?;
    let html = render(&manifest, &stats);
    let tmp = a.output.with_extension("html.tmp");
    std::fs::write(&tmp, html).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &a.output)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    outln!("wrote {}", a.output.display());
    Ok(0)
}
