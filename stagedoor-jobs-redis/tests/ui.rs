//! Compile-time behaviour a user of the Redis backend meets, checked with trybuild:
//! `ui/trait_not_in_scope.rs` calls the broker's trait methods (`Inspect::connect`,
//! `Inspect::stats`, `DeadLetters::dead_len`, `Locks::take_permits`, `Activity::workers`)
//! without importing their traits, and rustc must answer with its hint to import the trait,
//! not "method is private" (which an inherent method of the same name would cause).
//!
//! Regenerate the expected errors with
//! `TRYBUILD=overwrite cargo test -p stagedoor-jobs-redis --test ui`, then read the `.stderr`.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
