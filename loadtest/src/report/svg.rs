//! Minimal inline SVG charts (line charts and bar charts) with no scripts and no external assets.
//!
//! Every chart has a fixed size, axes with a handful of ticks and a legend; inputs are bounded
//! by downsampling each series to at most [`MAX_POINTS`] points so reports stay small.

use std::fmt::Write;

/// Most points drawn per series.
pub const MAX_POINTS: usize = 600;
const W: f64 = 720.0;
const H: f64 = 320.0;
const ML: f64 = 60.0;
const MR: f64 = 170.0;
const MT: f64 = 30.0;
const MB: f64 = 45.0;

/// Colours cycled over series.
pub const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// Escapes text for HTML/SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One named series of `(x, y)` points.
pub struct Series<'a> {
    /// Legend label.
    pub name: &'a str,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

fn downsample(p: &[(f64, f64)]) -> Vec<(f64, f64)> {
    if p.len() <= MAX_POINTS {
        return p.to_vec();
    }
    let step = p.len() as f64 / MAX_POINTS as f64;
    let mut v: Vec<(f64, f64)> = (0..MAX_POINTS)
        .map(|i| p[(i as f64 * step) as usize])
        .collect();
    if let Some(&last) = p.last() {
        v.push(last);
    }
    v
}

fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut v = Vec::new();
    while t <= hi + step * 1e-9 && v.len() < 12 {
        v.push(t);
        t += step;
    }
    v
}

fn fmt_tick(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.1}")
    } else if x.abs() >= 0.01 {
        format!("{x:.2}")
    } else {
        format!("{x:.0e}")
    }
}

/// A line chart. With `log_x`, x must be positive and the axis is logarithmic.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series<'_>],
    log_x: bool,
) -> String {
    let tx = |x: f64| if log_x { x.max(1e-9).log10() } else { x };
    let pts: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|s| {
            downsample(&s.points)
                .into_iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_x || *x > 0.0))
                .map(|(x, y)| (tx(x), y))
                .collect()
        })
        .collect();
    let all = pts.iter().flatten();
    let (mut x0, mut x1, mut y0, mut y1) =
        (f64::INFINITY, f64::NEG_INFINITY, 0.0f64, f64::NEG_INFINITY);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11"><text x="{}" y="16" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"#,
        (ML + W - MR) / 2.0,
        esc(title)
    );
    if !x0.is_finite() {
        out.push_str(r#"<text x="300" y="160">no data</text></svg>"#);
        return out;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let sx = |x: f64| ML + (x - x0) / (x1 - x0) * (W - ML - MR);
    let sy = |y: f64| H - MB - (y - y0) / (y1 - y0) * (H - MT - MB);
    let _ = write!(
        out,
        r##"<rect x="{ML}" y="{MT}" width="{}" height="{}" fill="none" stroke="#999"/>"##,
        W - ML - MR,
        H - MT - MB
    );
    let xticks: Vec<f64> = if log_x {
        (x0.floor() as i32..=x1.ceil() as i32)
            .map(f64::from)
            .filter(|t| *t >= x0 && *t <= x1)
            .collect()
    } else {
        nice_ticks(x0, x1)
    };
    for t in xticks {
        let label = if log_x {
            fmt_tick(10f64.powf(t))
        } else {
            fmt_tick(t)
        };
        let _ = write!(
            out,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="#ddd"/><text x="{0:.1}" y="{3}" text-anchor="middle">{4}</text>"##,
            sx(t),
            MT,
            H - MB,
            H - MB + 14.0,
            label
        );
    }
    for t in nice_ticks(y0, y1) {
        let _ = write!(
            out,
            r##"<line x1="{ML}" x2="{0}" y1="{1:.1}" y2="{1:.1}" stroke="#eee"/><text x="{2}" y="{3:.1}" text-anchor="end">{4}</text>"##,
            W - MR,
            sy(t),
            ML - 4.0,
            sy(t) + 4.0,
            fmt_tick(t)
        );
    }
    let _ = write!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="14" y="{}" text-anchor="middle" transform="rotate(-90 14 {})">{}</text>"#,
        (ML + W - MR) / 2.0,
        H - 8.0,
        esc(x_label),
        (MT + H - MB) / 2.0,
        (MT + H - MB) / 2.0,
        esc(y_label)
    );
    for (i, (s, p)) in series.iter().zip(&pts).enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let d: Vec<String> = p
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if !d.is_empty() {
            let _ = write!(
                out,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{}"/>"#,
                d.join(" ")
            );
        }
        let ly = MT + 8.0 + i as f64 * 16.0;
        let _ = write!(
            out,
            r#"<line x1="{0}" x2="{1}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{2}" y="{3}">{4}</text>"#,
            W - MR + 10.0,
            W - MR + 28.0,
            W - MR + 32.0,
            ly + 4.0,
            esc(s.name)
        );
    }
    out.push_str("</svg>");
    out
}

/// A vertical bar chart of `(label, value)` with values as percentages of 1.
pub fn share_bars(title: &str, bars: &[(String, f64)]) -> String {
    let (w, h, ml, mb, mt) = (360.0, 200.0, 40.0, 40.0, 24.0);
    let n = bars.len().max(1) as f64;
    let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9);
    let bw = (w - ml - 10.0) / n;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="10"><text x="{}" y="14" text-anchor="middle" font-size="12" font-weight="bold">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    // Even share reference line.
    let even = 1.0 / n;
    let y_even = h - mb - even / max * (h - mt - mb);
    for (i, (label, v)) in bars.iter().enumerate() {
        let bh = v / max * (h - mt - mb);
        let x = ml + i as f64 * bw;
        let _ = write!(
            out,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#1f77b4"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{:.0}%</text><text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
            x + 2.0,
            h - mb - bh,
            (bw - 4.0).max(1.0),
            bh,
            x + bw / 2.0,
            h - mb - bh - 3.0,
            v * 100.0,
            x + bw / 2.0,
            h - mb + 12.0,
            esc(label)
        );
    }
    let _ = write!(
        out,
        r##"<line x1="{ml}" x2="{}" y1="{y_even:.1}" y2="{y_even:.1}" stroke="#d62728" stroke-dasharray="4 3"/><text x="{ml}" y="{}" fill="#d62728">even</text></svg>"##,
        w - 10.0,
        y_even - 3.0
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_and_escaped() {
        let s = line_chart(
            "TTFT <cdf>",
            "s",
            "frac",
            &[Series {
                name: "a&b",
                points: (1..2000)
                    .map(|i| (i as f64 / 100.0, i as f64 / 2000.0))
                    .collect(),
            }],
            true,
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>"));
        assert!(s.contains("TTFT &lt;cdf&gt;") && s.contains("a&amp;b"));
        assert!(s.matches(',').count() <= 2 * (MAX_POINTS + 2));
        assert!(line_chart("t", "x", "y", &[], false).contains("no data"));
        let b = share_bars("share", &[("e0".into(), 0.75), ("e1".into(), 0.25)]);
        assert!(b.contains("75%") && b.contains("even"));
    }
}
