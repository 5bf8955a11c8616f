//! Worker processes: the `worker` subcommand runs one system's worker and reports on stdout;
//! [`Workers`] spawns them and reads their reports.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{Hook, Target};
use crate::systems::System;

/// The `worker` subcommand: runs `system`'s worker, printing `R done runs first_ns last_ns`
/// and `L latency...` lines every 20 ms, and `E message` if the worker stops with an error.
pub async fn run_worker(system: System, t: Target, fail_once: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let hook = Arc::new(Hook::new(fail_once));
    let reporter = {
        let hook = Arc::clone(&hook);
        tokio::spawn(async move {
            let mut sent = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let lats: Vec<u64> = {
                    let l = hook.latencies.lock().unwrap();
                    let new = l[sent..].to_vec();
                    sent = l.len();
                    new
                };
                let mut line = format!(
                    "R {} {} {} {}\n",
                    hook.done.load(Ordering::Relaxed),
                    hook.runs.load(Ordering::Relaxed),
                    hook.first_ns.load(Ordering::Relaxed),
                    hook.last_ns.load(Ordering::Relaxed)
                );
                for chunk in lats.chunks(64) {
                    line.push('L');
                    for l in chunk {
                        line.push_str(&format!(" {l}"));
                    }
                    line.push('\n');
                }
                let mut out = std::io::stdout().lock();
                if out
                    .write_all(line.as_bytes())
                    .and_then(|_| out.flush())
                    .is_err()
                {
                    std::process::exit(0);
                }
            }
        })
    };
    let result = system.work(&t, hook).await;
    reporter.abort();
    let msg = match result {
        Ok(()) => "the worker returned".to_owned(),
        Err(e) => format!("{e:#}"),
    };
    println!("E {}", msg.replace('\n', " "));
    std::process::exit(1);
}

/// What one worker process reported last.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Jobs completed.
    pub done: u64,
    /// Handler runs.
    pub runs: u64,
    /// Unix nanos of its first handler run (0: none yet).
    pub first_ns: u64,
    /// Unix nanos of its latest completion.
    pub last_ns: u64,
    /// Latencies reported so far.
    pub latencies: Vec<u64>,
    /// The error it stopped with.
    pub error: Option<String>,
}

/// Worker processes of one measurement.
pub struct Workers {
    children: Vec<Child>,
    reports: Vec<Arc<Mutex<Report>>>,
}

impl Workers {
    /// Spawns `n` worker processes of `system` on `t`; their stderr goes to `log`.
    pub fn spawn(
        system: System,
        t: &Target,
        n: usize,
        fail_once: bool,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        if exe.to_string_lossy().ends_with(" (deleted)") || !exe.exists() {
            anyhow::bail!(
                "this benchmark binary was rebuilt or removed while it ran ({}): start the run again",
                exe.display()
            );
        }
        let mut children = Vec::new();
        let mut reports = Vec::new();
        for _ in 0..n {
            let err = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?;
            let mut cmd = Command::new(&exe);
            cmd.arg("worker")
                .args(["--system", system.flag()])
                .args(["--backend", t.backend.name()])
                .args(["--url", &t.url])
                .args(["--queue", &t.queue])
                .args(["--concurrency", &t.concurrency.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(err)
                .kill_on_drop(true);
            if fail_once {
                cmd.arg("--fail-once");
            }
            if let Some(n) = t.global_concurrency {
                cmd.args(["--global-concurrency", &n.to_string()]);
            }
            let mut child = cmd.spawn()?;
            let out = child.stdout.take().expect("piped");
            let report = Arc::new(Mutex::new(Report::default()));
            let r = Arc::clone(&report);
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut parts = line.split(' ');
                    let tag = parts.next();
                    let mut r = r.lock().unwrap();
                    match tag {
                        Some("R") => {
                            let v: Vec<u64> = parts.filter_map(|p| p.parse().ok()).collect();
                            if let [done, runs, first, last] = v[..] {
                                (r.done, r.runs, r.first_ns, r.last_ns) = (done, runs, first, last);
                            }
                        }
                        Some("L") => r
                            .latencies
                            .extend(parts.filter_map(|p| p.parse::<u64>().ok())),
                        Some("E") => r.error = Some(line[2..].to_owned()),
                        _ => {}
                    }
                }
                let mut r = r.lock().unwrap();
                if r.error.is_none() {
                    r.error = Some("the worker process exited".to_owned());
                }
            });
            children.push(child);
            reports.push(report);
        }
        Ok(Workers { children, reports })
    }

    /// The reports summed: done, runs, earliest first, latest last; the first error.
    pub fn total(&self) -> Report {
        let mut t = Report::default();
        for r in &self.reports {
            let r = r.lock().unwrap();
            t.done += r.done;
            t.runs += r.runs;
            if r.first_ns != 0 && (t.first_ns == 0 || r.first_ns < t.first_ns) {
                t.first_ns = r.first_ns;
            }
            t.last_ns = t.last_ns.max(r.last_ns);
            t.latencies.extend_from_slice(&r.latencies);
            if t.error.is_none() {
                t.error.clone_from(&r.error);
            }
        }
        t
    }

    /// Jobs completed, summed over the workers (cheaper than [`Workers::total`]).
    pub fn done(&self) -> u64 {
        self.reports.iter().map(|r| r.lock().unwrap().done).sum()
    }

    /// Resident memory of each worker now and at its peak (KiB), from /proc.
    pub fn memory(&self) -> Vec<(u64, u64)> {
        self.children
            .iter()
            .filter_map(|c| c.id())
            .map(|pid| {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let field = |name: &str| {
                    status
                        .lines()
                        .find(|l| l.starts_with(name))
                        .and_then(|l| l.split_whitespace().nth(1))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                };
                (field("VmRSS:"), field("VmHWM:"))
            })
            .collect()
    }

    /// CPU time the workers have used so far, user and system, summed over the processes
    /// (every thread, from `/proc/<pid>/stat`), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        // Clock ticks per second; 100 on every Linux this runs on, asked to be sure.
        // SAFETY: sysconf reads a constant of the system.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        self.children
            .iter()
            .filter_map(|c| c.id())
            .map(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // Fields after the command's closing parenthesis: state is the first, utime
                // the 12th, stime the 13th.
                let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
                let f: Vec<u64> = rest
                    .split_whitespace()
                    .skip(11)
                    .take(2)
                    .filter_map(|v| v.parse().ok())
                    .collect();
                f.iter().sum::<u64>() as f64 / hz
            })
            .sum()
    }

    /// Kills every worker and waits for them to exit.
    pub async fn stop(mut self) {
        for c in &mut self.children {
            let _ = c.start_kill();
        }
        for c in &mut self.children {
            let _ = c.wait().await;
        }
    }
}
