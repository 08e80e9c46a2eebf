//! A raw HTTP/1.1 client: exact bytes on the wire, framing under the test's control.

use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;

/// How a request body is framed on the wire.
#[derive(Clone, Debug)]
pub(super) enum Framing {
    /// An honest `Content-Length`.
    Length,
    /// `Transfer-Encoding: chunked`, chunks of this size.
    Chunked(usize),
    /// Neither `Content-Length` nor `Transfer-Encoding`: the body bytes follow the head anyway.
    NoLength,
    /// `Content-Length: <this text>` whatever the body's real length (a lie, or not a number).
    Declared(String),
    /// `Content-Length: <n>`, the body (shorter), then the client shuts its sending side.
    DeclaredThenHalfClose(usize),
    /// These header lines (each ending in CRLF) instead of any framing of ours, body as is.
    Custom(String),
    /// `Custom`, then the client shuts its sending side.
    CustomThenHalfClose(String),
}

/// A parsed response.
#[derive(Debug)]
pub(super) struct Reply {
    pub(super) status: u16,
    headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
}

impl Reply {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn decode_chunked(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n")?;
        let line = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if rest.len() < size + 2 {
            return None;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// The first complete response in `buf` (`eof`: nothing more will come).
pub(super) fn parse_reply(buf: &[u8], eof: bool) -> Option<Reply> {
    let end = find(buf, b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &buf[end + 4..];
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let body = if let Some(n) = get("content-length") {
        let n: usize = n.parse().ok()?;
        if rest.len() < n {
            return None;
        }
        rest[..n].to_vec()
    } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        decode_chunked(rest)?
    } else if eof {
        rest.to_vec()
    } else {
        return None;
    };
    Some(Reply {
        status,
        headers,
        body,
    })
}

async fn write_request(
    wr: &mut OwnedWriteHalf,
    head: &[u8],
    body: &[u8],
    framing: &Framing,
) -> std::io::Result<()> {
    wr.write_all(head).await?;
    match framing {
        Framing::Chunked(n) => {
            for chunk in body.chunks((*n).max(1)) {
                wr.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                wr.write_all(chunk).await?;
                wr.write_all(b"\r\n").await?;
            }
            wr.write_all(b"0\r\n\r\n").await?;
        }
        _ => wr.write_all(body).await?,
    }
    if matches!(
        framing,
        Framing::DeclaredThenHalfClose(_) | Framing::CustomThenHalfClose(_)
    ) {
        wr.shutdown().await?;
    }
    wr.flush().await
}

/// Sends one request (`Connection: close`) and reads the first response. The body is written
/// while the response is read, so an early answer (a 413 before the body is read) is seen.
pub(super) async fn exchange(
    port: u16,
    method: &str,
    path: &str,
    body: Arc<Vec<u8>>,
    framing: Framing,
) -> Result<Reply, String> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut rd, mut wr) = stream.into_split();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    match &framing {
        Framing::Length => {
            head += &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
        }
        Framing::Chunked(_) => {
            head += "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        }
        Framing::NoLength => head += "Content-Type: application/json\r\n",
        Framing::Declared(v) => {
            head += &format!("Content-Type: application/json\r\nContent-Length: {v}\r\n")
        }
        Framing::DeclaredThenHalfClose(n) => {
            head += &format!("Content-Type: application/json\r\nContent-Length: {n}\r\n")
        }
        Framing::Custom(h) | Framing::CustomThenHalfClose(h) => head += h,
    }
    head += "\r\n";
    let writer = tokio::spawn(async move {
        let _ = write_request(&mut wr, head.as_bytes(), &body, &framing).await;
        wr // kept open until the response is read
    });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut error = None;
    let reply = loop {
        if let Some(r) = parse_reply(&buf, false) {
            break Some(r);
        }
        match rd.read(&mut chunk).await {
            Ok(0) => break parse_reply(&buf, true),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => {
                error = Some(e);
                break parse_reply(&buf, true);
            }
        }
    };
    writer.abort();
    reply.ok_or_else(|| {
        format!(
            "no response: connection {} after {} bytes {:?}",
            error.map_or("closed".to_owned(), |e| format!("failed ({e})")),
            buf.len(),
            String::from_utf8_lossy(&buf[..buf.len().min(120)])
        )
    })
}

pub(super) async fn send_json(port: u16, method: &str, path: &str, body: &Value) -> Reply {
    exchange(
        port,
        method,
        path,
        Arc::new(serde_json::to_vec(body).unwrap()),
        Framing::Length,
    )
    .await
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}
