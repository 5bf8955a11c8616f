//! The delayed mover: due delayed jobs to their streams ([`MOVE_DUE`]).

use std::sync::LazyLock;

use super::lua::{OomScript, helped};

/// The latest score the delayed mover takes for a due time: the last millisecond of the year
/// 9999. A member scored later (`+inf`, `1e300`) would never be due.
pub(crate) const LATEST_DUE_MS: i64 = 253_402_300_799_999;

/// KEYS: delayed, then the streams of the priority levels -2, -1, 0 (the queue's), 1, 2, then
/// the queue's dead stream and its ids set. ARGV: now_ms, batch, failed_at (RFC 3339), queue, dead maxlen,
/// latest due ([`LATEST_DUE_MS`]). Moves up to `batch` due jobs to the stream of their level
/// (their `priority` field; normal without one, or with one that is no level), each add and
/// remove together, each member by itself:
///
/// - a member that is not a job (not a MessagePack array of strings: `ZADD {q}:delayed 0
///   junk`, or what an older version or another tool left) goes to the dead stream, its bytes
///   in field `member` and its score in `score`, with an error naming the key and what is
///   wrong;
/// - a member scored past `latest due` (never due) goes to the dead stream with its own
///   fields and an error naming the key, its score and the fix (replay it);
/// - a member that cannot be added where it goes (its stream, or the dead stream, is a key of
///   another type) stays where it is, and the error is reported;
///
/// and the other members keep moving. A job's fields are passed on by [`CALL_LIST`](super::lua::CALL_LIST) (no
/// `unpack` limit). A delayed set of the wrong type fails the call, naming the key and the
/// fix. Returns {moved, next due score or false, the levels other than normal moved to (bit
/// `level + 2` each), dead-stream entries trimmed, whether a full batch was taken (look again
/// at once), the errors of the members left where they were (at most 5)}.
pub(crate) static MOVE_DUE: LazyLock<OomScript> = LazyLock::new(|| {
    OomScript::new(&helped(
        r"
check_type(KEYS[1], 'zset', 'the delayed set')
local levels = {['-2'] = 2, ['-1'] = 3, ['1'] = 5, ['2'] = 6}
local used, errors = {}, {}
local moved, trimmed = 0, 0
local function report(e)
  if #errors < 5 then errors[#errors + 1] = e end
end
local function failed(r)
  return type(r) == 'table' and r.err
end
-- Adds `fields` (flat) to the dead stream with `why`; whether it was added.
local function bury(fields, why)
  local g = {}
  for i = 1, #fields - 1, 2 do
    local k = fields[i]
    if k ~= 'error' and k ~= 'traceback' and k ~= 'failed_at' and k ~= 'origin' then
      g[#g + 1] = k
      g[#g + 1] = fields[i + 1]
    end
  end
  for _, v in ipairs({'error', why, 'traceback', '', 'failed_at', ARGV[3], 'origin', ARGV[4]}) do
    g[#g + 1] = v
  end
  local before = redis.pcall('XLEN', KEYS[7])
  local r = call_list(redis.pcall, {'XADD', KEYS[7], 'MAXLEN', '~', ARGV[5], '*'}, g, 1, #g)
  if failed(r) then
    report('the dead stream ' .. KEYS[7] .. ' refused a member of the delayed set ' .. KEYS[1] .. ' that cannot move (' .. r.err .. '): it stays in the delayed set; if the dead stream is no stream, DEL it (RENAME it first to keep its value)')
    return false
  end
  trimmed = trimmed + before + 1 - redis.call('XLEN', KEYS[7])
  return true
end
-- The member's fields (flat), or nil and why it is not a job.
local function fields_of(ok, f, ...)
  if not ok then return nil, 'it is not MessagePack' end
  if select('#', ...) > 0 then return nil, 'it holds more than one MessagePack value' end
  if type(f) ~= 'table' then return nil, 'it is not a MessagePack array' end
  local n = #f
  if n == 0 or n % 2 ~= 0 then return nil, 'it is not an array of field names and values' end
  for i = 1, n do
    if type(f[i]) ~= 'string' then return nil, 'its item ' .. i .. ' is not a string' end
  end
  return f
end
-- Dead-letters member `m` (score `s`) that cannot move; removes it once done.
local function bury_member(m, s, f, why)
  local fields, error
  if f then
    fields = f
    error = 'its score ' .. s .. ' in the delayed set ' .. KEYS[1] .. ' is past the year 9999, a due time no job has, so it would never run: the delayed mover moved it here rather than keep it unseen; replay it to run it now'
  else
    fields = {'member', m, 'score', s}
    error = 'a member of the delayed set ' .. KEYS[1] .. ' (score ' .. s .. ') is not a delayed job: ' .. why .. ' (a job is a MessagePack array of its field names and values). The delayed mover moved it here so that the queue\'s other delayed jobs keep moving; its bytes are in the `member` field'
  end
  if bury(fields, error) then
    redis.call('ZREM', KEYS[1], m)
    -- A job dead-lettered leaves the ids set, as every dead letter does (a replay adds it).
    for i = 1, #fields - 1, 2 do
      if f and fields[i] == 'job_id' then
        local r = redis.pcall('SREM', KEYS[8], fields[i + 1])
        if failed(r) then report('the set of job ids ' .. KEYS[8] .. ': ' .. r.err) end
      end
    end
  end
end
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'LIMIT', 0, ARGV[2], 'WITHSCORES')
for j = 1, #due, 2 do
  local m, s = due[j], due[j + 1]
  local f, why = fields_of(pcall(cmsgpack.unpack, m))
  if f then
    local k = 4
    for i = 1, #f - 1, 2 do
      if f[i] == 'priority' then k = levels[f[i + 1]] or 4 end
    end
    local r = call_list(redis.pcall, {'XADD', KEYS[k], '*'}, f, 1, #f)
    if failed(r) then
      report('the stream ' .. KEYS[k] .. ' refused a delayed job (' .. r.err .. '): it stays in the delayed set ' .. KEYS[1] .. '; if the stream is no stream, DEL it (RENAME it first to keep its value)')
    else
      redis.call('ZREM', KEYS[1], m)
      moved = moved + 1
      used[k] = true
    end
  else
    bury_member(m, s, nil, why)
  end
end
local never = redis.call('ZRANGE', KEYS[1], '+inf', '(' .. ARGV[6], 'BYSCORE', 'REV', 'LIMIT', 0, ARGV[2], 'WITHSCORES')
for j = 1, #never, 2 do
  local m, s = never[j], never[j + 1]
  local f, why = fields_of(pcall(cmsgpack.unpack, m))
  bury_member(m, s, f, why)
end
local mask = 0
for k = 2, 6 do
  if used[k] and k ~= 4 then mask = mask + 2 ^ (k - 2) end
end
local full = #due == 2 * tonumber(ARGV[2]) or #never == 2 * tonumber(ARGV[2])
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {moved, nxt[2] or false, mask, trimmed, full and #errors == 0 and 1 or 0, errors}
",
    ))
});
