//! The fair claim's choice of priority level ([`OLDEST_WAITING`]).

use std::sync::LazyLock;

use redis::Script;

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
