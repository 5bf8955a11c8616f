//! The server-side scripts: every move that must not lose or duplicate a job is one of these,
//! so it happens atomically on the server. Every key a script touches shares the queue's hash
//! tag (Redis Cluster runs it on one node). No script unpacks an unbounded set: batches are
//! bounded, and a job's fields, whose count is the job's (a header each), are passed on with
//! [`CALL_LIST`](lua::CALL_LIST), which has no limit (Lua's `unpack` stops near 8,000 values).
//!
//! A script that fails half-way is not undone. So every script does the steps that can fail
//! (a key of the wrong type: [`CHECK_TYPE`](lua::CHECK_TYPE)) before its first write, and records a job's id
//! only once the job is stored: a call that failed can be made again, and does what it
//! would have done.
//!
//! A full server (`maxmemory` reached with the `noeviction` policy) refuses every command that
//! may grow its memory, and a script whose first such command is refused does nothing. The
//! scripts that settle, reclaim or move a job ([`OomScript`]) carry `#!lua flags=allow-oom` on
//! Redis 7 and later, so that a worker keeps draining a full server (draining is what frees its
//! memory); the scripts that add a job (publish, replay) do not, and are refused while it is
//! full. Redis 6.2 knows no script flags: there the plain text runs.
//!
//! | file | scripts |
//! |---|---|
//! | `scripts/lua.rs` | [`OomScript`], and the Lua helpers the scripts share |
//! | `scripts/publish.rs` | publish, publish once, a guard's window |
//! | `scripts/settle.rs` | the batched settlement, a lease's renewal |
//! | `scripts/dead.rs` | one delivery dead-lettered, a replay |
//! | `scripts/cancel.rs` | a delayed job or a stream entry cancelled |
//! | `scripts/mover.rs` | the delayed mover |
//! | `scripts/claim.rs` | the fair claim's choice of level |
//! | `scripts/locks.rs` | locks and a schedule's last tick |
//! | `scripts/permits.rs` | the permit pools |
//! | `scripts/records.rs` | records: a read, and a call's writes compared and applied together |
//! | `scripts.rs` | the reclaim of deliveries idle past their lease (with their delivery counts) |

use std::sync::LazyLock;

mod cancel;
mod claim;
mod dead;
mod locks;
mod lua;
mod mover;
mod permits;
mod publish;
mod records;
mod settle;

pub(crate) use cancel::{CANCEL_DELAYED, CANCEL_ENTRY};
pub(crate) use claim::OLDEST_WAITING;
pub(crate) use dead::{DEAD, REPLAY};
pub(crate) use locks::{SET_MAX, TAKE_LOCK, UNLOCK};
pub(crate) use lua::{OomScript, ScriptCall};
pub(crate) use mover::{LATEST_DUE_MS, MOVE_DUE};
pub(crate) use permits::{RENEW_PERMITS, TAKE_PERMITS};
pub(crate) use publish::{FINISH_GUARD, PUBLISH, PUBLISH_BODY, PUBLISH_ONCE};
pub(crate) use records::{READ_RECORD, WRITE_RECORDS};
pub(crate) use settle::{RENEW, SETTLE_BATCH, SETTLE_MANY};

use lua::with_trim;

/// KEYS: stream. ARGV: group, consumer, min_idle_ms, count, trim ('1': trim the settled
/// entries at the stream's head once entries were acknowledged here, as [`SETTLE_MANY`] does
/// on Redis 7). Reclaims entries idle past their lease (XAUTOCLAIM), forgets entries deleted
/// while pending, and returns every other entry it claimed as {id, fields, deliveries} (the
/// entry's delivery count, this delivery included). It decides nothing about them: the
/// runtime dead-letters one delivered more than the broker's poison count
/// ([`RedisBroker::max_deliveries`](crate::RedisBroker::max_deliveries)) without running it,
/// and one that cannot be read as a job as unreadable.
pub(crate) static RECLAIM: LazyLock<OomScript> = LazyLock::new(|| {
    with_trim(
        r"
local settled = false
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', ARGV[4])
local out = {}
if r[3] then
  for _, id in ipairs(r[3]) do redis.call('XACK', KEYS[1], ARGV[1], id); settled = true end
end
for _, e in ipairs(r[2]) do
  local id, f = e[1], e[2]
  if not f then
    redis.call('XACK', KEYS[1], ARGV[1], id)
    settled = true
  else
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
    table.insert(out, {id, f, tonumber(p[1][4])})
  end
end
if settled and ARGV[5] ~= '0' then trim_settled(KEYS[1], ARGV[1], 0, nil) end
return out
",
    )
});
