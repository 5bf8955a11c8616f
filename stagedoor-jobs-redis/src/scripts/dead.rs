//! Dead letters: one delivery to the dead stream ([`DEAD`]), a dead letter back to its queue
//! ([`REPLAY`]).

use std::sync::LazyLock;

use redis::Script;

use super::lua::{OWNED, OomScript, TRIM, helped};

/// KEYS: stream, dead, ids. ARGV: group, consumer, id, deliveries, job_id, maxlen, trim ('1':
/// trim the settled entries at the stream's head, as [`SETTLE_MANY`](super::SETTLE_MANY) does on Redis 7; '0':
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
