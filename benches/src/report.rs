//! The tables and the JSON.

use std::collections::BTreeMap;

use comfy_table::{Cell, CellAlignment, Table, presets::ASCII_MARKDOWN};
use serde::Serialize;

use crate::common::Backend;
use crate::scenarios::{Figures, Scenario, Sizes};
use crate::systems::System;

/// One measurement, as written to the JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// Scenario.
    pub scenario: Scenario,
    /// System.
    pub system: System,
    /// Backend.
    pub backend: Backend,
    /// Which repetition (0-based).
    pub repeat: usize,
    /// The figures.
    pub figures: Figures,
}

/// The whole run, as written to the JSON.
#[derive(Debug, Serialize)]
pub struct Run {
    /// When it started (RFC 3339).
    pub started: String,
    /// The load average (1, 5, 15 minutes) at the start and at the end.
    pub load: String,
    /// The machine (`uname`, cores, memory).
    pub machine: String,
    /// `quick` or `full`.
    pub mode: String,
    /// Sizes.
    pub sizes: Sizes,
    /// Every measurement.
    pub measurements: Vec<Measurement>,
    /// Seconds the run took.
    pub seconds: f64,
}

/// Median, min and max.
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 {
        let s = format!("{:.0}", v);
        // Thousands separators.
        let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        format!("{sign}{out}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The median of `metric` for each (system, backend) of `scenario`.
pub fn medians(
    ms: &[Measurement],
    scenario: Scenario,
    metric: &str,
) -> BTreeMap<(Backend, System), f64> {
    let mut by: BTreeMap<(Backend, System), Vec<f64>> = BTreeMap::new();
    for m in ms.iter().filter(|m| m.scenario == scenario) {
        if let Some(v) = m.figures.values.get(metric) {
            by.entry((m.backend, m.system)).or_default().push(*v);
        }
    }
    by.into_iter()
        .map(|(k, mut v)| (k, spread(&mut v).0))
        .collect()
}

/// The tables, one per scenario and metric, as Markdown.
pub fn tables(run: &Run) -> String {
    let mut out = String::new();
    for sc in Scenario::ALL {
        let ms: Vec<&Measurement> = run
            .measurements
            .iter()
            .filter(|m| m.scenario == sc)
            .collect();
        if ms.is_empty() {
            continue;
        }
        let mut metrics: Vec<String> = Vec::new();
        for m in &ms {
            for k in m.figures.values.keys() {
                if !metrics.contains(k) {
                    metrics.push(k.clone());
                }
            }
        }
        // The scenario's own column order first, then the rest alphabetically.
        let order = sc.metric_order();
        metrics.sort_by_key(|k| order.iter().position(|o| o == k).unwrap_or(order.len()));
        out.push_str(&format!(
            "\n### {}: {}\n\n",
            sc.name(),
            sc.describe(&run.sizes)
        ));
        let mut t = Table::new();
        t.load_style(ASCII_MARKDOWN);
        let mut header = vec!["backend".to_owned(), "system".to_owned()];
        for k in &metrics {
            header.push(format!("{k} (median)"));
            header.push("min–max".to_owned());
            header.push("÷ stagedoor".to_owned());
        }
        header.push("notes".to_owned());
        t.set_header(header);
        let mut keys: Vec<(Backend, System)> = ms.iter().map(|m| (m.backend, m.system)).collect();
        keys.sort();
        keys.dedup();
        for (backend, system) in keys {
            let mine: Vec<&&Measurement> = ms
                .iter()
                .filter(|m| m.backend == backend && m.system == system)
                .collect();
            let mut row = vec![Cell::new(backend.name()), Cell::new(system.name())];
            for k in &metrics {
                let mut v: Vec<f64> = mine
                    .iter()
                    .filter_map(|m| m.figures.values.get(k).copied())
                    .collect();
                if v.is_empty() {
                    row.extend([Cell::new("–"), Cell::new(""), Cell::new("")]);
                    continue;
                }
                let (med, lo, hi) = spread(&mut v);
                let base = medians(&run.measurements, sc, k)
                    .get(&(backend, System::Stagedoor))
                    .copied();
                // A ratio of growths near zero says nothing.
                let ratio = base
                    .filter(|b| *b > 0.0 && !k.starts_with("growth"))
                    .map_or(String::new(), |b| format!("{:.2}", med / b));
                row.push(Cell::new(fmt(med)).set_alignment(CellAlignment::Right));
                row.push(Cell::new(if v.len() > 1 {
                    format!("{}–{}", fmt(lo), fmt(hi))
                } else {
                    String::new()
                }));
                row.push(Cell::new(ratio).set_alignment(CellAlignment::Right));
            }
            // Each distinct note once, shortened (an error can be a paragraph).
            let mut notes: Vec<String> = Vec::new();
            for n in mine.iter().filter_map(|m| m.figures.note.as_deref()) {
                let short: String = if n.chars().count() > 90 {
                    n.chars().take(90).chain("…".chars()).collect()
                } else {
                    n.to_owned()
                };
                if !notes.contains(&short) {
                    notes.push(short);
                }
            }
            if notes.len() > 1 {
                notes = notes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| format!("({}) {n}", i + 1))
                    .collect();
            }
            row.push(Cell::new(notes.join("; ")));
            t.add_row(row);
        }
        out.push_str(&t.to_string());
        out.push('\n');
        out.push_str(&profiles(run, sc));
    }
    out
}

/// Commands shown per system in a profile.
const TOP_COMMANDS: usize = 6;

/// The Redis command profile of `sc`'s Redis rows (per job, medians over the repeats), or
/// nothing when none was taken.
fn profiles(run: &Run, sc: Scenario) -> String {
    let mut by: BTreeMap<System, Vec<&crate::scenarios::Profile>> = BTreeMap::new();
    for m in run.measurements.iter().filter(|m| m.scenario == sc) {
        if let Some(p) = &m.figures.profile {
            by.entry(m.system).or_default().push(p);
        }
    }
    if by.is_empty() {
        return String::new();
    }
    let mut t = Table::new();
    t.load_style(ASCII_MARKDOWN);
    t.set_header(vec![
        "system",
        "server CPU µs/job",
        "calls/job",
        "top commands: µs/job (calls/job)",
    ]);
    let med = |mut v: Vec<f64>| spread(&mut v).0;
    for (system, ps) in by {
        let cpu = med(ps.iter().map(|p| p.cpu_us).collect());
        let mut names: Vec<&String> = ps.iter().flat_map(|p| p.commands.keys()).collect();
        names.sort();
        names.dedup();
        // A command missing from a repeat counts as zero there.
        let mut cmds: Vec<(String, f64, f64)> = names
            .into_iter()
            .map(|n| {
                let get = |i: usize| {
                    med(ps
                        .iter()
                        .map(|p| {
                            p.commands
                                .get(n)
                                .map_or(0.0, |c| if i == 0 { c.0 } else { c.1 })
                        })
                        .collect())
                };
                (n.clone(), get(0), get(1))
            })
            .collect();
        let calls: f64 = cmds.iter().map(|c| c.1).sum();
        cmds.sort_by(|a, b| b.2.total_cmp(&a.2));
        let top: Vec<String> = cmds
            .iter()
            .take(TOP_COMMANDS)
            .map(|(n, c, u)| format!("{n} {} ({})", fmt(*u), fmt(*c)))
            .collect();
        t.add_row(vec![
            Cell::new(system.name()),
            Cell::new(fmt(cpu)).set_alignment(CellAlignment::Right),
            Cell::new(fmt(calls)).set_alignment(CellAlignment::Right),
            Cell::new(top.join("; ")),
        ]);
    }
    format!(
        "\nRedis command profile of {} (per job, median of the repeats): from `CONFIG RESETSTAT` \
         with the backlog in, before the workers start, to `INFO commandstats` once the queue is \
         verified empty, less the harness's own probe commands. Server CPU: `used_cpu_user + \
         used_cpu_sys` of `INFO cpu` (every command, network and protocol work included). A \
         script's time (`evalsha`) includes the commands it calls, which are listed under their \
         own names too; calls/job counts those inner calls.\n\n{}\n",
        sc.name(),
        t
    )
}

/// What each row is: the systems' settings, per backend.
pub fn legend(run: &Run) -> String {
    let mut pairs: Vec<(Backend, System)> = run
        .measurements
        .iter()
        .map(|m| (m.backend, m.system))
        .collect();
    pairs.sort();
    pairs.dedup();
    let mut out = String::from(
        "\n### The rows\n\nEvery SQLite file is in WAL mode and every SQLite connection at \
         `synchronous = NORMAL`. Systems without a bulk enqueue fill a backlog and feed the \
         steady state with 8 producers at once.\n\n",
    );
    for (b, s) in pairs {
        out.push_str(&format!(
            "- {} / {}: {}.\n",
            b.name(),
            s.name(),
            s.legend(b)
        ));
    }
    out
}
