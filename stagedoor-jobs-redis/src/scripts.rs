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
//! | `scripts.rs` | the reclaim of deliveries idle past their lease |

use std::sync::LazyLock;

mod cancel;
mod claim;
mod dead;
mod locks;
mod lua;
mod mover;
mod permits;
mod publish;
mod settle;

pub(crate) use cancel::{CANCEL_DELAYED, CANCEL_ENTRY};
pub(crate) use claim::OLDEST_WAITING;
pub(crate) use dead::{DEAD, REPLAY};
pub(crate) use locks::{SET_MAX, TAKE_LOCK, UNLOCK};
pub(crate) use lua::OomScript;
pub(crate) use mover::{LATEST_DUE_MS, MOVE_DUE};
pub(crate) use permits::{RENEW_PERMITS, TAKE_PERMITS};
pub(crate) use publish::{FINISH_GUARD, PUBLISH, PUBLISH_BODY, PUBLISH_ONCE};
pub(crate) use settle::{RENEW, SETTLE_BATCH, SETTLE_MANY};

use lua::with_trim;

/// KEYS: stream, dead, ids. ARGV: group, consumer, min_idle_ms, count, max_deliveries,
/// maxlen, failed_at, queue, max_attempt, trim ('1': trim the settled entries at the stream's
/// head once entries were acknowledged here, as [`SETTLE_MANY`] does on Redis 7). Reclaims entries idle past their lease
/// (XAUTOCLAIM), forgets entries deleted while pending, dead-letters entries delivered more
/// than max_deliveries times without running them (attempts spent: the field's count plus
/// the deliveries before this one, at most max_attempt), and returns {the rest as {id, fields,
/// deliveries}, dead-stream entries trimmed by those dead letters} (the count was not returned
/// before, so these trims were missing from `RedisBroker::trimmed()` and the log). An entry
/// whose `attempts` field is not a whole number is returned as it is: the broker dead-letters
/// it as malformed, naming the field. The dead stream's and the ids set's types are checked
/// before `XAUTOCLAIM` (which writes: a failure after it left the entries claimed by this
/// consumer, their delivery counted, and never delivered).
pub(crate) static RECLAIM: LazyLock<OomScript> = LazyLock::new(|| {
    with_trim(
        r"
check_type(KEYS[2], 'stream', 'the dead stream')
check_type(KEYS[3], 'set', 'the set of job ids')
local settled = false
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', ARGV[4])
local out = {}
local trimmed = 0
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
    local d = tonumber(p[1][4])
    local max = tonumber(ARGV[9])
    local spent, wellformed = 0, true
    for i = 1, #f, 2 do
      if f[i] == 'attempts' then
        local a = f[i + 1]
        if string.match(a, '^%d+$') then
          local digits = string.gsub(a, '^0+', '')
          if #digits > 5 then spent = max else spent = math.min(tonumber(a), max) end
        else
          wellformed = false
        end
      end
    end
    if wellformed and d > tonumber(ARGV[5]) then
      local job = ''
      local g = {}
      for i = 1, #f, 2 do
        if f[i] == 'job_id' then job = f[i + 1] end
        if f[i] ~= 'attempts' then
          table.insert(g, f[i]); table.insert(g, f[i + 1])
        end
      end
      table.insert(g, 'attempts'); table.insert(g, string.format('%d', math.min(spent + d - 1, max)))
      table.insert(g, 'error')
      table.insert(g, 'delivered ' .. d .. ' times without being settled (max_deliveries ' .. ARGV[5] .. '): its workers died while running it, so it is dead-lettered without running again')
      table.insert(g, 'traceback'); table.insert(g, '')
      table.insert(g, 'failed_at'); table.insert(g, ARGV[7])
      table.insert(g, 'origin'); table.insert(g, ARGV[8])
      local before = redis.call('XLEN', KEYS[2])
      call_list(redis.call, {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*'}, g, 1, #g)
      trimmed = trimmed + before + 1 - redis.call('XLEN', KEYS[2])
      redis.call('XACK', KEYS[1], ARGV[1], id)
      redis.call('XDEL', KEYS[1], id)
      redis.call('SREM', KEYS[3], job)
      settled = true
    else
      table.insert(out, {id, f, d})
    end
  end
end
if settled and ARGV[10] ~= '0' then trim_settled(KEYS[1], ARGV[1], 0, nil) end
return {out, trimmed}
",
    )
});
