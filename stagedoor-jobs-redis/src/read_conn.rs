//! The claim's reads of new entries (`XREADGROUP`) on a connection of each queue's own, with a
//! reply reader written for that one reply.
//!
//! redis-rs reads every reply through a general parser into a tree of values, an allocation
//! and a parser step per field name and per field value: on a drain that was a fifth of a
//! worker's CPU. Here a read's entries go straight from the socket's bytes to `(id, fields)`.
//! A server over TCP or a Unix socket is read this way; TLS and the Cluster read through
//! redis-rs (`claim.rs` picks).
//!
//! The connection is the queue's blocking one: a blocked read holds its connection, so it
//! never shares one with other commands. A read whose future is dropped half-way (a service
//! stopping) drops its connection with it, and so does any error but the server's answer:
//! nothing half-read is ever read again. The entries of a reply lost that way were delivered to
//! this consumer and come back to a claim when their lease has passed (the reclaim).

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;

use crate::entry::Fields;

/// The entries of a read, per stream: (stream, [(id, fields)]).
pub(crate) type StreamsReply = Vec<(String, Vec<(String, Fields)>)>;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest bulk string a reply may hold (Redis' own limit).
const MAX_BULK: usize = 512 * 1024 * 1024;

/// Where and how to connect: the address, the database and the credentials of the URL.
#[derive(Clone, Debug)]
pub(crate) struct ReadTarget {
    addr: Addr,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

#[derive(Clone, Debug)]
enum Addr {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(PathBuf),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(host, port) => write!(f, "{host}:{port}"),
            #[cfg(unix)]
            Addr::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

impl ReadTarget {
    /// The target of `client`'s server when it is reached over plain TCP or a Unix socket;
    /// `None` for TLS (read through redis-rs).
    pub(crate) fn of(client: &redis::Client) -> Option<Self> {
        let info = client.get_connection_info();
        let addr = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            #[cfg(unix)]
            redis::ConnectionAddr::Unix(path) => Addr::Unix(PathBuf::from(path)),
            _ => return None,
        };
        let settings = info.redis_settings();
        Some(Self {
            addr,
            db: settings.db(),
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
        })
    }
}

/// Why a read failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The connection: refused, dropped, timed out, or a reply that is not what the command
    /// answers (the connection is dropped).
    Io(io::Error),
    /// The server's answer to the command (`NOGROUP ...`, `WRONGTYPE ...`, `LOADING ...`): the
    /// connection stays.
    Server(redis::RedisError),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

fn protocol(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// A queue's connection for its claim reads, opened at the first read and again after an
/// error.
pub(crate) struct ReadConn {
    target: ReadTarget,
    open: tokio::sync::Mutex<Option<Open>>,
}

impl ReadConn {
    /// Nothing is opened until the first read.
    pub(crate) fn new(target: ReadTarget) -> Self {
        Self {
            target,
            open: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends `packed` (an `XREADGROUP` command, packed) and reads its entries, all within
    /// `timeout`.
    pub(crate) async fn read(
        &self,
        packed: &[u8],
        timeout: Duration,
    ) -> Result<StreamsReply, ReadError> {
        let mut slot = self.open.lock().await;
        // Out of the slot while in use: dropped, not put back, unless a whole reply was read.
        let mut open = match slot.take() {
            Some(o) => o,
            None => Open::connect(&self.target).await?,
        };
        let reply = tokio::time::timeout(timeout, open.exchange(packed, streams_reply))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the read timed out"))??;
        *slot = Some(open);
        reply.map_err(ReadError::Server)
    }
}

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

/// An open connection and the bytes read from it not yet parsed. A reply's fields are slices
/// of the bytes it was read into (no copy): a batch's bytes are freed when the last of its
/// deliveries is.
struct Open {
    stream: Stream,
    buf: BytesMut,
}

impl Open {
    async fn connect(t: &ReadTarget) -> Result<Self, ReadError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, async {
            Ok::<_, io::Error>(match &t.addr {
                Addr::Tcp(host, port) => {
                    let s = TcpStream::connect((host.as_str(), *port)).await?;
                    s.set_nodelay(true)?;
                    Stream::Tcp(s)
                }
                #[cfg(unix)]
                Addr::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
            })
        })
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connecting timed out"))??;
        let mut open = Open {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
        };
        if let Some(password) = &t.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &t.username {
                auth.arg(user);
            }
            auth.arg(password);
            if let Err(e) = open
                .exchange(&auth.get_packed_command(), simple_reply)
                .await?
            {
                let who = t
                    .username
                    .as_deref()
                    .map_or_else(|| "the default user".to_owned(), |u| format!("user `{u}`"));
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the server at {} refused the login of {who} ({e}): check the user and password of the URL",
                        t.addr
                    ),
                )));
            }
        }
        if t.db != 0 {
            let select = redis::cmd("SELECT").arg(t.db).get_packed_command();
            if let Err(e) = open.exchange(&select, simple_reply).await? {
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the server at {} refused database {} ({e}): the URL's database must be below the server's `databases` setting",
                        t.addr, t.db
                    ),
                )));
            }
        }
        Ok(open)
    }

    /// Writes `packed`, reads one whole reply and reads it with `parse`: `Err` for the
    /// connection (which must not be used again), `Ok(Err)` for the server's error reply.
    async fn exchange<T>(
        &mut self,
        packed: &[u8],
        parse: fn(&mut Cursor<'_>) -> io::Result<T>,
    ) -> io::Result<Result<T, redis::RedisError>> {
        match &mut self.stream {
            Stream::Tcp(s) => s.write_all(packed).await?,
            #[cfg(unix)]
            Stream::Unix(s) => s.write_all(packed).await?,
        }
        self.buf.clear();
        let end = loop {
            if let Some(end) = complete(&self.buf)? {
                break end;
            }
            self.buf.reserve(16 * 1024);
            let n = match &mut self.stream {
                Stream::Tcp(s) => s.read_buf(&mut self.buf).await?,
                #[cfg(unix)]
                Stream::Unix(s) => s.read_buf(&mut self.buf).await?,
            };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
        };
        if end != self.buf.len() {
            return Err(protocol("the server sent more than one reply"));
        }
        let reply = self.buf.split().freeze();
        let mut c = Cursor { b: &reply, at: 0 };
        if c.b.first() == Some(&b'-') {
            let e = redis::parse_redis_value(c.b)
                .and_then(redis::Value::extract_error)
                .err()
                .unwrap_or_else(|| {
                    redis::RedisError::from(protocol("an error reply that does not read"))
                });
            return Ok(Err(e));
        }
        let value = parse(&mut c)?;
        if c.at != end {
            return Err(protocol("a reply longer than what it holds"));
        }
        Ok(Ok(value))
    }
}

/// The length of the first whole reply in `b`, `None` while it is not all there. Reads
/// without allocating and without recursion: a count of the values still to come.
fn complete(b: &[u8]) -> io::Result<Option<usize>> {
    let mut at = 0;
    let mut pending: u64 = 1;
    while pending > 0 {
        let Some(&kind) = b.get(at) else {
            return Ok(None);
        };
        let Some(n) = crlf(&b[at + 1..]) else {
            return Ok(None);
        };
        let line = &b[at + 1..at + 1 + n];
        at += n + 3;
        pending -= 1;
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                let n = int(line)?;
                if n >= 0 {
                    let n = bulk_len(n)?;
                    if b.len() - at < n + 2 {
                        return Ok(None);
                    }
                    at += n + 2;
                }
            }
            b'*' => {
                let n = int(line)?;
                if n > 0 {
                    pending += n as u64;
                }
            }
            other => {
                return Err(protocol(format!(
                    "a reply of type `{}`, which a RESP2 connection never gets",
                    char::from(other).escape_default()
                )));
            }
        }
    }
    Ok(Some(at))
}

fn int(line: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| protocol("a length that is not a number"))
}

fn bulk_len(n: i64) -> io::Result<usize> {
    usize::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_BULK)
        .ok_or_else(|| protocol("a bulk string longer than the server allows"))
}

/// A whole reply being read.
struct Cursor<'a> {
    b: &'a Bytes,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.b.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// The line up to `\r\n`, which is skipped.
    fn line(&mut self) -> io::Result<Option<&'a [u8]>> {
        let b: &'a [u8] = self.b;
        let rest = &b[self.at..];
        let Some(n) = crlf(rest) else {
            return Ok(None);
        };
        self.at += n + 2;
        Ok(Some(&rest[..n]))
    }

    /// A header of type `kind`: its number.
    fn header(&mut self, kind: u8) -> io::Result<i64> {
        match self.byte() {
            Some(k) if k == kind => {}
            _ => {
                return Err(protocol(format!(
                    "a reply without the `{}` it should have",
                    char::from(kind)
                )));
            }
        }
        let line = self.line()?.ok_or_else(|| protocol("a cut reply"))?;
        int(line)
    }

    /// Where the next bulk string's bytes are (nil reads as empty).
    fn bulk_range(&mut self) -> io::Result<std::ops::Range<usize>> {
        let n = self.header(b'$')?;
        if n < 0 {
            return Ok(self.at..self.at);
        }
        let n = bulk_len(n)?;
        if self.b.len() < self.at + n + 2 {
            return Err(protocol("a cut reply"));
        }
        let range = self.at..self.at + n;
        self.at += n + 2;
        Ok(range)
    }

    /// A bulk string (nil reads as empty), a slice of the reply's bytes.
    fn bulk(&mut self) -> io::Result<Bytes> {
        let r = self.bulk_range()?;
        Ok(if r.is_empty() {
            Bytes::new()
        } else {
            self.b.slice(r)
        })
    }

    /// A field's name: one the broker writes is a static string (no count to keep, shared by
    /// every job), any other a slice of the reply.
    fn name(&mut self) -> io::Result<Bytes> {
        let r = self.bulk_range()?;
        let raw = &self.b[r.clone()];
        Ok(
            match crate::entry::JOB_FIELDS
                .iter()
                .find(|n| n.as_bytes() == raw)
            {
                Some(n) => Bytes::from_static(n.as_bytes()),
                None => self.b.slice(r),
            },
        )
    }

    /// An array's length (nil reads as empty).
    fn array(&mut self) -> io::Result<usize> {
        let n = self.header(b'*')?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    fn text(&mut self) -> io::Result<String> {
        String::from_utf8(self.bulk()?.to_vec()).map_err(|_| protocol("a key that is not UTF-8"))
    }
}

/// Where the first `\r\n` of `b` starts.
fn crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

/// `+OK` (or any simple string).
fn simple_reply(c: &mut Cursor<'_>) -> io::Result<()> {
    match c.byte() {
        Some(b'+') => c.line()?.map(|_| ()).ok_or_else(|| protocol("a cut reply")),
        _ => Err(protocol("an answer that is not `+OK`")),
    }
}

/// An `XREADGROUP` reply: nil (nothing came), or `[[stream, [[id, [name, value, ...]], ...]], ...]`.
/// An entry deleted while pending has nil fields (read as none).
fn streams_reply(c: &mut Cursor<'_>) -> io::Result<StreamsReply> {
    if c.b.get(c.at) == Some(&b'$') {
        // A nil bulk string: some servers answer a timed-out read so.
        c.bulk()?;
        return Ok(Vec::new());
    }
    let streams = c.array()?;
    let mut out = Vec::with_capacity(streams);
    for _ in 0..streams {
        if c.array()? != 2 {
            return Err(protocol("a stream's reply that is not [name, entries]"));
        }
        let name = c.text()?;
        let n = c.array()?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            if c.array()? != 2 {
                return Err(protocol("an entry that is not [id, fields]"));
            }
            let id = c.text()?;
            let items = c.array()?;
            let mut fields = Fields::with_capacity(items / 2);
            for _ in 0..items / 2 {
                let k = c.name()?;
                let v = c.bulk()?;
                fields.push((k, v));
            }
            if items % 2 == 1 {
                c.bulk()?;
            }
            entries.push((id, fields));
        }
        out.push((name, entries));
    }
    Ok(out)
}

/// What the fuzz target reaches: a reply's bytes read as [`complete`] and [`streams_reply`] do.
pub(crate) fn read_reply(b: &[u8]) -> io::Result<Option<StreamsReply>> {
    let Some(end) = complete(b)? else {
        return Ok(None);
    };
    let reply = Bytes::copy_from_slice(&b[..end]);
    let mut c = Cursor { b: &reply, at: 0 };
    if b.first() == Some(&b'-') {
        return Ok(Some(Vec::new()));
    }
    streams_reply(&mut c).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply of one stream with two entries, the second with a 300-byte binary value.
    fn reply() -> Vec<u8> {
        let mut b = b"*1\r\n*2\r\n$5\r\njobs!\r\n*2\r\n".to_vec();
        b.extend_from_slice(
            b"*2\r\n$3\r\n1-0\r\n*4\r\n$4\r\nkind\r\n$1\r\nk\r\n$7\r\npayload\r\n$2\r\n{}\r\n",
        );
        b.extend_from_slice(b"*2\r\n$3\r\n2-0\r\n*2\r\n$7\r\npayload\r\n$300\r\n");
        b.extend_from_slice(&[0xff; 300]);
        b.extend_from_slice(b"\r\n");
        b
    }

    #[test]
    fn reads_a_read_of_entries() {
        let got = read_reply(&reply()).unwrap().unwrap();
        assert_eq!(got.len(), 1);
        let (stream, entries) = &got[0];
        assert_eq!(stream, "jobs!");
        assert_eq!(entries[0].0, "1-0");
        assert_eq!(entries[0].1[0], ("kind".into(), "k".into()));
        assert_eq!(entries[0].1[1], ("payload".into(), "{}".into()));
        assert_eq!(entries[1].1[0].1, vec![0xff; 300]);
    }

    #[test]
    fn waits_for_every_cut_and_knows_where_the_reply_ends() {
        let whole = reply();
        for n in 0..whole.len() {
            assert_eq!(complete(&whole[..n]).unwrap(), None, "cut at {n}");
        }
        assert_eq!(complete(&whole).unwrap(), Some(whole.len()));
        let mut two = whole.clone();
        two.extend_from_slice(b"+OK\r\n");
        assert_eq!(complete(&two).unwrap(), Some(whole.len()));
    }

    #[test]
    fn reads_nil_and_deleted_entries() {
        assert_eq!(read_reply(b"*-1\r\n").unwrap(), Some(vec![]));
        assert_eq!(read_reply(b"$-1\r\n").unwrap(), Some(vec![]));
        let deleted = b"*1\r\n*2\r\n$1\r\nq\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*-1\r\n";
        let got = read_reply(deleted).unwrap().unwrap();
        assert_eq!(got[0].1, vec![("1-0".to_owned(), Fields::new())]);
    }

    #[test]
    fn refuses_what_the_command_never_answers() {
        // RESP3 types, a map, lengths that are not numbers or past the limit, wrong shapes.
        for bad in [
            &b"%1\r\n+a\r\n+b\r\n"[..],
            b"_\r\n",
            b"$x\r\n",
            b"$999999999999\r\n",
            b"*1\r\n*3\r\n$1\r\nq\r\n*0\r\n*0\r\n",
            b"*1\r\n*2\r\n:1\r\n*0\r\n",
            b"*1\r\n*2\r\n$1\r\nq\r\n*1\r\n*2\r\n$2\r\n\xff\xfe\r\n*0\r\n",
        ] {
            assert!(
                read_reply(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
