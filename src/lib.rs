//! Examples and cross-crate tests of stagedoor-jobs live in `examples/` and `tests/`.
