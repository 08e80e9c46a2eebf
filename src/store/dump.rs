//! Client-side bucket serialisation for `RESTORE`: the bulk-load path of `namelist-tools
//! import` for buckets that do not exist yet.
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
