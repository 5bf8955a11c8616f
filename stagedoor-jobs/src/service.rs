//! The service: an application's subscribers mounted on its brokers, started, run until a
//! signal, and stopped gracefully.
//!
//! The files, by concern:
//! - `builder.rs`: `AppInfo` and the `Service` builder;
//! - `checks.rs`: the checks before starting that need no I/O, and the warning for a mount
//!   without a cap;
//! - `start.rs`: `Service::start` (hooks, connections, the brokers' checks, the tasks), and
//!   running until a signal;
//! - `running.rs`: a started service (`Running`), its shutdown, and the clock sync task;
//! - `error.rs`: `ServiceError`.

mod builder;
mod checks;
mod error;
mod running;
mod start;

pub use builder::{AppInfo, Service};
pub use error::ServiceError;
pub use running::Running;
