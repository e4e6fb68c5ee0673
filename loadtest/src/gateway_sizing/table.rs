//! Sizing records as tables: a Markdown summary (cores per 100 req/s, memory), every cell in
//! Markdown and CSV, and the records as JSON.
//!
//! Invariants: pure functions of the records, in the records' order of first appearance (no
//! sorting by value); a cell run below the asked rate is marked with its rate; every column of
//! the CSV is a field of [`CellRecord`].

use std::fmt::Write as _;

use super::{CellRecord, HashKind, Kind};

/// "1M", "10M", "500k" or the plain number.
pub fn count_label(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(100_000) {
        let m = n as f64 / 1e6;
        if n.is_multiple_of(1_000_000) {
            format!("{}M", n / 1_000_000)
        } else {
            format!("{m:.1}M")
        }
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// "1K", "8K", "100K" for prompt lengths in tokens (1K = 1024).
pub fn tokens_label(t: u32) -> String {
    if t >= 1024 && t.is_multiple_of(1024) {
        format!("{}K", t / 1024)
    } else {
        t.to_string()
    }
}

fn distinct<T: PartialEq + Copy>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v = Vec::new();
    for x in it {
        if !v.contains(&x) {
            v.push(x);
        }
    }
    v
}

/// The summary: per hash mode, cores per 100 req/s for each prompt and traffic kind (rows) and
/// each index size and thread count (columns); then memory and idle CPU per gateway.
pub fn summary_markdown(cells: &[CellRecord]) -> String {
    let mut s = String::new();
    let configs = distinct(cells.iter().map(|c| (c.index_target, c.threads)));
    let _ = write!(s, "| mode | prompt | traffic |");
    for (idx, th) in &configs {
        let _ = write!(s, " {} idx, {} thr |", count_label(*idx), th);
    }
    s.push('\n');
    s.push_str("|---|---|---|");
    for _ in &configs {
        s.push_str("---:|");
    }
    s.push('\n');
    for mode in distinct(cells.iter().map(|c| c.mode)) {
        for tokens in distinct(cells.iter().filter(|c| c.mode == mode).map(|c| c.tokens)) {
            for kind in distinct(cells.iter().map(|c| c.kind)) {
                let row: Vec<&CellRecord> = cells
                    .iter()
                    .filter(|c| c.mode == mode && c.tokens == tokens && c.kind == kind)
                    .collect();
                if row.is_empty() {
                    continue;
                }
                let _ = write!(
                    s,
                    "| {} | {} | {} |",
                    mode.as_str(),
                    tokens_label(tokens),
                    kind.as_str()
                );
                for (idx, th) in &configs {
                    match row
                        .iter()
                        .find(|c| c.index_target == *idx && c.threads == *th)
                    {
                        Some(c) => {
                            let _ = write!(s, " {} |", cores_cell(c));
                        }
                        None => s.push_str(" |"),
                    }
                }
                s.push('\n');
            }
        }
    }
    s.push('\n');
    s.push_str(
        "| mode | index | threads | entries after fill | RSS after fill MiB | peak RSS MiB | idle cores |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for mode in distinct(cells.iter().map(|c| c.mode)) {
        for (idx, th) in &configs {
            let g: Vec<&CellRecord> = cells
                .iter()
                .filter(|c| c.mode == mode && c.index_target == *idx && c.threads == *th)
                .collect();
            let Some(first) = g.first() else { continue };
            let peak = g.iter().map(|c| c.hwm_mib).fold(0.0, f64::max);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.0} | {:.0} | {:.3} |",
                mode.as_str(),
                count_label(*idx),
                th,
                first.index_after_fill,
                first.rss_after_fill_mib,
                peak,
                first.idle_cores
            );
        }
    }
    s
}

fn cores_cell(c: &CellRecord) -> String {
    let mut v = format!("{:.3}", c.cores_per_100);
    if c.rate + 1e-9 < c.rate_asked {
        let _ = write!(v, " (at {:.0}/s)", c.rate);
    }
    if c.errors > 0 {
        let _ = write!(v, " ({} errors)", c.errors);
    }
    v
}

const COLUMNS: &[&str] = &[
    "mode",
    "threads",
    "index_target",
    "index_after_fill",
    "index_after_cell",
    "tokens",
    "kind",
    "first_prompt_tokens",
    "body_kib",
    "rate",
    "rate_asked",
    "requests",
    "errors",
    "wall_s",
    "cpu_s",
    "cores_per_100",
    "cpu_ms_per_request",
    "idle_cores",
    "backend_cpu_s",
    "driver_cpu_s",
    "p50_ms",
    "p99_ms",
    "rss_after_fill_mib",
    "rss_mib",
    "hwm_mib",
    "token_cache_hit_ratio",
    "max_send_lag_ms",
    "first_error",
];

fn fields(c: &CellRecord) -> Vec<String> {
    let f1 = |x: f64| format!("{x:.1}");
    let f3 = |x: f64| format!("{x:.3}");
    vec![
        c.mode.as_str().to_string(),
        c.threads.to_string(),
        c.index_target.to_string(),
        c.index_after_fill.to_string(),
        c.index_after_cell.to_string(),
        c.tokens.to_string(),
        c.kind.as_str().to_string(),
        c.first_prompt_tokens.to_string(),
        f1(c.body_kib),
        f1(c.rate),
        f1(c.rate_asked),
        c.requests.to_string(),
        c.errors.to_string(),
        f3(c.wall_s),
        f3(c.cpu_s),
        f3(c.cores_per_100),
        f3(c.cpu_ms_per_request),
        f3(c.idle_cores),
        f3(c.backend_cpu_s),
        f3(c.driver_cpu_s),
        f3(c.p50_ms),
        f3(c.p99_ms),
        f1(c.rss_after_fill_mib),
        f1(c.rss_mib),
        f1(c.hwm_mib),
        c.token_cache_hit_ratio.map(f3).unwrap_or_default(),
        f1(c.max_send_lag_ms),
        c.first_error.clone().unwrap_or_default(),
    ]
}

/// Every cell, one row each, as a Markdown table.
pub fn cells_markdown(cells: &[CellRecord]) -> String {
    let mut s = format!("| {} |\n|", COLUMNS.join(" | "));
    for _ in COLUMNS {
        s.push_str("---|");
    }
    s.push('\n');
    for c in cells {
        let row: Vec<String> = fields(c)
            .into_iter()
            .map(|f| f.replace('|', "\\|").replace('\n', " "))
            .collect();
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    s
}

/// Every cell as CSV (RFC 4180 quoting where needed).
pub fn cells_csv(cells: &[CellRecord]) -> String {
    let quote = |f: String| {
        if f.contains([',', '"', '\n']) {
            format!("\"{}\"", f.replace('"', "\"\""))
        } else {
            f
        }
    };
    let mut s = COLUMNS.join(",");
    s.push('\n');
    for c in cells {
        let row: Vec<String> = fields(c).into_iter().map(quote).collect();
        s.push_str(&row.join(","));
        s.push('\n');
    }
    s
}

/// The cell of `cells` for a goal check, if measured.
pub fn find(
    cells: &[CellRecord],
    mode: HashKind,
    kind: Kind,
    tokens: u32,
    threads: usize,
) -> Vec<&CellRecord> {
    cells
        .iter()
        .filter(|c| c.mode == mode && c.kind == kind && c.tokens == tokens && c.threads == threads)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(mode: HashKind, idx: u64, th: usize, tokens: u32, kind: Kind, cores: f64) -> CellRecord {
        CellRecord {
            mode,
            threads: th,
            index_target: idx,
            index_after_fill: idx - 10,
            index_after_cell: idx - 5,
            rss_after_fill_mib: 100.0,
            idle_cores: 0.01,
            tokens,
            kind,
            rate: 100.0,
            rate_asked: 100.0,
            requests: 600,
            errors: 0,
            first_error: None,
            wall_s: 6.0,
            cpu_s: cores * 6.0,
            backend_cpu_s: 0.1,
            driver_cpu_s: 0.2,
            cores_per_100: cores,
            cpu_ms_per_request: cores * 10.0,
            p50_ms: 1.0,
            p99_ms: 2.0,
            body_kib: 7.0,
            first_prompt_tokens: tokens + 5,
            rss_mib: 120.0,
            hwm_mib: 130.0,
            token_cache_hit_ratio: None,
            max_send_lag_ms: 0.5,
        }
    }

    #[test]
    fn labels() {
        assert_eq!(count_label(1_000_000), "1M");
        assert_eq!(count_label(10_000_000), "10M");
        assert_eq!(count_label(2_500_000), "2.5M");
        assert_eq!(count_label(50_000), "50k");
        assert_eq!(count_label(123), "123");
        assert_eq!(tokens_label(102_400), "100K");
        assert_eq!(tokens_label(1000), "1000");
    }

    #[test]
    fn summary_has_a_column_per_gateway_and_marks_lowered_rates() {
        let mut cells = vec![
            rec(HashKind::Token, 1_000_000, 1, 1024, Kind::Unique, 0.05),
            rec(HashKind::Token, 1_000_000, 2, 1024, Kind::Unique, 0.06),
            rec(HashKind::Token, 1_000_000, 1, 1024, Kind::MultiTurn, 0.04),
        ];
        let mut slow = rec(HashKind::Token, 1_000_000, 2, 1024, Kind::MultiTurn, 1.5);
        slow.rate = 40.0;
        cells.push(slow);
        let md = summary_markdown(&cells);
        assert!(
            md.contains("| mode | prompt | traffic | 1M idx, 1 thr | 1M idx, 2 thr |"),
            "{md}"
        );
        assert!(
            md.contains("| token | 1K | unique | 0.050 | 0.060 |"),
            "{md}"
        );
        assert!(
            md.contains("| token | 1K | multi | 0.040 | 1.500 (at 40/s) |"),
            "{md}"
        );
        assert!(
            md.contains("| token | 1M | 2 | 999990 | 100 | 130 | 0.010 |"),
            "{md}"
        );
    }

    #[test]
    fn csv_and_markdown_rows_have_every_column() {
        let mut c = rec(HashKind::Text, 10_000_000, 2, 8192, Kind::MultiTurn, 0.2);
        c.first_error = Some("status 503, \"busy\" | x".into());
        let csv = cells_csv(&[c.clone()]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].split(',').count(), COLUMNS.len());
        assert!(
            lines[1].ends_with("\"status 503, \"\"busy\"\" | x\""),
            "{}",
            lines[1]
        );
        let md = cells_markdown(&[c]);
        assert_eq!(md.lines().count(), 3);
        assert!(md.contains("\\| x"), "{md}");
        assert_eq!(
            fields(&rec(HashKind::Text, 1_000_000, 1, 1024, Kind::Unique, 0.1)).len(),
            COLUMNS.len()
        );
    }
}
