//! The audit report as a text table and as a self-contained HTML page (inline CSS and SVG, no
//! external assets).

use std::fmt::Write;

use super::{AuditReport, FillBin, NodeReport, ProblemBucket};

/// Rows of problem buckets the table lists by name.
const TABLE_PROBLEMS: usize = 20;

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Decimal units: `17.6 MB`, `880.6 GB`, `1.2 TB`.
pub fn human(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1000.0 && unit < UNITS.len() - 1 {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Unix ms as `2026-01-31 23:59:59 UTC` (civil-from-days, proleptic Gregorian).
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// (label, value) rows of the summary, shared by the table and the page.
fn summary(r: &AuditReport) -> Vec<(String, String)> {
    let mut rows = vec![
        ("entries (sum of HLEN)".to_owned(), thousands(r.entries)),
        (
            "bytes (sum of MEMORY USAGE)".to_owned(),
            format!("{} ({})", thousands(r.bytes), human(r.bytes as f64)),
        ),
        (
            "bytes per entry".to_owned(),
            format!("{:.2}", r.bytes_per_entry),
        ),
        (
            "buckets probed / found / recorded".to_owned(),
            format!(
                "{} / {} / {}",
                thousands(r.buckets),
                thousands(r.buckets_found),
                thousands(r.keyspace_buckets)
            ),
        ),
    ];
    if let (Some(e), Some(b)) = (r.estimated_keyspace_entries, r.estimated_keyspace_bytes) {
        rows.push((
            "whole keyspace, scaled from the sample".to_owned(),
            format!("{} entries, {}", thousands(e), human(b as f64)),
        ));
    }
    rows.push((
        "fill min / p50 / p99 / max / mean".to_owned(),
        format!(
            "{} / {} / {} / {} / {:.1}",
            r.fill.min, r.fill.p50, r.fill.p99, r.fill.max, r.fill.mean
        ),
    ));
    for (enc, s) in &r.encodings {
        rows.push((
            format!("encoding {enc}"),
            format!(
                "{} buckets, {:.2} B/entry",
                thousands(s.buckets),
                s.bytes as f64 / s.entries.max(1) as f64
            ),
        ));
    }
    let limits: Vec<Option<u64>> = r.nodes.iter().map(|n| n.listpack_limit).collect();
    let limit = if r.cluster && limits.windows(2).any(|w| w[0] != w[1]) {
        format!(
            "{} (the lowest; per primary: {})",
            or_dash(r.listpack_limit),
            limits
                .iter()
                .map(|l| or_dash(*l))
                .collect::<Vec<_>>()
                .join(" / ")
        )
    } else {
        or_dash(r.listpack_limit)
    };
    let sum = if r.cluster {
        format!(", sum of {} primaries", r.nodes.len())
    } else {
        String::new()
    };
    if r.cluster {
        rows.push((
            "Redis Cluster primaries".to_owned(),
            thousands(r.nodes.len() as u64),
        ));
    }
    rows.extend([
        ("hash-max-listpack-entries".to_owned(), limit),
        (
            format!(
                "buckets near the limit (>= {} %)",
                super::NEAR_LIMIT_PERCENT
            ),
            thousands(r.near_limit_bucket_count),
        ),
        (
            "buckets over the limit".to_owned(),
            thousands(r.over_limit_bucket_count),
        ),
        (
            "hashtable buckets".to_owned(),
            thousands(r.hashtable_bucket_count),
        ),
        (
            "expired, not yet swept".to_owned(),
            format!(
                "{} ({:.2} %)",
                thousands(r.expired_entries),
                100.0 * r.expired_entries as f64 / r.entries.max(1) as f64
            ),
        ),
        (
            "never expiring".to_owned(),
            thousands(r.never_expiring_entries),
        ),
        (
            format!("used_memory / rss (INFO memory{sum})"),
            format!(
                "{} / {}",
                or_dash(r.memory.used_memory.map(|b| human(b as f64))),
                or_dash(r.memory.used_memory_rss.map(|b| human(b as f64)))
            ),
        ),
        (
            "fragmentation ratio (rss / used, allocator)".to_owned(),
            format!(
                "{} / {}",
                or_dash(r.memory.mem_fragmentation_ratio),
                or_dash(r.memory.allocator_frag_ratio)
            ),
        ),
    ]);
    if let Some(p) = &r.projection {
        rows.push((
            format!("projected to {} entries", thousands(p.entries)),
            format!(
                "{} ({:.2} TB) in {} buckets of mean fill {}",
                human(p.bytes),
                p.tb,
                thousands(p.buckets),
                p.mean_fill
            ),
        ));
    }
    rows
}

/// Column headers and one row of cells per node (the per-primary lines of a cluster).
fn node_rows(r: &AuditReport) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "primary",
        "buckets",
        "entries",
        "bytes",
        "B/entry",
        "listpack limit",
        "over limit",
        "hashtable",
        "used_memory",
        "rss",
    ];
    let rows = r
        .nodes
        .iter()
        .map(|n: &NodeReport| {
            vec![
                n.node.clone(),
                thousands(n.buckets),
                thousands(n.entries),
                thousands(n.bytes),
                format!("{:.2}", n.bytes as f64 / n.entries.max(1) as f64),
                or_dash(n.listpack_limit),
                thousands(n.over_limit_bucket_count),
                thousands(n.hashtable_bucket_count),
                or_dash(n.memory.used_memory.map(|b| human(b as f64))),
                or_dash(n.memory.used_memory_rss.map(|b| human(b as f64))),
            ]
        })
        .collect();
    (header, rows)
}

fn problem_flags(b: &ProblemBucket) -> String {
    match (b.encoding == "hashtable", b.over_limit) {
        (true, true) => "hashtable, over the limit".to_owned(),
        (true, false) => "hashtable".to_owned(),
        (false, _) => "over the limit".to_owned(),
    }
}

/// Every listed problem bucket once (a bucket can be both over the limit and a hashtable).
fn problems(r: &AuditReport) -> (Vec<&ProblemBucket>, u64) {
    let mut list: Vec<&ProblemBucket> = r.hashtable_buckets.iter().collect();
    for b in &r.over_limit_buckets {
        if !list.iter().any(|p| p.key == b.key) {
            list.push(b);
        }
    }
    let total = r.problem_bucket_count.max(list.len() as u64);
    (list, total)
}

/// The readable table.
pub fn table(r: &AuditReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "namelist audit of {} (redis {}, {}) at {}: {}{} buckets probed in {:.1} s",
        r.prefix,
        r.redis_version.as_deref().unwrap_or("?"),
        r.memory.mem_allocator.as_deref().unwrap_or("?"),
        utc(r.started_at_ms),
        if r.sampled { "a sample of " } else { "" },
        thousands(r.buckets),
        r.elapsed_seconds
    );
    let rows = summary(r);
    let width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    for (label, value) in &rows {
        let _ = writeln!(out, "  {label:<width$}  {value}");
    }

    if r.cluster {
        let (header, rows) = node_rows(r);
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                rows.iter()
                    .map(|row| row[i].len())
                    .chain([header[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut l = String::from(" ");
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i == 0 {
                    let _ = write!(l, " {c:<w$}");
                } else {
                    let _ = write!(l, "  {c:>w$}");
                }
            }
            l
        };
        let _ = writeln!(out, "\nper primary of the Redis Cluster:");
        let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
        let _ = writeln!(out, "{}", line(&header));
        for row in &rows {
            let _ = writeln!(out, "{}", line(row));
        }
    }

    let (list, total) = problems(r);
    if total > 0 {
        let _ = writeln!(
            out,
            "\nproblem buckets (hashtable, or over the limit of {}): {}",
            or_dash(r.listpack_limit),
            thousands(total)
        );
        for b in list.iter().take(TABLE_PROBLEMS) {
            let _ = writeln!(
                out,
                "  {:<32} {:>9} fields {:>11} B  {}",
                b.key,
                thousands(b.fields),
                thousands(b.bytes),
                problem_flags(b)
            );
        }
        if total > TABLE_PROBLEMS as u64 {
            let _ = writeln!(
                out,
                "  ... and {} more (--json lists up to 1000 of each kind)",
                thousands(total - TABLE_PROBLEMS as u64)
            );
        }
    }

    if let Some(c) = &r.comparison {
        let _ = writeln!(
            out,
            "\nlayout comparison: the same {} entries (from {} buckets), written under {}, measured, deleted",
            thousands(c.entries),
            c.source_buckets,
            c.scratch_prefix
        );
        let ours = c
            .layouts
            .first()
            .map_or(r.bytes_per_entry, |l| l.bytes_per_entry);
        let lw = c.layouts.iter().map(|l| l.label.len()).max().unwrap_or(0);
        let projected = r
            .projection
            .as_ref()
            .map(|p| format!("at {}", thousands(p.entries)));
        let _ = writeln!(
            out,
            "  {:<lw$}  {:>9}  {:>9}  {:>7}  {:>14}  {:>13}",
            "layout",
            "keys",
            "B/entry",
            "x ours",
            projected.as_deref().unwrap_or(""),
            "seed article"
        );
        for l in &c.layouts {
            let at = r
                .projection
                .as_ref()
                .map(|p| human(l.bytes_per_entry * p.entries as f64))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<lw$}  {:>9}  {:>9.2}  {:>7.2}  {:>14}  {:>13}",
                l.label,
                thousands(l.keys),
                l.bytes_per_entry,
                l.bytes_per_entry / ours.max(f64::MIN_POSITIVE),
                at,
                or_dash(l.seed_reported_bytes_per_entry.map(|v| format!("{v:.1}")))
            );
        }
        for n in &c.notes {
            let _ = writeln!(out, "  note: {n}");
        }
    }
    out
}

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The fill histogram as an SVG bar chart, one equal slot per bin (the overflow bin last, in
/// red like every bin past the limit), the listpack limit marked.
fn fill_chart(bins: &[FillBin], limit: Option<u64>) -> String {
    let Some(first) = bins.first() else {
        return "<p>No buckets.</p>".to_owned();
    };
    let (w, h, left, right, top, bottom) = (820.0, 300.0, 60.0, 20.0, 24.0, 45.0);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let y0 = top + plot_h;
    let slot = plot_w / bins.len() as f64;
    let width = (first.to - first.from).max(1) as f64;
    let peak = bins.iter().map(|b| b.buckets).max().unwrap_or(0).max(1) as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="bucket fill histogram">"#
    );
    let _ = write!(
        s,
        r##"<line x1="{left}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#444"/><line x1="{left}" y1="{top}" x2="{left}" y2="{y0}" stroke="#444"/>"##,
        x1 = left + plot_w
    );
    let _ = write!(
        s,
        r#"<text x="{tx}" y="{top}" text-anchor="end">{peak}</text><text x="{tx}" y="{y0}" text-anchor="end">0</text>"#,
        tx = left - 6.0,
        peak = thousands(peak as u64),
    );
    let label_every = bins.len().div_ceil(10).max(1);
    for (i, b) in bins.iter().enumerate() {
        let bx = left + i as f64 * slot;
        let bh = b.buckets as f64 / peak * plot_h;
        let past_limit = b.overflow || limit.is_some_and(|l| b.from > l);
        let colour = if past_limit { "#c0392b" } else { "#3a7bd5" };
        let range = if b.overflow {
            format!("{} and more", b.from)
        } else {
            format!("{}-{}", b.from, b.to - 1)
        };
        let _ = write!(
            s,
            r#"<rect x="{bx:.1}" y="{by:.1}" width="{bw:.1}" height="{bh:.1}" fill="{colour}"><title>fill {range}: {n} buckets</title></rect>"#,
            by = y0 - bh,
            bw = (slot - 1.0).max(1.0),
            n = thousands(b.buckets)
        );
        if b.buckets > 0 && bh < 3.0 {
            // A bar too short to see: mark it.
            let _ = write!(
                s,
                r#"<text x="{cx:.1}" y="{ty:.1}" text-anchor="middle" fill="{colour}">{n}</text>"#,
                cx = bx + slot / 2.0,
                ty = y0 - 10.0,
                n = thousands(b.buckets)
            );
        }
        if b.overflow {
            let _ = write!(
                s,
                r#"<text x="{cx:.1}" y="{ty}" text-anchor="middle">&#8805;{from}</text>"#,
                cx = bx + slot / 2.0,
                ty = y0 + 16.0,
                from = b.from
            );
        } else if i % label_every == 0 {
            let _ = write!(
                s,
                r#"<text x="{bx:.1}" y="{ty}" text-anchor="middle">{from}</text>"#,
                ty = y0 + 16.0,
                from = b.from
            );
        }
    }
    let _ = write!(
        s,
        r#"<text x="{cx}" y="{ty}" text-anchor="middle">fields per bucket (bars: buckets)</text>"#,
        cx = left + plot_w / 2.0,
        ty = h - 6.0
    );
    if let Some(l) = limit {
        // The boundary between fill l (allowed) and l + 1 (converted).
        let at = (l + 1) as f64;
        let regular = bins.iter().filter(|b| !b.overflow).count();
        let end = first.from as f64 + regular as f64 * width;
        let lx = if at < first.from as f64 {
            None
        } else if at <= end {
            Some(left + (at - first.from as f64) / width * slot)
        } else if regular < bins.len() {
            Some(left + regular as f64 * slot)
        } else {
            None
        };
        if let Some(lx) = lx {
            // The label goes on whichever side has room.
            let (tx, anchor) = if lx > left + plot_w * 0.6 {
                (lx - 5.0, "end")
            } else {
                (lx + 5.0, "start")
            };
            let _ = write!(
                s,
                r##"<line x1="{lx:.1}" y1="{y1}" x2="{lx:.1}" y2="{y0}" stroke="#c0392b" stroke-width="2" stroke-dasharray="6 4"/><text x="{tx:.1}" y="{ty}" fill="#c0392b" text-anchor="{anchor}">listpack limit {l}</text>"##,
                y1 = top - 10.0,
                ty = top - 4.0
            );
        }
    }
    s.push_str("</svg>");
    s
}

/// Bytes per entry by layout, as horizontal bars with their values.
fn layout_chart(r: &AuditReport) -> String {
    let Some(c) = &r.comparison else {
        return "<p>No layout comparison (<code>--compare-sample 0</code>, or it failed: see the warnings).</p>".to_owned();
    };
    let (w, row, label_w, right) = (820.0, 30.0, 330.0, 90.0);
    let h = row * c.layouts.len() as f64 + 10.0;
    let peak = c
        .layouts
        .iter()
        .map(|l| l.bytes_per_entry)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="bytes per entry by layout">"#
    );
    for (i, l) in c.layouts.iter().enumerate() {
        let y = 5.0 + i as f64 * row;
        let bw = (l.bytes_per_entry / peak * (w - label_w - right)).max(1.0);
        let colour = if l.layout.starts_with("ours") {
            "#27ae60"
        } else {
            "#e67e22"
        };
        let _ = write!(
            s,
            r#"<text x="{lx}" y="{ty:.1}" text-anchor="end">{label}</text><rect x="{label_w}" y="{y:.1}" width="{bw:.1}" height="{bh}" fill="{colour}"><title>{label}: {bpe:.2} B per entry, {keys} keys</title></rect><text x="{vx:.1}" y="{ty:.1}">{bpe:.1} B</text>"#,
            lx = label_w - 8.0,
            ty = y + row / 2.0 + 1.0,
            label = esc(&l.label),
            bh = row - 8.0,
            bpe = l.bytes_per_entry,
            keys = thousands(l.keys),
            vx = label_w + bw + 6.0
        );
    }
    s.push_str("</svg>");
    s
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:900px;color:#222;padding:0 1em}\
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:.5em 0}th,td{padding:3px 12px;border-bottom:1px solid #e4e4e4;text-align:left;vertical-align:top}\
td.n{text-align:right;font-variant-numeric:tabular-nums}code{font-size:.95em}\
.warn{color:#a33}.muted{color:#777}svg text{font-size:12px;font-family:inherit;dominant-baseline:middle}";

/// The self-contained HTML page.
pub fn html(r: &AuditReport) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>namelist audit: {p}</title><style>{CSS}</style></head><body>\
         <h1>namelist audit of <code>{p}</code></h1><p class=\"muted\">redis {v}, {a}; {sampled}{b} buckets probed in {t:.1} s, started {at}.</p>",
        p = esc(&r.prefix),
        v = esc(r.redis_version.as_deref().unwrap_or("?")),
        a = esc(r.memory.mem_allocator.as_deref().unwrap_or("?")),
        sampled = if r.sampled { "a sample of " } else { "" },
        b = thousands(r.buckets),
        t = r.elapsed_seconds,
        at = utc(r.started_at_ms)
    );
    s.push_str("<h2>Summary</h2><table>");
    for (label, value) in summary(r) {
        let _ = write!(
            s,
            "<tr><th>{}</th><td class=\"n\">{}</td></tr>",
            esc(&label),
            esc(&value)
        );
    }
    s.push_str("</table>");

    if r.cluster {
        let (header, rows) = node_rows(r);
        let _ = write!(
            s,
            "<h2>Per primary</h2><p>The {} primaries of the Redis Cluster, each SCANned in turn: its buckets, its own \
             <code>hash-max-listpack-entries</code> and its <code>INFO memory</code>.</p><table><tr>",
            r.nodes.len()
        );
        for h in header {
            let _ = write!(s, "<th>{}</th>", esc(h));
        }
        s.push_str("</tr>");
        for row in rows {
            s.push_str("<tr>");
            for (i, c) in row.iter().enumerate() {
                if i == 0 {
                    let _ = write!(s, "<td><code>{}</code></td>", esc(c));
                } else {
                    let _ = write!(s, "<td class=\"n\">{}</td>", esc(c));
                }
            }
            s.push_str("</tr>");
        }
        s.push_str("</table>");
    }

    let _ = write!(
        s,
        "<h2>Bucket fill</h2><p>Fields per bucket over the {} buckets probed. A bucket above \
         <code>hash-max-listpack-entries</code> ({}) is converted to a hashtable and costs several times more per entry.</p>{}",
        thousands(r.buckets),
        or_dash(r.listpack_limit),
        fill_chart(&r.fill_histogram, r.listpack_limit)
    );

    s.push_str("<h2>Bytes per entry by layout</h2>");
    if let Some(c) = &r.comparison {
        let _ = write!(
            s,
            "<p>The same {} entries (read from {} buckets) written in each layout under <code>{}</code>, measured with \
             <code>MEMORY USAGE key SAMPLES 0</code> and deleted. <em>ours</em> is the audited keyspace itself.</p>",
            thousands(c.entries),
            c.source_buckets,
            esc(&c.scratch_prefix)
        );
    }
    s.push_str(&layout_chart(r));
    if let Some(c) = &r.comparison {
        s.push_str("<table><tr><th>layout</th><th>keys</th><th>bytes</th><th>B/entry</th><th>key name B</th><th>hashtable keys</th>");
        if let Some(p) = &r.projection {
            let _ = write!(s, "<th>at {} entries</th>", thousands(p.entries));
        }
        s.push_str("<th>seed article</th></tr>");
        for l in &c.layouts {
            let _ = write!(
                s,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.2}</td><td class=\"n\">{:.1}</td><td class=\"n\">{}</td>",
                esc(&l.label),
                thousands(l.keys),
                thousands(l.bytes),
                l.bytes_per_entry,
                l.key_name_bytes,
                thousands(l.hashtable_keys)
            );
            if let Some(p) = &r.projection {
                let _ = write!(
                    s,
                    "<td class=\"n\">{}</td>",
                    human(l.bytes_per_entry * p.entries as f64)
                );
            }
            let _ = write!(
                s,
                "<td class=\"n\">{}</td></tr>",
                or_dash(l.seed_reported_bytes_per_entry.map(|v| format!("{v:.1}")))
            );
        }
        s.push_str("</table>");
        for n in &c.notes {
            let _ = write!(s, "<p class=\"muted\">{}</p>", esc(n));
        }
    }

    let (list, total) = problems(r);
    let _ = write!(
        s,
        "<h2>Problem buckets</h2><p>{} buckets are hashtables or over the limit of {}.</p>",
        thousands(total),
        or_dash(r.listpack_limit)
    );
    if !list.is_empty() {
        s.push_str("<table><tr><th>bucket</th><th>fields</th><th>bytes</th><th>problem</th></tr>");
        for b in &list {
            let _ = write!(
                s,
                "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&b.key),
                thousands(b.fields),
                thousands(b.bytes),
                problem_flags(b)
            );
        }
        s.push_str("</table>");
        if total > list.len() as u64 {
            let _ = write!(
                s,
                "<p class=\"muted\">... and {} more.</p>",
                thousands(total - list.len() as u64)
            );
        }
    }
    if !r.warnings.is_empty() {
        s.push_str("<h2>Warnings</h2><ul>");
        for w in &r.warnings {
            let _ = write!(s, "<li class=\"warn\">{}</li>", esc(w));
        }
        s.push_str("</ul>");
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(50_000_000_000), "50,000,000,000");
        assert_eq!(human(17.0), "17 B");
        assert_eq!(human(880_600_000_000.0), "880.6 GB");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_577_836_800_000), "2020-01-01 00:00:00 UTC");
        assert_eq!(utc(1_709_251_199_000), "2024-02-29 23:59:59 UTC");
        assert_eq!(esc("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
    }

    #[test]
    fn chart_marks_the_limit() {
        let bins = vec![
            FillBin {
                from: 300,
                to: 410,
                buckets: 5,
                overflow: false,
            },
            FillBin {
                from: 410,
                to: 520,
                buckets: 2,
                overflow: false,
            },
        ];
        let svg = fill_chart(&bins, Some(512));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("listpack limit 512"));
        assert!(!fill_chart(&bins, Some(4096)).contains("listpack limit"));
    }
}
