//! Records: one read ([`READ_RECORD`]) and the writes of one
//! [`Records::write_records`](stagedoor_jobs::broker::Records::write_records) call, compared
//! and applied together ([`WRITE_RECORDS`]). Both check a stored record's shape first
//! (`stored_version`, [`STORED_VERSION`]).

use std::sync::LazyLock;

use redis::Script;

/// `stored_version(key)`: the version of the record at `key` (0 when there is none: absent, or
/// expired), or `nil, {type, version field or false, has a value field (0 or 1)}` when the key
/// holds what this library never writes there: another type than a hash, or a hash without a
/// `value` field or whose `version` is not 1 to 15 digits with no leading 0 (Lua's numbers hold
/// such a version exactly). Reads no value.
const STORED_VERSION: &str = r"
local function stored_version(key)
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' then return 0 end
  local v, has = false, 0
  if t == 'hash' then
    v = redis.call('HGET', key, 'version')
    has = redis.call('HEXISTS', key, 'value')
  end
  if t ~= 'hash' or has == 0 or not v or #v > 15 or not string.match(v, '^[1-9]%d*$') then
    return nil, {t, v, has}
  end
  return tonumber(v)
end
";

/// KEYS: a record. Returns `{1, value, version}`, `{0}` when there is none (absent or
/// expired), or `{-1, 1, type, version or false, has value}` when the key holds something
/// else (see `stored_version`), which the caller reports naming the key.
pub(crate) static READ_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{STORED_VERSION}
local version, bad = stored_version(KEYS[1])
if not version then return {{-1, 1, bad[1], bad[2], bad[3]}} end
if version == 0 then return {{0}} end
return {{1, redis.call('HGET', KEYS[1], 'value'), version}}
"
    ))
});

/// KEYS: the records' keys (one hash tag, so one slot). ARGV: four per key, in its order: the
/// operation (`p` put, `d` delete), the expected version (`''`: any), the ttl in ms (`''`:
/// none, the record is kept until deleted) and the value (`''` for a delete).
///
/// First reads every record's version (`stored_version`): when a key holds something else,
/// returns `{-1, index, type, version or false, has value}` and writes nothing (the caller
/// names the key and the fix). Then, when any expected version differs, returns `{0}` and
/// writes nothing. Otherwise applies every write (a put sets `value` and `version` one above
/// the current one, then `PEXPIRE`s or `PERSIST`s the key; a delete `DEL`s it) and returns
/// `{1, each write's version (0 for a delete)}`. Every step that can fail comes before the
/// first write.
///
/// A plain script (no `allow-oom`): on a full server, a call whose first write is a put is
/// refused before it writes anything, as publishing is; deletes go on.
pub(crate) static WRITE_RECORDS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{STORED_VERSION}
local cur = {{}}
for i, key in ipairs(KEYS) do
  local version, bad = stored_version(key)
  if not version then return {{-1, i, bad[1], bad[2], bad[3]}} end
  cur[i] = version
end
for i = 1, #KEYS do
  local want = ARGV[4 * i - 2]
  if want ~= '' and tonumber(want) ~= cur[i] then return {{0}} end
end
local out = {{1}}
for i, key in ipairs(KEYS) do
  local a = 4 * i - 3
  if ARGV[a] == 'd' then
    redis.call('DEL', key)
    out[i + 1] = 0
  else
    local version = cur[i] + 1
    redis.call('HSET', key, 'value', ARGV[a + 3], 'version', string.format('%d', version))
    if ARGV[a + 2] == '' then
      redis.call('PERSIST', key)
    else
      redis.call('PEXPIRE', key, ARGV[a + 2])
    end
    out[i + 1] = version
  end
end
return out
"
    ))
});
