//! Compile-time guarantees of stagedoor-jobs's macros, checked with trybuild:
//!
//! - `ui/subscriber/`: misuses of `#[subscriber]`, one per file, each failing with a message
//!   that names the fix, on the offending tokens;
//! - `ui/mount/`: mounts that must not compile (a step declared twice, a cap of 0, a typed
//!   queue on a broker of another backend);
//! - `ui/inbox/`: misuses of `#[derive(Inbox)]`, one per file, each failing with a message that
//!   names the fix, on the offending tokens (and no other error);
//! - `ui/pass/`: legal code that looks like a misuse, which must keep compiling (and run).
//!
//! Regenerate the expected errors with `TRYBUILD=overwrite cargo test -p stagedoor-jobs-macros --test ui`, then read
//! every changed `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/subscriber/*.rs");
    t.compile_fail("tests/ui/mount/*.rs");
    t.compile_fail("tests/ui/inbox/*.rs");
}
