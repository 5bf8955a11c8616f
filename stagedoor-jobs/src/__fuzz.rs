//! Entry points for the fuzz targets (`fuzz/` in the repository): what a service checks and
//! reports of a schedule, re-exported as it is. Not a public API: it changes without notice.

use crate::Schedule;
use crate::broker::Problem;

/// The problems that stop a service with `schedule` at startup (an expression that does not
/// parse or never fires, a period under a second, no queue).
pub fn schedule_problems(schedule: &Schedule) -> Vec<Problem> {
    schedule.problems()
}

/// When `schedule` ticks as written, and what it does with missed ticks (what a worker
/// reports of it).
pub fn schedule_described(schedule: &Schedule) -> (String, String) {
    schedule.described()
}
