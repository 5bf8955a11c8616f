//! The permit pools of the global limits: taking permits ([`TAKE_PERMITS`]) and renewing them
//! ([`RENEW_PERMITS`]).

use std::sync::LazyLock;

use redis::Script;

use super::lua::OomScript;

/// KEYS: a permit pool (a sorted set of tokens scored by when each runs out). ARGV: now_ms,
/// limit, until_ms, keep_ms, then the tokens offered. Drops the permits past their time, adds
/// as many of the tokens as the limit leaves room for (in order), scored `until_ms`, and keeps
/// the key `keep_ms` past the newest. Returns `{taken, ms until the first permit runs out (-1:
/// not asked, or none held)}`: the second only when none was taken.
pub(crate) static TAKE_PERMITS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local free = tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1])
local n = math.max(0, math.min(free, #ARGV - 4))
for i = 1, n do
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4 + i])
end
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) - now + tonumber(ARGV[4]))
  return {n, -1}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #first == 2 then return {0, math.max(0, tonumber(first[2]) - now)} end
return {0, -1}
",
    )
});

/// KEYS: a permit pool. ARGV: now_ms, until_ms, keep_ms, then tokens. Moves each token still
/// held (not past its time) to `until_ms`; returns how many were. Runs on a full server (it
/// adds no member): a worker keeps its permits while the server refuses new jobs.
pub(crate) static RENEW_PERMITS: LazyLock<OomScript> = LazyLock::new(|| {
    OomScript::new(
        r"
local now = tonumber(ARGV[1])
local held = 0
for i = 4, #ARGV do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) > now then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[i])
    held = held + 1
  end
end
if held > 0 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) - now + tonumber(ARGV[3]))
end
return held
",
    )
});
