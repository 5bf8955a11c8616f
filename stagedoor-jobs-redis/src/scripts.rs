//! The server-side scripts: every move that must not lose or duplicate a job is one of these,
//! so it happens atomically on the server. Every key a script touches shares the queue's hash
//! tag (Redis Cluster runs it on one node). No script unpacks an unbounded set: batches are
//! bounded, and a job's fields, whose count is the job's (a header each), are passed on with
//! [`CALL_LIST`], which has no limit (Lua's `unpack` stops near 8,000 values).
//!
//! A script that fails half-way is not undone. So every script does the steps that can fail
//! (a key of the wrong type: [`CHECK_TYPE`]) before its first write, and records a job's id
//! only once the job is stored: a call that failed can be made again, and does what it
//! would have done.
//!
//! A full server (`maxmemory` reached with the `noeviction` policy) refuses every command that
//! may grow its memory, and a script whose first such command is refused does nothing. The
//! scripts that settle, reclaim or move a job ([`OomScript`]) carry `#!lua flags=allow-oom` on
//! Redis 7 and later, so that a worker keeps draining a full server (draining is what frees its
//! memory); the scripts that add a job (publish, replay) do not, and are refused while it is
//! full. Redis 6.2 knows no script flags: there the plain text runs.

use std::sync::LazyLock;

use redis::Script;

/// A script in two texts: with `#!lua flags=allow-oom` (Redis 7 and later: it runs on a full
/// server) and without (Redis 6.2, which has no script flags). The broker picks by the version
/// it found at connect.
pub(crate) struct OomScript {
    plain: Script,
    allow_oom: Script,
}

impl OomScript {
    pub(crate) fn new(body: &str) -> Self {
        Self {
            plain: Script::new(body),
            allow_oom: Script::new(&format!("#!lua flags=allow-oom\n{body}")),
        }
    }

    /// The text to run: with the flag when the server knows script flags.
    pub(crate) fn pick(&self, allow_oom: bool) -> &Script {
        if allow_oom {
            &self.allow_oom
        } else {
            &self.plain
        }
    }
}

/// How many items [`CALL_LIST`] passes with one `unpack` (Lua's C stack holds about 8,000).
const UNPACK_MAX: usize = 7_000;

/// How many items [`CALL_LIST`] moves onto the call per step past [`UNPACK_MAX`].
const SPREAD_STEP: usize = 64;

/// `call_list(f, head, t, i, j)`: `f(head[1], .., head[#head], t[i], .., t[j])` for any
/// number of items. `unpack` refuses more than about 8,000 values ("too many results to
/// unpack"), which a job with 4,000 headers reaches; past [`UNPACK_MAX`] the items are put in
/// front of the call's varargs [`SPREAD_STEP`] at a time by tail calls (Lua's own stack has no
/// such limit, and neither has `redis.call`). `head` has 3 or 6 items on the short path.
static CALL_LIST: LazyLock<String> = LazyLock::new(|| {
    let step: Vec<String> = (0..SPREAD_STEP)
        .rev()
        .map(|k| format!("t[j - {k}]"))
        .collect();
    format!(
        r"
local function spread(f, head, t, i, j, ...)
  if j < i then
    if head then return spread(f, nil, head, 1, #head, ...) end
    return f(...)
  end
  if j - i >= {last} then
    return spread(f, head, t, i, j - {SPREAD_STEP}, {step}, ...)
  end
  return spread(f, head, t, i, j - 1, t[j], ...)
end
local function call_list(f, head, t, i, j)
  if j - i < {UNPACK_MAX} then
    if #head == 3 then return f(head[1], head[2], head[3], unpack(t, i, j)) end
    if #head == 6 then
      return f(head[1], head[2], head[3], head[4], head[5], head[6], unpack(t, i, j))
    end
  end
  return spread(f, head, t, i, j)
end
",
        last = SPREAD_STEP - 1,
        step = step.join(", "),
    )
});

/// `check_type(key, want, what)`: fails the script (nothing written yet) when `key` exists
/// with a type other than `want`, with an error naming the key, what it should be and the
/// fix. `what` names the key's role (`the delayed set`).
const CHECK_TYPE: &str = r"
local function check_type(key, want, what)
  local t = redis.call('TYPE', key)['ok']
  if t ~= want and t ~= 'none' then
    error({err = 'WRONGTYPE ' .. what .. ' ' .. key .. ' is a ' .. t .. ', not a ' .. want .. ': this library never makes it so (another tool or a hand wrote it); DEL the key (RENAME it first to keep its value) and retry'})
  end
end
";

/// A script's text with the helpers it may call ([`CALL_LIST`], [`CHECK_TYPE`]) before it.
fn helped(body: &str) -> String {
    format!("{}\n{CHECK_TYPE}\n{body}", *CALL_LIST)
}

/// Whether a delivery is still this consumer's, with the delivery count it was claimed with
/// (a reclaim by another worker changes both).
const OWNED: &str = r"
local function owned(stream, group, consumer, id, deliveries)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  return #p == 1 and p[1][2] == consumer and tonumber(p[1][4]) == tonumber(deliveries)
end
";

fn with_owned(body: &str) -> OomScript {
    OomScript::new(&format!("{OWNED}\n{}", helped(body)))
}

/// Trims the settled entries at the head of a stream: every entry below the group's oldest
/// pending one was delivered and settled (with nothing pending, every entry up to the group's
/// last-delivered id was), so `XTRIM MINID` drops them, whole listpack nodes at a time: far
/// cheaper than deleting entries one by one. Returns whether entries settled at id `highest`
/// are more than `window` ms of entry time above a delivery still pending (a long handler, a
/// worker that died), which the caller then deletes one by one: the stream holds at most about
/// `window` of settled entries.
const TRIM: &str = r"
local function trim_settled(stream, group, window, highest)
  local minid
  local o = redis.call('XPENDING', stream, group, '-', '+', 1)
  if #o == 1 then
    minid = o[1][1]
  else
    local gs = redis.call('XINFO', 'GROUPS', stream)
    for _, g in ipairs(gs) do
      local name, lastid
      for k = 1, #g, 2 do
        if g[k] == 'name' then name = g[k + 1] end
        if g[k] == 'last-delivered-id' then lastid = g[k + 1] end
      end
      if name == group and lastid then
        local ms, seq = string.match(lastid, '^(%d+)-(%d+)$')
        if ms and #seq < 15 then minid = ms .. '-' .. string.format('%d', tonumber(seq) + 1) end
      end
    end
  end
  if not minid then return true end
  redis.call('XTRIM', stream, 'MINID', minid)
  if not highest then return false end
  local oldest = tonumber(string.match(minid, '^(%d+)-')) or 0
  local top = tonumber(string.match(highest, '^(%d+)-')) or 0
  return top - oldest > window
end
";

fn with_trim(body: &str) -> OomScript {
    OomScript::new(&format!("{TRIM}\n{}", helped(body)))
}

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

/// KEYS: stream, dead, ids. ARGV: group, consumer, id, deliveries, job_id, maxlen, trim ('1':
/// trim the settled entries at the stream's head, as [`SETTLE_MANY`] does on Redis 7; '0':
/// not), fields... Returns {settled, trimmed}. The dead stream's and the ids set's types are
/// checked before the first write.
pub(crate) static DEAD: LazyLock<OomScript> = LazyLock::new(|| {
    OomScript::new(&format!(
        "{OWNED}\n{TRIM}\n{}",
        helped(
            r"
if not owned(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return {0, 0} end
check_type(KEYS[2], 'stream', 'the dead stream')
check_type(KEYS[3], 'set', 'the set of job ids')
local before = redis.call('XLEN', KEYS[2])
call_list(redis.call, {'XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*'}, ARGV, 8, #ARGV)
local after = redis.call('XLEN', KEYS[2])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
redis.call('SREM', KEYS[3], ARGV[5])
if ARGV[7] ~= '0' then trim_settled(KEYS[1], ARGV[1], 0, nil) end
return {1, before + 1 - after}
"
        )
    ))
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

/// KEYS: stream, delayed, ids. ARGV: one group per job, `job_id, due_ms ('0': now), n` then
/// `n` items: the job's flat fields when it is due now, its delayed-set member when it is not.
/// Publishes every job of the call in one step; a job whose id is already in the queue (or
/// earlier in the call) is not added again. Returns the 1-based positions of those skipped.
/// The loop walks ARGV a job at a time (the broker bounds how many jobs one call carries) and
/// passes on one job's fields at a time ([`CALL_LIST`]), never the whole ARGV.
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

/// KEYS: lock. ARGV: token, ttl_ms. Takes the lock (`SET NX PX`) if nobody holds it; 1 when
/// taken. A script so that it runs on a full server too (the delayed mover's lock: moving due
/// jobs must go on while the server is full).
///
/// A lock key of another type than a string (which `SET NX` would take for a lock held
/// forever, so that no delayed job moved and nothing said why) fails it, naming the key.
pub(crate) static TAKE_LOCK: LazyLock<OomScript> = LazyLock::new(|| {
    OomScript::new(&helped(
        r"
check_type(KEYS[1], 'string', 'the lock')
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
",
    ))
});

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
/// and the other members keep moving. A job's fields are passed on by [`CALL_LIST`] (no
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

/// KEYS: dead, stream, ids. ARGV: dead_id, job_id, fields... Returns 1 (moved), 0 (already
/// gone), -1 (a job of that id is in the queue: left where it is). The job's id is recorded
/// only once it was added to the stream (a replay failing on a stream of the wrong type
/// stays replayable once the key is fixed).
pub(crate) static REPLAY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&helped(
        r"
local e = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #e == 0 then return 0 end
if redis.call('SISMEMBER', KEYS[3], ARGV[2]) == 1 then return -1 end
check_type(KEYS[2], 'stream', 'the stream')
call_list(redis.call, {'XADD', KEYS[2], '*'}, ARGV, 3, #ARGV)
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
",
    ))
});

/// KEYS: streams (a queue's priority levels). ARGV: group. The 1-based index of the stream
/// whose oldest entry not yet delivered to the group is the oldest (by entry id: the time it
/// was added), 0 when none has one. Reads only: the fair claim's choice of level.
pub(crate) static OLDEST_WAITING: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local best, best_ms, best_seq = 0, nil, nil
for k = 1, #KEYS do
  local ok, gs = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[k])
  local last
  if ok then
    for _, g in ipairs(gs) do
      local name, lastid
      for i = 1, #g, 2 do
        if g[i] == 'name' then name = g[i + 1] end
        if g[i] == 'last-delivered-id' then lastid = g[i + 1] end
      end
      if name == ARGV[1] then last = lastid end
    end
  end
  if last then
    local e = redis.call('XRANGE', KEYS[k], '(' .. last, '+', 'COUNT', 1)
    if #e == 1 then
      local ms, seq = string.match(e[1][1], '^(%d+)-(%d+)$')
      ms, seq = tonumber(ms), tonumber(seq)
      if ms and (best_ms == nil or ms < best_ms or (ms == best_ms and seq < best_seq)) then
        best, best_ms, best_seq = k, ms, seq
      end
    end
  end
end
return best
",
    )
});

/// KEYS: lock. ARGV: token. Deletes the lock only if `token` owns it.
pub(crate) static UNLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
",
    )
});

/// KEYS: key. ARGV: value. Sets the key to the larger of its value and `value`.
pub(crate) static SET_MAX: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local old = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) > old then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
",
    )
});

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
