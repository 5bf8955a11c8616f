//! Cancelling a job: a delayed one ([`CANCEL_DELAYED`]), a stream entry waiting or being run
//! ([`CANCEL_ENTRY`]).

use std::sync::LazyLock;

use redis::Script;

use super::lua::{OomScript, helped};

/// KEYS: delayed, ids. ARGV: member, job_id. Removes a delayed job (cancelled) if its member is
/// still there; 1 when it was. The ids set's type is checked before the first write.
pub(crate) static CANCEL_DELAYED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&helped(
        r"
check_type(KEYS[2], 'set', 'the set of job ids')
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('SREM', KEYS[2], ARGV[2])
  return 1
end
return 0
",
    ))
});

/// KEYS: stream, ids, cancelled. ARGV: entry_id, job_id, group, now_ms, until_ms. Cancels the
/// job of stream entry `entry_id`: an entry being run (pending in the group) gets its job id
/// marked in `cancelled` until `until_ms` (2); an entry waiting is deleted with its id (1); an
/// entry gone meanwhile: 0. Runs on a full server (it frees more than it adds). The types of
/// the ids set and the marks are checked before the first write.
pub(crate) static CANCEL_ENTRY: LazyLock<OomScript> = LazyLock::new(|| {
    OomScript::new(&helped(
        r"
check_type(KEYS[2], 'set', 'the set of job ids')
check_type(KEYS[3], 'zset', 'the set of cancelled jobs')
local ok, p = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[3], ARGV[1], ARGV[1], 1)
if ok and #p == 1 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[5]) - tonumber(ARGV[4]) + 60000)
  return 2
end
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 0 end
redis.call('XDEL', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
",
    ))
});
