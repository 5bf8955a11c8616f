//! Settling deliveries: the batched settlement ([`SETTLE_MANY`]) and the renewal of a lease
//! ([`RENEW`]).

use std::sync::LazyLock;

use super::lua::{OomScript, with_owned, with_trim};

/// Most settlements one [`SETTLE_MANY`] call makes.
pub(crate) const SETTLE_BATCH: usize = 256;

/// Settles a batch of deliveries (at most [`SETTLE_BATCH`]), each fenced on its own consumer and
/// delivery count: acknowledgements, retries (a new entry now, or a member of the delayed set)
/// and dead letters, in one step. The fence reads this consumer's pending entries between the
/// batch's lowest and highest id with one `XPENDING` range (`ARGV[6]` at most; an id past a
/// range that came back full is looked up on its own), instead of one `XPENDING` per delivery;
/// a delivery settled earlier in the same call no longer counts as held. Every held delivery
/// is acknowledged with one `XACK` and the job ids of those acknowledged or dead-lettered
/// forgotten with one `SREM`. Settled entries leave the stream by one `XTRIM MINID` below the
/// group's oldest pending entry (Redis 7 and later, `ARGV[7]` > 0: the queue's ready count then
/// comes from the group's lag), and are deleted with one `XDEL` when that trim leaves them
/// (they are more than `ARGV[7]` ms of entry time above a delivery still pending) or on Redis
/// 6.2 (`ARGV[7]` 0, which has no lag to count from).
///
/// KEYS: stream, ids, delayed, dead. ARGV: group, consumer, dead maxlen, lowest id, highest id,
/// range count, trim window (ms; 0: delete instead), then one group per settlement: `a, id, deliveries, job_id` (acknowledge),
/// `r, id, deliveries, due_ms ('0': now), n, n items` (retry: the entry's flat fields when due
/// now, its delayed-set member when not), `x, id, deliveries, job_id, n, n items` (dead letter:
/// its dead entry's flat fields). Returns per settlement, in order, 0 when the lease was lost,
/// else 1 plus the dead-stream entries trimmed by its dead letter.
///
/// A script that fails half-way is not undone: the keys a retry, a dead letter or an
/// acknowledgement writes to (the delayed set, the dead stream, the set of job ids) are
/// checked for their type before the first write, so that no write of the call can fail after
/// another took effect (a retry added again by the runtime's next try would run twice; an
/// entry acknowledged before a failing `SREM` would make the next try report its lease lost).
pub(crate) static SETTLE_MANY: LazyLock<OomScript> = LazyLock::new(|| {
    with_trim(
        r"
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local limit = tonumber(ARGV[6])
local held = {}
local p = redis.call('XPENDING', stream, group, ARGV[4], ARGV[5], limit, consumer)
for _, e in ipairs(p) do held[e[1]] = e[4] end
local complete = #p < limit
local function owned(id, d)
  local h = held[id]
  if h == nil and not complete then
    local q = redis.call('XPENDING', stream, group, id, id, 1)
    if #q == 1 and q[1][2] == consumer then h = q[1][4] else h = false end
  end
  if h and tonumber(h) == tonumber(d) then
    held[id] = false
    return true
  end
  return false
end
local i, last = 8, #ARGV
local delayed_ok, dead_ok, ids_ok = true, true, true
while i <= last do
  local op = ARGV[i]
  if op == 'a' then
    ids_ok = false
    i = i + 4
  else
    if op == 'r' and ARGV[i + 3] ~= '0' then delayed_ok = false end
    if op == 'x' then dead_ok, ids_ok = false, false end
    i = i + 5 + tonumber(ARGV[i + 4])
  end
end
if not delayed_ok then check_type(KEYS[3], 'zset', 'the delayed set') end
if not dead_ok then check_type(KEYS[4], 'stream', 'the dead stream') end
if not ids_ok then check_type(KEYS[2], 'set', 'the set of job ids') end
local out, ids, jobs = {}, {}, {}
i = 8
while i <= last do
  local op, id = ARGV[i], ARGV[i + 1]
  local ok = owned(id, ARGV[i + 2])
  local r = 0
  if op == 'a' then
    if ok then
      ids[#ids + 1] = id
      jobs[#jobs + 1] = ARGV[i + 3]
      r = 1
    end
    i = i + 4
  else
    local n = tonumber(ARGV[i + 4])
    if ok then
      ids[#ids + 1] = id
      r = 1
      if op == 'r' then
        if ARGV[i + 3] == '0' then
          call_list(redis.call, {'XADD', stream, '*'}, ARGV, i + 5, i + 4 + n)
        else
          redis.call('ZADD', KEYS[3], ARGV[i + 3], ARGV[i + 5])
        end
      else
        local before = redis.call('XLEN', KEYS[4])
        call_list(redis.call, {'XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*'}, ARGV, i + 5, i + 4 + n)
        r = 1 + before + 1 - redis.call('XLEN', KEYS[4])
        jobs[#jobs + 1] = ARGV[i + 3]
      end
    end
    i = i + 5 + n
  end
  out[#out + 1] = r
end
if #ids > 0 then
  redis.call('XACK', stream, group, unpack(ids))
  local delete = true
  if ARGV[7] ~= '0' then delete = trim_settled(stream, group, tonumber(ARGV[7]), ARGV[5]) end
  if delete then redis.call('XDEL', stream, unpack(ids)) end
end
if #jobs > 0 then redis.call('SREM', KEYS[2], unpack(jobs)) end
return out
",
    )
});

/// KEYS: stream. ARGV: group, consumer, id, deliveries. Resets the entry's idle time.
pub(crate) static RENEW: LazyLock<OomScript> = LazyLock::new(|| {
    with_owned(
        r"
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
",
    )
});
