//! The body limit, honest and lying framing (`Content-Length`, chunked, neither, both).

use std::sync::Arc;

use super::corpus::{BAD, BAD_BODY, BAD_JSON, Case, Endpoint, Expect, OK};
use crate::hostile::LIMIT;
use crate::hostile::client::Framing;

/// The body limit, honest and lying framing.
pub(crate) fn framing(eps: &[Endpoint], out: &mut Vec<Case>) {
    // `{"x":"aaa...a"}`, exactly `len` bytes.
    let filler = |len: usize| {
        let mut v = b"{\"x\":\"".to_vec();
        v.resize(len - 2, b'a');
        v.extend(b"\"}");
        Arc::new(v)
    };
    let at_limit = filler(LIMIT);
    let over = filler(LIMIT + 1);
    let too_large = Expect::Is(413, Some("payload_too_large"));
    for ep in eps {
        out.push(ep.shared(
            "body of exactly the limit",
            at_limit.clone(),
            Framing::Length,
            BAD_BODY,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit",
            over.clone(),
            Framing::Length,
            too_large,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit, chunked",
            over.clone(),
            Framing::Chunked(64 << 10),
            too_large,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit, no Content-Length (the body is not read)",
            over.clone(),
            Framing::NoLength,
            BAD_JSON,
        ));
        out.push(ep.shared(
            "body 1 byte over the limit, Content-Length: 100 (a lie)",
            over.clone(),
            Framing::Declared("100".into()),
            BAD,
        ));
        out.push(ep.shared(
            "small body, Content-Length: limit + 1 (a lie)",
            Arc::new(ep.bytes()),
            Framing::Declared((LIMIT + 1).to_string()),
            too_large,
        ));
        out.push(ep.shared(
            "small body, Content-Length: 2^64 (a lie)",
            Arc::new(ep.bytes()),
            Framing::Declared("18446744073709551616".into()),
            Expect::Protocol(400),
        ));
        out.push(ep.shared(
            "body in 1-byte chunks",
            Arc::new(ep.bytes()),
            Framing::Chunked(1),
            OK,
        ));
        out.push(ep.shared(
            "Content-Length 1000, 10 bytes, then the client stops sending",
            Arc::new(ep.bytes()[..10].to_vec()),
            Framing::DeclaredThenHalfClose(1000),
            BAD_JSON,
        ));
    }
    let check = eps.iter().find(|e| e.name == "check").unwrap();
    let body = check.bytes();
    let custom = |headers: String, body: Vec<u8>| (Framing::Custom(headers), Arc::new(body));
    // Framing that leaves the server waiting for more: the client then stops sending, so the
    // server sees the end of the stream (a client that just waits is the slow-body case).
    let cut =
        |headers: String, body: Vec<u8>| (Framing::CustomThenHalfClose(headers), Arc::new(body));
    let chunked_body =
        |size_line: &str| [size_line.as_bytes(), b"\r\n", &body[..], b"\r\n0\r\n\r\n"].concat();
    let n = body.len();
    type Framed = (Framing, Arc<Vec<u8>>);
    let cases: Vec<(&str, Framed, Expect)> = vec![
        (
            "Content-Type text/plain",
            custom(
                format!("Content-Type: text/plain\r\nContent-Length: {n}\r\n"),
                body.clone(),
            ),
            OK,
        ),
        (
            "no Content-Type",
            custom(format!("Content-Length: {n}\r\n"), body.clone()),
            OK,
        ),
        (
            "Content-Type form-urlencoded",
            custom(
                format!(
                    "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {n}\r\n"
                ),
                body.clone(),
            ),
            OK,
        ),
        (
            "Content-Length: abc",
            custom("Content-Length: abc\r\n".into(), body.clone()),
            Expect::Protocol(400),
        ),
        (
            "Content-Length: -5",
            custom("Content-Length: -5\r\n".into(), body.clone()),
            Expect::Protocol(400),
        ),
        (
            "two different Content-Lengths",
            custom(
                format!("Content-Length: {n}\r\nContent-Length: 5\r\n"),
                body.clone(),
            ),
            Expect::Protocol(400),
        ),
        (
            "Content-Length and chunked together",
            custom(
                format!("Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n"),
                chunked_body(&format!("{n:x}")),
            ),
            Expect::Protocol(400),
        ),
        (
            "chunk size not hex",
            custom("Transfer-Encoding: chunked\r\n".into(), chunked_body("zz")),
            BAD_JSON,
        ),
        (
            "chunk size beyond 2^64",
            custom(
                "Transfer-Encoding: chunked\r\n".into(),
                chunked_body("fffffffffffffffffffff"),
            ),
            BAD_JSON,
        ),
        (
            "chunk size larger than the limit",
            cut(
                "Transfer-Encoding: chunked\r\n".into(),
                chunked_body(&format!("{:x}", LIMIT + 1)),
            ),
            BAD,
        ),
        (
            "chunk longer than its size",
            custom("Transfer-Encoding: chunked\r\n".into(), chunked_body("3")),
            BAD,
        ),
        (
            "chunked without the last chunk",
            cut(
                "Transfer-Encoding: chunked\r\n".into(),
                [format!("{n:x}\r\n").as_bytes(), &body[..], b"\r\n"].concat(),
            ),
            BAD,
        ),
        (
            "Transfer-Encoding gzip",
            custom(
                format!("Transfer-Encoding: gzip\r\nContent-Length: {n}\r\n"),
                body.clone(),
            ),
            Expect::Protocol(400),
        ),
    ];
    for (label, (framing, body), expect) in cases {
        out.push(check.shared(label, body, framing, expect));
    }
}
