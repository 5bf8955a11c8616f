#![cfg_attr(docsrs, feature(doc_cfg))]
//! Examples and cross-crate tests of stagedoor-jobs live in `examples/` and `tests/`.
//!
//! The README's code blocks are this package's doctests (`cargo test --doc -p
//! stagedoor-jobs-workspace`): this package depends on every crate with every feature, so each
//! block compiles as a user's code would.

/// The README's code blocks, compiled as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
