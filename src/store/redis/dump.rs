//! Client-side bucket serialisation: `RESTORE` payloads for the bulk-load path of
//! `namelist-tools import` (buckets that do not exist yet), and the reading of `DUMP`
//! payloads for the service's local tier (`tier`), which fetches whole buckets.
//!
//! `HSET` into a listpack is bound by Redis's CPU (every insert scans the bucket, ~370k
//! fields/s measured); `RESTORE` of a ready-made listpack is a memcpy plus validation (~22M
//! fields/s). So the importer builds each new bucket here and sends it whole.
//!
//! A `DUMP` payload (Redis 7.0) is:
//!
//! ```text
//! <RDB type: 16 = hash in a listpack> <the listpack as an RDB string> <RDB version: u16 LE> <CRC-64/Redis of all before: u64 LE>
//! ```
//!
//! and a listpack is `<total bytes: u32 LE> <elements: u16 LE> <entry>* 0xFF`, each entry
//! `<encoding + data> <backlen>`. Integers use Redis's own smallest encoding (7-bit, 13-bit,
//! 16/24/32/64-bit), so a restored bucket is byte for byte what `HSET` would have built and
//! costs the same memory. The server's type byte and RDB version are learnt from a `DUMP` of a
//! probe key (`DumpFormat::learn`), never assumed; the importer then checks a restored probe
//! against an `HSET`-built twin before trusting the path (see `tools::import`).
//!
//! A malformed payload can crash a Redis that does not sanitise payloads; the tests run
//! `redis-server --sanitize-dump-payload yes`, which validates every restored listpack deeply
//! (including duplicate fields, which is why `hash_payload` refuses them).
//!
//! Reading (`read_hash_dump`): why `DUMP` and not `HGETALL` to fetch a bucket. Measured on
//! Redis 7.0.15 with 200-field buckets (`INFO commandstats`, `usec_per_call`): `HGETALL`
//! 31.3 µs (every integer is formatted as a decimal string, 400 replies), `DUMP` 21.7 µs with
//! the default `rdbcompression yes` (the listpack is LZF-compressed on the way out) and 3.4 µs
//! with `rdbcompression no`, against 2.4 µs for one `HGET`; the reply is one 3.2 KB string
//! instead of ~10 KB in 400 parts, so the client parses it in a fraction of the time too. So
//! the reader accepts both raw and LZF-compressed listpacks, checks the CRC, and refuses
//! anything else (a hash that grew past `hash-max-listpack-entries` dumps as RDB type 4: the
//! caller reads that one with `HGETALL`). Every element of a bucket must be an integer (the
//! layout writes nothing else): a string element is an error, never a guess.

use std::collections::HashSet;

/// CRC-64 with Redis's (Jones) polynomial, as `DUMP` uses.
const CRC: crc::Crc<u64> = crc::Crc::<u64>::new(&crc::CRC_64_REDIS);

/// RDB type of a hash encoded as a listpack (Redis ≥ 7.0).
pub const RDB_TYPE_HASH_LISTPACK: u8 = 16;

/// Why a payload could not be built or a probe not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    #[error("DUMP payload too short ({0} bytes)")]
    TooShort(usize),
    #[error("DUMP payload checksum mismatch")]
    Checksum,
    #[error("the server dumps hashes as RDB type {0}, not a listpack (16): Redis older than 7.0?")]
    UnsupportedType(u8),
    #[error("duplicate field {0} in one bucket")]
    DuplicateField(i64),
    #[error("malformed DUMP payload: {0}")]
    Malformed(&'static str),
}

/// The server's DUMP framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpFormat {
    pub rdb_version: u16,
}

impl DumpFormat {
    /// Learns the framing from the server's `DUMP` of a small listpack hash.
    pub fn learn(probe_dump: &[u8]) -> Result<Self, DumpError> {
        if probe_dump.len() < 1 + 10 {
            return Err(DumpError::TooShort(probe_dump.len()));
        }
        let (body, crc) = probe_dump.split_at(probe_dump.len() - 8);
        if CRC.checksum(body).to_le_bytes() != crc {
            return Err(DumpError::Checksum);
        }
        if body[0] != RDB_TYPE_HASH_LISTPACK {
            return Err(DumpError::UnsupportedType(body[0]));
        }
        let v = &body[body.len() - 2..];
        Ok(Self {
            rdb_version: u16::from_le_bytes([v[0], v[1]]),
        })
    }

    /// The `RESTORE` payload of a hash bucket holding `pairs` (field, value), in that order.
    /// Fields must be distinct.
    pub fn hash_payload(&self, pairs: &[(i64, i64)]) -> Result<Vec<u8>, DumpError> {
        let mut seen = HashSet::with_capacity(pairs.len());
        if let Some((f, _)) = pairs.iter().find(|(f, _)| !seen.insert(*f)) {
            return Err(DumpError::DuplicateField(*f));
        }
        let lp = listpack(pairs.iter().flat_map(|(f, v)| [*f, *v]), pairs.len() * 2);
        let mut out = Vec::with_capacity(lp.len() + 20);
        out.push(RDB_TYPE_HASH_LISTPACK);
        rdb_length(&mut out, lp.len() as u64);
        out.extend_from_slice(&lp);
        out.extend_from_slice(&self.rdb_version.to_le_bytes());
        let crc = CRC.checksum(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(out)
    }
}

/// The (field, value) pairs of a hash from its `DUMP` payload, in listpack order. Fails with
/// `UnsupportedType` when the hash is not a listpack (read it another way), and with
/// `Checksum` or `Malformed` when the payload is damaged or holds a non-integer element.
pub fn read_hash_dump(payload: &[u8]) -> Result<Vec<(i64, i64)>, DumpError> {
    if payload.len() < 1 + 1 + 2 + 8 {
        return Err(DumpError::TooShort(payload.len()));
    }
    let (body, crc) = payload.split_at(payload.len() - 8);
    if CRC.checksum(body).to_le_bytes() != crc {
        return Err(DumpError::Checksum);
    }
    let body = &body[..body.len() - 2]; // the RDB version: the framing is checked by the CRC
    if body[0] != RDB_TYPE_HASH_LISTPACK {
        return Err(DumpError::UnsupportedType(body[0]));
    }
    let mut at = 1;
    let lp = read_rdb_string(body, &mut at)?;
    if at != body.len() {
        return Err(DumpError::Malformed("bytes after the listpack"));
    }
    let elements = read_listpack(&lp)?;
    if elements.len() % 2 != 0 {
        return Err(DumpError::Malformed("a field without a value"));
    }
    Ok(elements.chunks(2).map(|p| (p[0], p[1])).collect())
}

/// An RDB string at `body[*at..]` (raw or LZF-compressed), advancing `at` past it.
fn read_rdb_string(body: &[u8], at: &mut usize) -> Result<Vec<u8>, DumpError> {
    const LZF: u8 = 0xC3;
    if body.get(*at) == Some(&LZF) {
        *at += 1;
        let compressed = read_rdb_length(body, at)?;
        let len = read_rdb_length(body, at)?;
        let data = take(body, at, compressed)?;
        return lzf_decompress(data, len);
    }
    let len = read_rdb_length(body, at)?;
    Ok(take(body, at, len)?.to_vec())
}

fn take<'a>(body: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], DumpError> {
    let end = at
        .checked_add(n)
        .filter(|&e| e <= body.len())
        .ok_or(DumpError::Malformed("truncated"))?;
    let out = &body[*at..end];
    *at = end;
    Ok(out)
}

/// RDB length encoding (the reverse of `rdb_length`).
fn read_rdb_length(body: &[u8], at: &mut usize) -> Result<usize, DumpError> {
    let first = take(body, at, 1)?[0];
    let len = match first >> 6 {
        0 => u64::from(first & 0x3F),
        1 => (u64::from(first & 0x3F) << 8) | u64::from(take(body, at, 1)?[0]),
        _ if first == 0x80 => u64::from(u32::from_be_bytes(
            take(body, at, 4)?.try_into().expect("4 bytes"),
        )),
        _ if first == 0x81 => u64::from_be_bytes(take(body, at, 8)?.try_into().expect("8 bytes")),
        _ => return Err(DumpError::Malformed("not a string length")),
    };
    usize::try_from(len).map_err(|_| DumpError::Malformed("length too large"))
}

/// LZF decompression (liblzf's format, what Redis compresses RDB strings with): a control
/// byte below 32 starts a run of that many + 1 literal bytes; above, its top 3 bits are the
/// length of a back reference (7: one more length byte follows) and its low 5 bits with the
/// next byte the distance back, less one. Written here because the one maintained crate for
/// it is deprecated; the result must be exactly `len` bytes.
fn lzf_decompress(input: &[u8], len: usize) -> Result<Vec<u8>, DumpError> {
    let bad = || DumpError::Malformed("bad LZF data");
    let mut out = Vec::with_capacity(len);
    let mut i = 0;
    while i < input.len() {
        let ctrl = usize::from(input[i]);
        i += 1;
        if ctrl < 32 {
            let run = input.get(i..i + ctrl + 1).ok_or_else(bad)?;
            out.extend_from_slice(run);
            i += ctrl + 1;
        } else {
            let mut n = ctrl >> 5;
            if n == 7 {
                n += usize::from(*input.get(i).ok_or_else(bad)?);
                i += 1;
            }
            let low = usize::from(*input.get(i).ok_or_else(bad)?);
            i += 1;
            let back = ((ctrl & 0x1F) << 8) + low + 1;
            let start = out.len().checked_sub(back).ok_or_else(bad)?;
            // The reference may overlap what it produces: byte by byte.
            for k in 0..n + 2 {
                out.push(out[start + k]);
            }
        }
        if out.len() > len {
            return Err(bad());
        }
    }
    if out.len() != len {
        return Err(bad());
    }
    Ok(out)
}

/// The integer elements of a listpack (the reverse of `listpack`, for every integer
/// encoding; a string element is an error).
fn read_listpack(lp: &[u8]) -> Result<Vec<i64>, DumpError> {
    let bad = DumpError::Malformed;
    if lp.len() < 7 || lp.len() != u32::from_le_bytes(lp[0..4].try_into().expect("4")) as usize {
        return Err(bad("listpack size"));
    }
    let count = u16::from_le_bytes([lp[4], lp[5]]);
    let mut out = Vec::with_capacity(if count == u16::MAX { 0 } else { count.into() });
    let mut at = 6;
    loop {
        let b = *lp.get(at).ok_or(bad("no end byte"))?;
        if b == 0xFF {
            break;
        }
        let int = |n: usize| -> Result<i64, DumpError> {
            let bytes = lp.get(at + 1..at + 1 + n).ok_or(bad("truncated integer"))?;
            let mut buf = [0u8; 8];
            buf[..n].copy_from_slice(bytes);
            // Sign-extend from n bytes.
            let shift = 64 - 8 * n as u32;
            Ok((i64::from_le_bytes(buf) << shift) >> shift)
        };
        let (value, size) = match b {
            0x00..=0x7F => (i64::from(b), 1),
            0xC0..=0xDF => {
                let low = *lp.get(at + 1).ok_or(bad("truncated integer"))?;
                let u = (i64::from(b & 0x1F) << 8) | i64::from(low);
                (if u >= 0x1000 { u - 0x2000 } else { u }, 2)
            }
            0xF1 => (int(2)?, 3),
            0xF2 => (int(3)?, 4),
            0xF3 => (int(4)?, 5),
            0xF4 => (int(8)?, 9),
            _ => return Err(bad("a string element in a bucket")),
        };
        let backlen = match size {
            0..=127 => 1,
            _ => 2,
        };
        at += size + backlen;
        out.push(value);
    }
    if at + 1 != lp.len() || (count != u16::MAX && usize::from(count) != out.len()) {
        return Err(bad("element count"));
    }
    Ok(out)
}

/// A listpack of integer elements.
pub fn listpack(elements: impl IntoIterator<Item = i64>, count: usize) -> Vec<u8> {
    let mut lp = Vec::with_capacity(6 + count * 10 + 1);
    lp.extend_from_slice(&[0; 6]);
    for v in elements {
        encode_int(&mut lp, v);
    }
    lp.push(0xFF);
    let total = lp.len() as u32;
    lp[0..4].copy_from_slice(&total.to_le_bytes());
    // 65535 and above: "unknown", as Redis writes it.
    let n = u16::try_from(count).unwrap_or(u16::MAX);
    lp[4..6].copy_from_slice(&n.to_le_bytes());
    lp
}

/// Appends one integer entry in Redis's smallest encoding, then its backlen (the entry is at
/// most 9 bytes, so the backlen is one byte holding that length).
fn encode_int(out: &mut Vec<u8>, v: i64) {
    let start = out.len();
    if (0..=127).contains(&v) {
        out.push(v as u8);
    } else if (-4096..=4095).contains(&v) {
        let u = (v as u64 & 0x1FFF) as u16;
        out.push(0xC0 | (u >> 8) as u8);
        out.push((u & 0xFF) as u8);
    } else if (-32768..=32767).contains(&v) {
        out.push(0xF1);
        out.extend_from_slice(&(v as i16).to_le_bytes());
    } else if (-8_388_608..=8_388_607).contains(&v) {
        out.push(0xF2);
        out.extend_from_slice(&(v as i32).to_le_bytes()[..3]);
    } else if (i64::from(i32::MIN)..=i64::from(i32::MAX)).contains(&v) {
        out.push(0xF3);
        out.extend_from_slice(&(v as i32).to_le_bytes());
    } else {
        out.push(0xF4);
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.push((out.len() - start) as u8);
}

/// RDB length encoding: 6-bit, 14-bit big-endian, or a marker and a 32/64-bit big-endian.
fn rdb_length(out: &mut Vec<u8>, len: u64) {
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.push(0x40 | (len >> 8) as u8);
        out.push((len & 0xFF) as u8);
    } else if len <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_is_redis_crc64() {
        assert_eq!(CRC.checksum(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn integer_encodings_match_redis_sizes() {
        // (value, entry bytes including backlen): NOTES.md's table.
        for (v, size) in [
            (0, 2),
            (127, 2),
            (128, 3),
            (-1, 3),
            (-4096, 3),
            (4095, 3),
            (4096, 4),
            (-32768, 4),
            (32768, 5),
            (8_388_607, 5),
            (-8_388_609, 6),
            (2_147_483_647, 6),
            (2_147_483_648, 10),
            (i64::MIN, 10),
        ] {
            let mut out = Vec::new();
            encode_int(&mut out, v);
            assert_eq!(out.len(), size, "{v}");
            assert_eq!(*out.last().unwrap() as usize, size - 1, "backlen of {v}");
        }
        let mut out = Vec::new();
        encode_int(&mut out, -1);
        assert_eq!(out, [0xDF, 0xFF, 2], "13-bit two's complement");
        let mut out = Vec::new();
        encode_int(&mut out, -8_388_608);
        assert_eq!(out, [0xF2, 0x00, 0x00, 0x80, 4]);
    }

    #[test]
    fn a_small_hash_payload_is_what_redis_dumps() {
        // DUMP of `HSET h 1 2` on Redis 7.0: type 16, 11-byte listpack, RDB version 10, CRC.
        let f = DumpFormat { rdb_version: 10 };
        let p = f.hash_payload(&[(1, 2)]).unwrap();
        assert_eq!(
            &p[..p.len() - 8],
            &[16, 11, 11, 0, 0, 0, 2, 0, 1, 1, 2, 1, 0xFF, 10, 0]
        );
        assert_eq!(DumpFormat::learn(&p), Ok(f));
        let mut bad = p.clone();
        bad[9] ^= 1;
        assert_eq!(DumpFormat::learn(&bad), Err(DumpError::Checksum));
    }

    #[test]
    fn a_64_bit_field_and_32_bit_expiry_match_redis_byte_for_byte() {
        // redis-cli DUMP after `HSET g -1234567890123 200000000` on Redis 7.0.15.
        let redis: &[u8] = &[
            0x10, 0x17, 0x17, 0x00, 0x00, 0x00, 0x02, 0x00, 0xf4, 0x35, 0xfb, 0x04, 0x8e, 0xe0,
            0xfe, 0xff, 0xff, 0x09, 0xf3, 0x00, 0xc2, 0xeb, 0x0b, 0x05, 0xff, 0x0a, 0x00, 0x69,
            0x7b, 0xc9, 0x67, 0x79, 0xe9, 0x87, 0x3f,
        ];
        let f = DumpFormat::learn(redis).unwrap();
        assert_eq!(
            f.hash_payload(&[(-1_234_567_890_123, 200_000_000)])
                .unwrap(),
            redis
        );
    }

    /// `redis-cli --raw DUMP z` on Redis 7.0.15 after `HSET z -1234567890123 200000000
    /// -1234567890124 200000001 -1234567890125 200000002 5 0 -5000 7 40000 -40000 9000000
    /// -9000000`: LZF-compressed (0xC3), with back references, and every integer encoding.
    const REDIS_LZF_DUMP: &[u8] = &[
        0x10, 0xc3, 0x40, 0x4c, 0x40, 0x57, 0x17, 0x57, 0x00, 0x00, 0x00, 0x0e, 0x00, 0xf4, 0x35,
        0xfb, 0x04, 0x8e, 0xe0, 0xfe, 0xff, 0xff, 0x09, 0xf3, 0x00, 0xc2, 0xeb, 0x0b, 0x05, 0xf4,
        0x34, 0xe0, 0x00, 0x0f, 0x00, 0x01, 0x60, 0x0f, 0x00, 0x33, 0xe0, 0x00, 0x0f, 0x00, 0x02,
        0x40, 0x0f, 0x1f, 0x05, 0x01, 0x00, 0x01, 0xf1, 0x78, 0xec, 0x03, 0x07, 0x01, 0xf2, 0x40,
        0x9c, 0x00, 0x04, 0xf2, 0xc0, 0x63, 0xff, 0x04, 0xf3, 0x40, 0x54, 0x89, 0x00, 0x05, 0xf3,
        0xc0, 0xab, 0x76, 0xff, 0x05, 0x00, 0xff, 0x0a, 0x00, 0x97, 0x78, 0xfb, 0xbc, 0xea, 0xa4,
        0x10, 0xe8,
    ];

    #[test]
    fn a_compressed_redis_dump_reads_back_as_its_pairs() {
        assert_eq!(
            read_hash_dump(REDIS_LZF_DUMP).unwrap(),
            vec![
                (-1_234_567_890_123, 200_000_000),
                (-1_234_567_890_124, 200_000_001),
                (-1_234_567_890_125, 200_000_002),
                (5, 0),
                (-5000, 7),
                (40_000, -40_000),
                (9_000_000, -9_000_000),
            ]
        );
        let mut bad = REDIS_LZF_DUMP.to_vec();
        bad[20] ^= 1;
        assert_eq!(read_hash_dump(&bad), Err(DumpError::Checksum));
    }

    #[test]
    fn what_we_build_reads_back_whatever_its_encodings() {
        let f = DumpFormat { rdb_version: 10 };
        let edges = [
            0,
            127,
            128,
            -1,
            -4096,
            4095,
            4096,
            -32768,
            32767,
            32768,
            -8_388_608,
            8_388_607,
            8_388_608,
            i64::from(i32::MIN),
            i64::from(i32::MAX),
            i64::MIN,
            i64::MAX,
        ];
        let pairs: Vec<(i64, i64)> = edges
            .iter()
            .enumerate()
            .map(|(i, &v)| (i64::MIN + i as i64, v))
            .chain((0..300).map(|i| (i * 7_919, 200_000_000 + i)))
            .collect();
        assert_eq!(
            read_hash_dump(&f.hash_payload(&pairs).unwrap()).unwrap(),
            pairs
        );
        assert_eq!(
            read_hash_dump(&f.hash_payload(&[]).unwrap()).unwrap(),
            vec![]
        );
    }

    #[test]
    fn other_types_and_damaged_payloads_are_refused() {
        let f = DumpFormat { rdb_version: 10 };
        let mut other = f.hash_payload(&[(1, 2)]).unwrap();
        other[0] = 4; // a hashtable-encoded hash
        let n = other.len();
        let crc = CRC.checksum(&other[..n - 8]).to_le_bytes();
        other[n - 8..].copy_from_slice(&crc);
        assert_eq!(read_hash_dump(&other), Err(DumpError::UnsupportedType(4)));
        assert_eq!(read_hash_dump(&[16, 0]), Err(DumpError::TooShort(2)));
        // A string element (`HSET h a 1`): not a bucket of this layout.
        let mut lp = vec![0, 0, 0, 0, 2, 0, 0x81, b'a', 2, 1, 1, 0xFF];
        let total = lp.len() as u32;
        lp[0..4].copy_from_slice(&total.to_le_bytes());
        let mut payload = vec![RDB_TYPE_HASH_LISTPACK];
        rdb_length(&mut payload, lp.len() as u64);
        payload.extend_from_slice(&lp);
        payload.extend_from_slice(&10u16.to_le_bytes());
        let crc = CRC.checksum(&payload);
        payload.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            read_hash_dump(&payload),
            Err(DumpError::Malformed(_))
        ));
        assert!(
            lzf_decompress(&[0x20, 0x00], 2).is_err(),
            "a reference before the start"
        );
        assert!(
            lzf_decompress(&[0x01, b'a'], 2).is_err(),
            "a literal run past the input"
        );
    }

    #[test]
    fn bucket_sizes_and_length_prefixes() {
        let f = DumpFormat { rdb_version: 10 };
        let pairs: Vec<(i64, i64)> = (0..400).map(|i| (i64::MIN + i, 200_000_000 + i)).collect();
        let p = f.hash_payload(&pairs).unwrap();
        // 16 B per entry + 7: a 14-bit RDB length (2 bytes).
        assert_eq!(p.len(), 1 + 2 + (16 * 400 + 7) + 2 + 8);
        assert_eq!(p[1] & 0xC0, 0x40);
        let big: Vec<(i64, i64)> = (0..2000).map(|i| (i64::MAX - i, i)).collect();
        let p = f.hash_payload(&big).unwrap();
        assert_eq!(p[1], 0x80, "a 32-bit RDB length past 16 KiB");
        assert_eq!(
            f.hash_payload(&[(5, 1), (5, 2)]),
            Err(DumpError::DuplicateField(5))
        );
    }
}
