//! A panic's traceback in a dead letter is bounded (issue 12, item 9): with `RUST_BACKTRACE=1`
//! it keeps the panic site and the application's frames, at most `TRACEBACK_MAX_FRAMES` frames
//! and `TRACEBACK_MAX_BYTES` bytes, with a "… N frames omitted" line, and no absolute path of
//! the build machine.
//!
//! The backtrace setting is read once per process, so the test runs its scenario in a child
//! process of its own with `RUST_BACKTRACE=1`, whatever the environment of the test run.

use std::process::Command;

use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{TRACEBACK_MAX_BYTES, TRACEBACK_MAX_FRAMES};

/// Set in the child process that runs the scenario.
const CHILD: &str = "STAGEDOOR_TRACEBACK_CHILD";

#[derive(serde::Serialize, serde::Deserialize)]
struct Seat {
    label: String,
}

/// The line of the `panic!` in [`row_of`].
const PANIC_LINE: u32 = 28;

fn row_of(label: &str) -> char {
    match label.chars().next() {
        Some(c) if c.is_ascii_alphabetic() => c,
        _ => panic!("seat label '{label}' does not start with a row letter"),
    }
}

async fn assign_seat(seat: &Seat) -> HandlerOutcome {
    tokio::task::yield_now().await;
    let _row = row_of(&seat.label);
    HandlerOutcome::ack()
}

#[test]
fn a_panic_traceback_in_a_dead_letter_is_bounded_and_relative() {
    if std::env::var_os(CHILD).is_some() {
        return scenario();
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = Command::new(exe)
        .args([
            "a_panic_traceback_in_a_dead_letter_is_bounded_and_relative",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("run the scenario in a child process");
    assert!(
        out.status.success(),
        "the scenario failed:\n--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn scenario() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let service =
            Service::new(AppInfo::new("seats", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
                b.include(Subscriber::new("seats", assign_seat).name("assign_seat"))
                    .max_attempts(nonzero!(1u32))
                    .dead_letter("seats.dead");
            });
        let app = TestApp::start(service).await.expect("start");
        app.publish(
            Job::new(
                "seats",
                &Seat {
                    label: "14-C".into(),
                },
            )
            .expect("encode"),
        )
        .await
        .expect("publish");
        app.drain().await;
        let letters = app.dead_letters("seats.dead").await;
        assert_eq!(letters.len(), 1, "{letters:?}");
        let tb = &letters[0].traceback;
        println!("--- traceback ({} bytes)\n{tb}\n---", tb.len());
        check(tb);
        app.stop().await;
    });
}

fn check(tb: &str) {
    let site = format!("panicked at tests/traceback.rs:{PANIC_LINE}:");
    assert!(
        tb.lines().next().is_some_and(|l| l.starts_with(&site)),
        "the first line is the panic site `{site}`:\n{tb}"
    );
    // The backtrace was captured, and its frames are the application's: the function that
    // panicked and the handler that called it.
    assert!(
        tb.contains("traceback::row_of"),
        "the frame that panicked:\n{tb}"
    );
    assert!(
        tb.contains("traceback::assign_seat"),
        "the handler's frame:\n{tb}"
    );
    assert!(
        tb.contains("tests/traceback.rs:"),
        "the application's frames have their file and line:\n{tb}"
    );
    for internal in [
        "std::",
        "core::",
        "tokio::",
        "stagedoor_jobs::",
        "futures_util::",
    ] {
        assert!(
            !tb.lines()
                .any(|l| l.trim_start().split_once(": ").is_some_and(|(i, sym)| {
                    i.bytes().all(|b| b.is_ascii_digit()) && sym.starts_with(internal)
                })),
            "no frame of `{internal}`:\n{tb}"
        );
    }
    let last = tb.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("… ") && last.contains("frames omitted"),
        "the last line counts the frames left out: {last:?}\n{tb}"
    );
    let frames = tb
        .lines()
        .filter(|l| {
            l.trim_start()
                .split_once(": ")
                .is_some_and(|(i, _)| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    assert!(
        (2..=TRACEBACK_MAX_FRAMES).contains(&frames),
        "{frames} frames, at most {TRACEBACK_MAX_FRAMES}:\n{tb}"
    );
    assert!(
        tb.len() <= TRACEBACK_MAX_BYTES,
        "{} bytes, at most {TRACEBACK_MAX_BYTES}:\n{tb}",
        tb.len()
    );
    assert!(
        tb.lines().count() <= 2 + 3 * TRACEBACK_MAX_FRAMES,
        "{} lines:\n{tb}",
        tb.lines().count()
    );
    // No absolute path of the build machine: every `at` path is relative.
    for line in tb.lines() {
        if let Some(path) = line.trim_start().strip_prefix("at ") {
            assert!(
                !path.starts_with('/') && !path.starts_with('\\'),
                "an absolute path: {line:?}\n{tb}"
            );
        }
    }
    for machine in ["/root/", "/home/", ".cargo/registry", "/rustc/", "/work/"] {
        assert!(!tb.contains(machine), "`{machine}` in:\n{tb}");
    }
}
