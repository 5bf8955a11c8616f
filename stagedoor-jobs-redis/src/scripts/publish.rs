//! Publishing: a batch of jobs ([`PUBLISH`]), a job behind a guard ([`PUBLISH_ONCE`]) and the
//! guard's window from the job's settlement ([`FINISH_GUARD`]).

use std::sync::LazyLock;

use redis::Script;

use super::lua::{OomScript, helped};

/// KEYS: stream, delayed, ids. ARGV: one group per job, `job_id, due_ms ('0': now), n` then
/// `n` items: the job's flat fields when it is due now, its delayed-set member when it is not.
/// Publishes every job of the call in one step; a job whose id is already in the queue (or
/// earlier in the call) is not added again. Returns the 1-based positions of those skipped.
/// The loop walks ARGV a job at a time (the broker bounds how many jobs one call carries) and
/// passes on one job's fields at a time ([`CALL_LIST`](super::lua::CALL_LIST)), never the whole ARGV.
///
/// The types of the keys it writes to are checked first, and a job's id is added to the ids
/// set only after the job was: a call that fails (a key of the wrong type) can be made again
/// once the key is fixed, and stores the job (before, its id was recorded already and the
/// retry was told the job was there, with nothing stored).
pub(crate) static PUBLISH: LazyLock<Script> = LazyLock::new(|| Script::new(&PUBLISH_BODY));

/// [`PUBLISH`]'s text, for `EVAL` inside a transaction (where a missing script could not be
/// loaded and retried the way `invoke_async` does).
pub(crate) static PUBLISH_BODY: LazyLock<String> = LazyLock::new(|| {
    helped(
        r"
local skipped = {}
local last = #ARGV
local i, now, later = 1, false, false
while i <= last do
  if ARGV[i + 1] == '0' then now = true else later = true end
  i = i + 3 + tonumber(ARGV[i + 2])
end
check_type(KEYS[3], 'set', 'the set of job ids')
if now then check_type(KEYS[1], 'stream', 'the stream') end
if later then check_type(KEYS[2], 'zset', 'the delayed set') end
local k = 0
i = 1
while i <= last do
  k = k + 1
  local n = tonumber(ARGV[i + 2])
  if redis.call('SISMEMBER', KEYS[3], ARGV[i]) == 1 then
    skipped[#skipped + 1] = k
  else
    if ARGV[i + 1] == '0' then
      call_list(redis.call, {'XADD', KEYS[1], '*'}, ARGV, i + 3, i + 2 + n)
    else
      redis.call('ZADD', KEYS[2], ARGV[i + 1], ARGV[i + 3])
    end
    redis.call('SADD', KEYS[3], ARGV[i])
  end
  i = i + 3 + n
end
return skipped
",
    )
});

/// KEYS: stream, delayed, ids, guard. ARGV: ttl_ms, then one job as [`PUBLISH`] takes it
/// (`job_id, due_ms ('0': now), n` and `n` items). When `guard` exists nothing happens and the
/// answer is `{-1, holder}` (the job id the guard holds). Otherwise the job is published as
/// [`PUBLISH`] does and the guard set to its id (for `ttl_ms`), in the same step: `{1, ''}`
/// when the job was stored, `{0, ''}` when its id was in the queue already (the guard is set
/// all the same). A script that fails half-way is not undone, so
/// every command that can fail (a key of the wrong type, a full server refusing the first
/// write) comes before the first write: a failed call leaves nothing, the guard included, and
/// the tick can be enqueued again.
pub(crate) static PUBLISH_ONCE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&helped(
        r"
local holder = redis.call('GET', KEYS[4])
if holder then return {-1, holder} end
local stored = 0
if redis.call('SISMEMBER', KEYS[3], ARGV[2]) == 0 then
  local n = tonumber(ARGV[4])
  if ARGV[3] == '0' then
    check_type(KEYS[1], 'stream', 'the stream')
    call_list(redis.call, {'XADD', KEYS[1], '*'}, ARGV, 5, 4 + n)
  else
    check_type(KEYS[2], 'zset', 'the delayed set')
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[5])
  end
  redis.call('SADD', KEYS[3], ARGV[2])
  stored = 1
end
redis.call('SET', KEYS[4], ARGV[2], 'PX', ARGV[1])
return {stored, ''}
",
    ))
});

/// KEYS: a guard of `publish_once`. ARGV: job_id, ttl_ms. When the guard holds `job_id`, it
/// runs out `ttl_ms` from now (a unique job's window, from its settlement); 1 when it did.
/// Runs on a full server (it adds nothing).
pub(crate) static FINISH_GUARD: LazyLock<OomScript> = LazyLock::new(|| {
    OomScript::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
",
    )
});
