//! Running a target without AFL: over the committed corpus, and over random mutations of it,
//! under a watchdog that reports a hang with its input.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::Target;

/// An input taking longer than this is a hang: its bytes are printed and the process aborts.
pub const HANG: Duration = Duration::from_secs(10);

/// `fuzz/corpus/<target>/`.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// The files of `fuzz/corpus/<target>/`, sorted by name (none when it does not exist).
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir(target))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_file())
        .filter_map(|e| {
            let bytes = std::fs::read(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), bytes))
        })
        .collect();
    out.sort();
    out
}

struct Current {
    started_ms: AtomicU64,
    input: Mutex<(String, Vec<u8>)>,
}

static CURRENT: Current = Current {
    started_ms: AtomicU64::new(0),
    input: Mutex::new((String::new(), Vec::new())),
};

fn epoch() -> &'static Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now)
}

fn watchdog() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = epoch();
        std::thread::spawn(|| {
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let started = CURRENT.started_ms.load(Ordering::SeqCst);
                if started == 0 {
                    continue;
                }
                let now = epoch().elapsed().as_millis() as u64;
                if now.saturating_sub(started) > HANG.as_millis() as u64 {
                    let (target, input) = match CURRENT.input.lock() {
                        Ok(g) => g.clone(),
                        Err(p) => p.into_inner().clone(),
                    };
                    eprintln!(
                        "HANG: target `{target}` ran over {HANG:?} on input (hex) {}",
                        hex(&input)
                    );
                    std::process::abort();
                }
            }
        });
    });
}

/// Bytes in hex, for a message.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `target` on `input` under the watchdog; a panic is re-raised with the input in hex.
pub fn one(name: &str, target: Target, input: &[u8]) {
    watchdog();
    if let Ok(mut g) = CURRENT.input.lock() {
        *g = (name.to_owned(), input.to_vec());
    }
    CURRENT
        .started_ms
        .store(epoch().elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
    let result = std::panic::catch_unwind(|| target(input));
    CURRENT.started_ms.store(0, Ordering::SeqCst);
    if let Err(e) = result {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        panic!(
            "target `{name}` failed on input (hex) {}: {msg}",
            hex(input)
        );
    }
}

/// One random mutation of `input`: bytes flipped, set, inserted, removed, or a slice of
/// another input spliced in.
pub fn mutate(rng: &mut fastrand::Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.usize(1..=4) {
        let at = rng.usize(0..=out.len());
        match rng.u8(0..6) {
            0 if at < out.len() => out[at] ^= 1 << rng.u8(0..8),
            1 if at < out.len() => {
                out[at] = rng
                    .choice([0u8, 1, 0x7f, 0x80, 0xff, b'-', b'%', b'&', b'=', b'*'])
                    .unwrap_or(0)
            }
            2 => out.insert(at, rng.u8(..)),
            3 if at < out.len() => {
                let end = rng.usize(at..=out.len().min(at + 16));
                out.drain(at..end);
            }
            4 if !other.is_empty() => {
                let from = rng.usize(0..other.len());
                let to = rng.usize(from..=other.len().min(from + 64));
                out.splice(at..at, other[from..to].iter().copied());
            }
            _ => out.extend((0..rng.usize(1..8)).map(|_| rng.u8(..))),
        }
    }
    out
}

/// Runs `target` on every file of its corpus, then on random mutations of them for `budget`
/// (at least `min_runs`); the seed of the mutations is `seed`. Returns (corpus files, runs).
pub fn replay_and_mutate(
    name: &str,
    target: Target,
    budget: Duration,
    min_runs: usize,
    seed: u64,
) -> (usize, usize) {
    let files = corpus(name);
    for (_, bytes) in &files {
        one(name, target, bytes);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let pool: Vec<&[u8]> = if files.is_empty() {
        vec![&[][..]]
    } else {
        files.iter().map(|(_, b)| b.as_slice()).collect()
    };
    let until = Instant::now() + budget;
    let mut runs = 0;
    while runs < min_runs || Instant::now() < until {
        let base = pool[rng.usize(0..pool.len())];
        let other = pool[rng.usize(0..pool.len())];
        let input = mutate(&mut rng, base, other);
        one(name, target, &input);
        runs += 1;
    }
    (files.len(), runs)
}
