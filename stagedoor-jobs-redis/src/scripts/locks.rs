//! Locks and ticks: the scheduler's and the delayed mover's locks ([`TAKE_LOCK`], [`UNLOCK`])
//! and a schedule's last tick, only ever raised ([`SET_MAX`]).

use std::sync::LazyLock;

use redis::Script;

use super::lua::{OomScript, helped};

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
