//! stagedoor-bench: stagedoor-jobs side by side with its peers and each server's raw limit.

mod child;
mod common;
mod report;
mod scenarios;
mod systems;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use common::{Backend, BenchJob, Hook, Target};
use systems::System;

#[derive(Parser)]
#[command(about = "stagedoor-jobs against its peers and the raw server loops")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every scenario, system and backend; prints the tables and writes the JSON.
    Run {
        /// The full sizes (1,000,000-job memory backlog; about an hour) instead of the quick ones.
        #[arg(long)]
        full: bool,
        /// Repetitions of each measurement, interleaved (spread = machine drift).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Systems to measure (default: all).
        #[arg(long, value_enum, value_delimiter = ',')]
        systems: Vec<System>,
        /// Backends (default: all).
        #[arg(long, value_enum, value_delimiter = ',')]
        backends: Vec<Backend>,
        /// Scenarios (default: all but pinned-xmin, which adds about 65 s per Postgres system
        /// and repeat; name it to run it).
        #[arg(long, value_enum, value_delimiter = ',')]
        scenarios: Vec<scenarios::Scenario>,
        /// Redis to use; the bench empties it (FLUSHALL) before each measurement.
        #[arg(long, env = "REDIS_URL")]
        redis_url: String,
        /// Postgres to use; the bench creates databases `bench_<system>` on it.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        /// Where the results go (`latest.json`, `latest.md`).
        #[arg(long, default_value = "results")]
        out: std::path::PathBuf,
        /// Offered jobs/s of the pinned-xmin scenario (default 800).
        #[arg(long)]
        xmin_rate: Option<u64>,
        /// Seconds the pinned-xmin scenario holds xmin and produces (default 60).
        #[arg(long)]
        xmin_hold: Option<u64>,
        /// Seconds the pinned-xmin scenario runs at its rate before the pin (default 60).
        #[arg(long)]
        xmin_history: Option<u64>,
        /// Busy loops at `nice 10` beside the pinned-xmin scenario (default 0; the issue's
        /// CPU neighbour is 2).
        #[arg(long)]
        cpu_neighbours: Option<usize>,
    },
    /// A worker process of a measurement (spawned by `run`).
    #[command(hide = true)]
    Worker {
        #[arg(long, value_enum)]
        system: System,
        #[arg(long, value_enum)]
        backend: Backend,
        #[arg(long)]
        url: String,
        #[arg(long)]
        queue: String,
        #[arg(long)]
        fail_once: bool,
        /// Handlers at once.
        #[arg(long, default_value_t = common::CONCURRENCY)]
        concurrency: usize,
        /// The queue's global concurrency across every worker (stagedoor-jobs only).
        #[arg(long)]
        global_concurrency: Option<u32>,
    },
    /// One system on one backend, in one process: reset, enqueue N (half one by one, half in
    /// bulk), drain them, print the rates. For checking a driver.
    Smoke {
        #[arg(long, value_enum)]
        system: System,
        #[arg(long, value_enum)]
        backend: Backend,
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 2000)]
        n: u64,
        #[arg(long)]
        fail_once: bool,
        #[arg(long, default_value = "bench")]
        queue: String,
        /// Handlers at once.
        #[arg(long, default_value_t = common::CONCURRENCY)]
        concurrency: usize,
    },
}

async fn smoke(system: System, t: Target, n: u64, fail_once: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        system.supports(t.backend),
        "{} does not run on {:?}",
        system.name(),
        t.backend
    );
    system.reset(&t).await?;
    let mut p = system.producer(&t).await?;
    let half = n / 2;
    let started = Instant::now();
    for i in 0..half {
        p.one(BenchJob { i, ts: 0 }).await?;
    }
    let one = started.elapsed();
    let jobs: Vec<BenchJob> = (half..n).map(|i| BenchJob { i, ts: 0 }).collect();
    let started = Instant::now();
    for chunk in jobs.chunks(1000) {
        p.bulk(chunk).await?;
    }
    let bulk = started.elapsed();
    println!(
        "enqueue: {half} one by one in {one:?} ({:.0}/s), {} in bulk in {bulk:?} ({:.0}/s)",
        half as f64 / one.as_secs_f64(),
        n - half,
        (n - half) as f64 / bulk.as_secs_f64()
    );
    let hook = Arc::new(Hook::new(fail_once));
    let started = Instant::now();
    let worker = {
        let (t, hook) = (t.clone(), Arc::clone(&hook));
        tokio::spawn(async move { system.work(&t, hook).await })
    };
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let done = hook.done.load(Ordering::Relaxed);
        if done >= n {
            break;
        }
        if worker.is_finished() {
            anyhow::bail!("worker stopped: {:?}", worker.await);
        }
        if started.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("only {done} of {n} done after 120 s");
        }
    }
    let took = started.elapsed();
    worker.abort();
    println!(
        "drain: {n} in {took:?} ({:.0}/s), {} handler runs",
        n as f64 / took.as_secs_f64(),
        hook.runs.load(Ordering::Relaxed)
    );
    Ok(())
}

/// `v`, or every value when `v` is empty.
fn pick<T: Clone>(v: Vec<T>, all: &[T]) -> Vec<T> {
    if v.is_empty() { all.to_vec() } else { v }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run {
            full,
            repeats,
            systems,
            backends,
            scenarios,
            redis_url,
            database_url,
            out,
            xmin_rate,
            xmin_hold,
            xmin_history,
            cpu_neighbours,
        } => {
            let mut sizes = if full {
                scenarios::Sizes::full()
            } else {
                scenarios::Sizes::quick()
            };
            if let Some(r) = xmin_rate {
                sizes.xmin_rate = r.max(1);
            }
            if let Some(h) = xmin_hold {
                sizes.xmin_hold = Duration::from_secs(h.max(1));
            }
            if let Some(h) = xmin_history {
                sizes.xmin_history = Duration::from_secs(h);
            }
            if let Some(n) = cpu_neighbours {
                sizes.xmin_neighbours = n;
            }
            run(RunArgs {
                mode: if full { "full" } else { "quick" },
                sizes,
                repeats: repeats.max(1),
                systems: pick(systems, &System::ALL),
                backends: pick(
                    backends,
                    &[Backend::Redis, Backend::Postgres, Backend::Sqlite],
                ),
                scenarios: pick(scenarios, &scenarios::Scenario::DEFAULT),
                redis_url,
                database_url,
                out,
            })
            .await
        }
        Cmd::Worker {
            system,
            backend,
            url,
            queue,
            fail_once,
            concurrency,
            global_concurrency,
        } => {
            child::run_worker(
                system,
                Target {
                    backend,
                    url,
                    queue,
                    concurrency,
                    global_concurrency,
                },
                fail_once,
            )
            .await
        }
        Cmd::Smoke {
            system,
            backend,
            url,
            n,
            fail_once,
            queue,
            concurrency,
        } => {
            smoke(
                system,
                Target {
                    backend,
                    url,
                    queue,
                    concurrency,
                    global_concurrency: None,
                },
                n,
                fail_once,
            )
            .await
        }
    }
}

struct RunArgs {
    mode: &'static str,
    sizes: scenarios::Sizes,
    repeats: usize,
    systems: Vec<System>,
    backends: Vec<Backend>,
    scenarios: Vec<scenarios::Scenario>,
    redis_url: String,
    database_url: String,
    out: std::path::PathBuf,
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(0, |k| k / 1024 / 1024);
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|o| {
            o.lines()
                .find(|l| l.starts_with("PRETTY_NAME="))
                .map(|l| l[12..].trim_matches('"').to_owned())
        })
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), {mem} GiB, {os}")
}

/// The load average (1, 5, 15 minutes) from /proc/loadavg.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    use scenarios::{Env, Scenario, measure};
    let started = Instant::now();
    let load_start = loadavg();
    let stamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let dir = std::env::temp_dir().join(format!("stagedoor-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let env = Env::new(a.redis_url, a.database_url, dir.clone(), a.sizes.clone());
    if a.backends.contains(&Backend::Postgres) {
        env.create_databases(&a.systems).await.map_err(|e| anyhow::anyhow!("Postgres at DATABASE_URL: {e} (start the servers with benches/run, or set DATABASE_URL)"))?;
    }
    let pairs: Vec<(System, Backend)> = a
        .backends
        .iter()
        .flat_map(|b| {
            a.systems
                .iter()
                .filter(|s| s.supports(*b))
                .map(move |s| (*s, *b))
        })
        .collect();
    let total: usize = a
        .scenarios
        .iter()
        .map(|sc| {
            let runs = pairs
                .iter()
                .filter(|(s, b)| sc.runs_on(*b) && sc.measures(*s))
                .count();
            a.repeats * runs
        })
        .sum();
    eprintln!(
        "stagedoor-bench: {} mode, {} measurements ({} systems x backends, {} repeats), machine: {}",
        a.mode,
        total,
        pairs.len(),
        a.repeats,
        machine()
    );
    let mut results: Vec<report::Measurement> = Vec::new();
    let mut k = 0;
    for repeat in 0..a.repeats {
        for sc in &a.scenarios {
            let skipped: Vec<&str> = a
                .backends
                .iter()
                .filter(|b| !sc.runs_on(**b))
                .map(|b| b.name())
                .collect();
            if repeat == 0 && !skipped.is_empty() {
                let runs: Vec<&str> = [Backend::Redis, Backend::Postgres, Backend::Sqlite]
                    .into_iter()
                    .filter(|b| sc.runs_on(*b))
                    .map(|b| b.name())
                    .collect();
                eprintln!(
                    "stagedoor-bench: {} runs on {} only; not on {}",
                    sc.name(),
                    runs.join(", "),
                    skipped.join(", ")
                );
            }
            for backend in a.backends.iter().filter(|b| sc.runs_on(**b)) {
                let mut systems: Vec<System> = a
                    .systems
                    .iter()
                    .copied()
                    .filter(|s| s.supports(*backend) && sc.measures(*s))
                    .collect();
                // Interleave: each repeat starts with another system.
                let n = systems.len().max(1);
                systems.rotate_left(repeat % n);
                for system in systems {
                    k += 1;
                    let hint = report::medians(&results, Scenario::Drain1, "jobs/s")
                        .get(&(*backend, system))
                        .copied();
                    let t0 = Instant::now();
                    let figures = match measure(&env, *sc, system, *backend, hint).await {
                        Ok(f) => f,
                        Err(e) => scenarios::Figures {
                            note: Some(format!("error: {e:#}")),
                            ..Default::default()
                        },
                    };
                    let shown: Vec<String> = figures
                        .values
                        .iter()
                        .map(|(m, v)| format!("{v:.1} {m}"))
                        .collect();
                    eprintln!(
                        "[{k}/{total}] {:<12} {:<8} {:<15} {} {}({:.1} s)",
                        sc.name(),
                        backend.name(),
                        system.name(),
                        shown.join(", "),
                        figures
                            .note
                            .as_deref()
                            .map_or(String::new(), |n| format!("[{n}] ")),
                        t0.elapsed().as_secs_f64()
                    );
                    results.push(report::Measurement {
                        scenario: *sc,
                        system,
                        backend: *backend,
                        repeat,
                        figures,
                    });
                }
            }
        }
    }
    let run = report::Run {
        started: stamp,
        load: format!("{load_start} at the start, {} at the end", loadavg()),
        machine: machine(),
        mode: a.mode.to_owned(),
        sizes: a.sizes,
        measurements: results,
        seconds: started.elapsed().as_secs_f64(),
    };
    let md = format!(
        "## stagedoor-bench, {} mode, {}\n\nMachine: {}. Load average (1, 5, 15 min): {}. Run took {:.0} s. Each cell: median of {} interleaved runs (every scenario), min–max, and the ratio of the median to stagedoor-jobs' on the same backend. A drain (drain-1, drain-4, failure, memory) ends when the harness, looking at the backend every 2 ms once the workers report 80% of the jobs done, finds none of the system's jobs left (ready, in flight or delayed) and every job reported done.\n{}{}",
        run.mode,
        run.started,
        run.machine,
        run.load,
        run.seconds,
        a.repeats,
        report::tables(&run),
        report::legend(&run)
    );
    println!("{md}");
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(
        a.out.join("latest.json"),
        serde_json::to_string_pretty(&run)?,
    )?;
    std::fs::write(a.out.join("latest.md"), &md)?;
    eprintln!(
        "stagedoor-bench: wrote {} and {}",
        a.out.join("latest.json").display(),
        a.out.join("latest.md").display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
