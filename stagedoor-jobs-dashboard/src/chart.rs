//! The queues page's chart: processed, failed and dead-lettered jobs per minute over the last
//! hour, as inline SVG (no script, no library; presentation attributes only, so the strict CSP
//! allows it).

use chrono::{DateTime, Duration, Utc};
use maud::{Markup, html};
use stagedoor_jobs::activity::{MinuteCounts, minute_of};

/// How many minutes the chart shows.
pub(crate) const MINUTES: i64 = 60;

const W: f64 = 720.0;
const H: f64 = 200.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 12.0;
/// Room above the plot for the legend, so a line at its peak never runs under it.
const TOP: f64 = 30.0;
const BOTTOM: f64 = 26.0;

/// A series: its label, its colour, its value in a minute.
type Series = (&'static str, &'static str, fn(&MinuteCounts) -> u64);

/// The series drawn.
const SERIES: [Series; 3] = [
    ("processed", "#2e7d32", |m| m.processed),
    ("failed", "#ef6c00", |m| m.failed),
    ("dead-lettered", "#c62828", |m| m.dead),
];

/// The first minute the chart shows, for a chart drawn at `now`.
pub(crate) fn since(now: DateTime<Utc>) -> DateTime<Utc> {
    minute_of(now) - Duration::minutes(MINUTES - 1)
}

/// The chart of `minutes` (any order, minutes outside the last hour ignored) drawn at `now`.
pub(crate) fn svg(minutes: &[MinuteCounts], now: DateTime<Utc>) -> Markup {
    let first = since(now);
    let mut slots = vec![MinuteCounts::new(first, 0, 0, 0); MINUTES as usize];
    for (i, slot) in slots.iter_mut().enumerate() {
        *slot = MinuteCounts::new(first + Duration::minutes(i as i64), 0, 0, 0);
    }
    for m in minutes {
        let i = (minute_of(m.minute) - first).num_minutes();
        if (0..MINUTES).contains(&i) {
            let s = &mut slots[i as usize];
            *s = MinuteCounts::new(
                s.minute,
                s.processed.saturating_add(m.processed),
                s.failed.saturating_add(m.failed),
                s.dead.saturating_add(m.dead),
            );
        }
    }
    let max = slots
        .iter()
        .flat_map(|m| SERIES.iter().map(move |(_, _, f)| f(m)))
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x = |i: usize| LEFT + plot_w * i as f64 / (MINUTES - 1) as f64;
    let y = |v: u64| TOP + plot_h - plot_h * v as f64 / max as f64;
    let totals: Vec<u64> = SERIES
        .iter()
        .map(|(_, _, f)| slots.iter().map(f).fold(0u64, u64::saturating_add))
        .collect();
    let label = format!(
        "Jobs per minute over the last hour: {} processed, {} failed, {} dead-lettered",
        totals[0], totals[1], totals[2]
    );
    html! {
        svg.chart xmlns="http://www.w3.org/2000/svg" viewBox={"0 0 " (W) " " (H)} role="img" aria-label=(label) {
            title { (label) }
            line x1=(LEFT) y1=(TOP + plot_h) x2=(W - RIGHT) y2=(TOP + plot_h) stroke="#999" stroke-width="1" {}
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(TOP + plot_h) stroke="#999" stroke-width="1" {}
            line x1=(LEFT) y1=(TOP) x2=(W - RIGHT) y2=(TOP) stroke="#eee" stroke-width="1" {}
            text x=(LEFT - 6.0) y=(TOP + 4.0) text-anchor="end" font-size="11" fill="#555" { (max) }
            text x=(LEFT - 6.0) y=(TOP + plot_h + 4.0) text-anchor="end" font-size="11" fill="#555" { "0" }
            text x=(LEFT) y=(H - 8.0) font-size="11" fill="#555" { "-60 min" }
            text x=(LEFT + plot_w / 2.0) y=(H - 8.0) text-anchor="middle" font-size="11" fill="#555" { "-30 min" }
            text x=(W - RIGHT) y=(H - 8.0) text-anchor="end" font-size="11" fill="#555" { "now" }
            @for (n, (name, colour, f)) in SERIES.iter().enumerate() {
                polyline.series data-series=(name) fill="none" stroke=(colour) stroke-width="2"
                    points=(slots.iter().enumerate().map(|(i, m)| format!("{:.1},{:.1}", x(i), y(f(m)))).collect::<Vec<_>>().join(" ")) {}
                g.legend {
                    rect x=(LEFT + 10.0 + 170.0 * n as f64) y=(6.0) width="10" height="10" fill=(colour) {}
                    text x=(LEFT + 24.0 + 170.0 * n as f64) y=(15.0) font-size="11" fill="#333" {
                        (name) " " (totals[n])
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_of_the_last_hour_only() {
        let now = Utc::now();
        let minutes = [
            MinuteCounts::new(now, 5, 2, 1),
            MinuteCounts::new(now - Duration::minutes(10), 3, 0, 0),
            MinuteCounts::new(now - Duration::minutes(90), 100, 100, 100),
        ];
        let s = svg(&minutes, now).into_string();
        assert!(s.contains("8 processed, 2 failed, 1 dead-lettered"), "{s}");
        assert_eq!(s.matches("<polyline").count(), 3);
    }
}
