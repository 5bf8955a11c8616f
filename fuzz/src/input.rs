//! Reading a fuzz input as a sequence of values, and writing one ([`Enc`], for the seeds).
//!
//! The format is short and forgiving, so that a mutation of one value rarely shifts the others:
//! a number is its bytes (missing bytes read as 0), a chunk is a length byte and that many
//! bytes (cut at the end of the input), and the rest is whatever is left.

/// An input being read.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// The next byte, 0 at the end.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// The next 8 bytes as a little-endian number.
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }

    /// The next 8 bytes as a little-endian signed number.
    pub fn i64(&mut self) -> i64 {
        self.u64() as i64
    }

    /// A length byte, then that many bytes (fewer at the end of the input).
    pub fn chunk(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8()).min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// A chunk as text (bytes that are not UTF-8 replaced).
    pub fn text(&mut self) -> String {
        String::from_utf8_lossy(self.chunk()).into_owned()
    }

    /// Whatever is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// An input being written, value by value, as [`Input`] reads it.
#[derive(Debug, Default)]
pub struct Enc(Vec<u8>);

impl Enc {
    /// An empty input.
    pub fn new() -> Self {
        Self::default()
    }

    /// A byte.
    pub fn u8(mut self, b: u8) -> Self {
        self.0.push(b);
        self
    }

    /// A number of 8 bytes.
    pub fn u64(mut self, n: u64) -> Self {
        self.0.extend_from_slice(&n.to_le_bytes());
        self
    }

    /// A signed number of 8 bytes.
    pub fn i64(self, n: i64) -> Self {
        self.u64(n as u64)
    }

    /// A chunk (at most 255 bytes of `b`).
    pub fn chunk(mut self, b: impl AsRef<[u8]>) -> Self {
        let b = b.as_ref();
        let b = &b[..b.len().min(255)];
        self.0.push(b.len() as u8);
        self.0.extend_from_slice(b);
        self
    }

    /// The rest.
    pub fn rest(mut self, b: impl AsRef<[u8]>) -> Self {
        self.0.extend_from_slice(b.as_ref());
        self
    }

    /// The input's bytes.
    pub fn done(self) -> Vec<u8> {
        self.0
    }
}
