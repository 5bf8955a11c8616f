//! The conformance suite every broker runs (feature `conformance`).
