//! What the scripts share: [`OomScript`] (a script's text with and without `allow-oom`), and
//! the Lua helpers put before a script's body: `call_list` (any number of items to a call),
//! `check_type` (a key's type before the first write), `owned` (a delivery still this
//! consumer's) and `trim_settled` (the settled entries at a stream's head).

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

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

/// A call of a script written straight into one command (`EVALSHA` with its keys and
/// arguments): `redis::ScriptInvocation` keeps each key and argument in an allocation of its
/// own and copies them into a command at each call, which a settle batch of many jobs (four
/// arguments each) pays per job. The script is loaded when the server answers `NOSCRIPT`, as
/// `ScriptInvocation` does.
pub(crate) struct ScriptCall<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> ScriptCall<'a> {
    /// A call of `script` on `keys`.
    pub(crate) fn new(script: &'a Script, keys: &[&str]) -> Self {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        Self { script, cmd }
    }

    /// Adds an argument (after the keys, in order).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Runs the call, loading the script first if the server does not have it.
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        c: &mut impl redis::aio::ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd.query_async(c).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(c).await?;
                self.cmd.query_async(c).await
            }
            other => other,
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
pub(super) static CALL_LIST: LazyLock<String> = LazyLock::new(|| {
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
pub(super) const CHECK_TYPE: &str = r"
local function check_type(key, want, what)
  local t = redis.call('TYPE', key)['ok']
  if t ~= want and t ~= 'none' then
    error({err = 'WRONGTYPE ' .. what .. ' ' .. key .. ' is a ' .. t .. ', not a ' .. want .. ': this library never makes it so (another tool or a hand wrote it); DEL the key (RENAME it first to keep its value) and retry'})
  end
end
";

/// A script's text with the helpers it may call ([`CALL_LIST`], [`CHECK_TYPE`]) before it.
pub(super) fn helped(body: &str) -> String {
    format!("{}\n{CHECK_TYPE}\n{body}", *CALL_LIST)
}

/// Whether a delivery is still this consumer's, with the delivery count it was claimed with
/// (a reclaim by another worker changes both).
pub(super) const OWNED: &str = r"
local function owned(stream, group, consumer, id, deliveries)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  return #p == 1 and p[1][2] == consumer and tonumber(p[1][4]) == tonumber(deliveries)
end
";

/// A script in two texts ([`OomScript`]) whose body may call `owned` ([`OWNED`]) and the
/// helpers of [`helped`].
pub(super) fn with_owned(body: &str) -> OomScript {
    OomScript::new(&format!("{OWNED}\n{}", helped(body)))
}

/// Trims the settled entries at the head of a stream: every entry below the group's oldest
/// pending one was delivered and settled (with nothing pending, every entry up to the group's
/// last-delivered id was), so `XTRIM MINID` drops them, whole listpack nodes at a time: far
/// cheaper than deleting entries one by one. Returns whether entries settled at id `highest`
/// are more than `window` ms of entry time above a delivery still pending (a long handler, a
/// worker that died), which the caller then deletes one by one: the stream holds at most about
/// `window` of settled entries.
pub(super) const TRIM: &str = r"
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

/// A script in two texts ([`OomScript`]) whose body may call `trim_settled` ([`TRIM`]) and
/// the helpers of [`helped`].
pub(super) fn with_trim(body: &str) -> OomScript {
    OomScript::new(&format!("{TRIM}\n{}", helped(body)))
}
