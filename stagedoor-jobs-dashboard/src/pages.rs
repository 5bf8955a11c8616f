//! The pages and JSON endpoints, one file each; `refusal.rs` holds the pages that say no.

pub(crate) mod assets;
pub(crate) mod dead;
pub(crate) mod flows;
pub(crate) mod login;
pub(crate) mod queues;
pub(crate) mod refusal;
pub(crate) mod result;
pub(crate) mod scheduled;
pub(crate) mod workers;
