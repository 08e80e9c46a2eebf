//! Writing rows: CSV with the header `import` reads (an empty cell is an absent field), or JSON
//! Lines with absent keys omitted, optionally through a fast gzip encoder. The JSON is written
//! by hand (a row is a handful of short strings), escaping what JSON requires.

use std::io::{self, BufWriter, Write};

use flate2::Compression;
use flate2::write::GzEncoder;

use super::{Format, Row, RowExpiry};

/// The columns of both files, in order: the ones `import` reads.
pub(super) use crate::import::COLUMNS as HEADER;

pub(super) enum Encoder<W: Write> {
    Plain(W),
    Gzip(GzEncoder<W>),
}

impl<W: Write> Encoder<W> {
    pub(super) fn new(w: W, gzip: bool) -> Self {
        if gzip {
            Encoder::Gzip(GzEncoder::new(w, Compression::fast()))
        } else {
            Encoder::Plain(w)
        }
    }

    pub(super) fn finish(self) -> io::Result<()> {
        match self {
            Encoder::Plain(mut w) => w.flush(),
            Encoder::Gzip(g) => g.finish()?.flush(),
        }
    }
}

impl<W: Write> Write for Encoder<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Encoder::Plain(w) => w.write(buf),
            Encoder::Gzip(g) => g.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Plain(w) => w.write_all(buf),
            Encoder::Gzip(g) => g.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Encoder::Plain(w) => w.flush(),
            Encoder::Gzip(g) => g.flush(),
        }
    }
}

pub(super) enum RowWriter<W: Write> {
    Csv(Box<csv::Writer<Encoder<W>>>),
    Jsonl(BufWriter<Encoder<W>>),
}

pub(super) fn csv_io(e: csv::Error) -> io::Error {
    if let csv::ErrorKind::Io(_) = e.kind()
        && let csv::ErrorKind::Io(io) = e.into_kind()
    {
        return io;
    }
    // Only I/O errors can happen when writing fixed-width records.
    io::Error::other("CSV writer error")
}

impl<W: Write> RowWriter<W> {
    pub(super) fn new(w: W, format: Format, gzip: bool) -> io::Result<Self> {
        let enc = Encoder::new(w, gzip);
        match format {
            Format::Csv => {
                let mut csv = csv::WriterBuilder::new()
                    .buffer_capacity(1 << 16)
                    .from_writer(enc);
                csv.write_record(HEADER).map_err(csv_io)?;
                Ok(RowWriter::Csv(Box::new(csv)))
            }
            Format::Jsonl => Ok(RowWriter::Jsonl(BufWriter::with_capacity(1 << 16, enc))),
        }
    }

    pub(super) fn row(&mut self, row: &Row<'_>) -> io::Result<()> {
        let mut at_buf = [0u8; 20];
        let mut ttl_buf = [0u8; 20];
        let (at, ttl): (&[u8], &[u8]) = match row.expiry {
            RowExpiry::Never => (b"", b""),
            RowExpiry::TtlSeconds(s) => (b"", fmt_u64(s, &mut ttl_buf)),
            RowExpiry::ExpiresAtMs(ms) => (fmt_u64(ms.max(0) as u64, &mut at_buf), b""),
        };
        match self {
            RowWriter::Csv(w) => w
                .write_record([
                    row.list.as_bytes(),
                    row.dimension.as_str().as_bytes(),
                    row.value.as_bytes(),
                    row.sandbox.as_bytes(),
                    at,
                    ttl,
                    row.reason.unwrap_or("").as_bytes(),
                ])
                .map_err(csv_io),
            RowWriter::Jsonl(w) => {
                w.write_all(b"{\"list\":")?;
                json_str(w, row.list)?;
                w.write_all(b",\"dimension\":")?;
                json_str(w, row.dimension.as_str())?;
                w.write_all(b",\"value\":")?;
                json_str(w, row.value)?;
                w.write_all(b",\"sandbox\":")?;
                json_str(w, row.sandbox)?;
                if !at.is_empty() {
                    w.write_all(b",\"expires_at\":")?;
                    w.write_all(at)?;
                }
                if !ttl.is_empty() {
                    w.write_all(b",\"ttl_seconds\":")?;
                    w.write_all(ttl)?;
                }
                if let Some(reason) = row.reason {
                    w.write_all(b",\"reason\":")?;
                    json_str(w, reason)?;
                }
                w.write_all(b"}\n")
            }
        }
    }

    pub(super) fn finish(self) -> io::Result<()> {
        let enc = match self {
            RowWriter::Csv(w) => w.into_inner().map_err(|e| e.into_error())?,
            RowWriter::Jsonl(w) => w.into_inner().map_err(|e| e.into_error())?,
        };
        enc.finish()
    }
}

/// Decimal digits of `n`, in the tail of `buf`.
pub(super) fn fmt_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// A JSON string literal.
pub(super) fn json_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(b"\"")?;
    if !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        w.write_all(s.as_bytes())?;
    } else {
        for c in s.chars() {
            match c {
                '"' => w.write_all(b"\\\"")?,
                '\\' => w.write_all(b"\\\\")?,
                c if (c as u32) < 0x20 => write!(w, "\\u{:04x}", c as u32)?,
                c => {
                    let mut b = [0u8; 4];
                    w.write_all(c.encode_utf8(&mut b).as_bytes())?;
                }
            }
        }
    }
    w.write_all(b"\"")
}
