//! The value spaces and their realistic spellings: 11-digit mobile numbers in several
//! notations, Luhn-valid IMEIs, GB 11643 ID cards, MACs under real OUIs in every notation,
//! IPv4/IPv6 addresses and CIDR ranges (in blocks single addresses never use), uids, device
//! ids, and Chinese custom values. A spelling never changes which index a normalised value
//! comes from.

use std::fmt::Write as _;
use std::net::Ipv6Addr;

use rand::Rng;

use super::output::fmt_u64;
use super::perm::{Picker, Prng, Seq, below, chance};

pub(super) const PHONE_SPACE: u64 = 7_000_000_000; // 1[3-9] + 9 digits
pub(super) const IMEI_PREFIXES: [u64; 4] = [35, 86, 1, 49]; // reporting-body digits of real TACs
pub(super) const IMEI_PER_PREFIX: u64 = 1_000_000_000_000; // 12 more digits before the Luhn digit
pub(super) const MAC_OUIS: [[u8; 3]; 16] = [
    [0x00, 0xE0, 0xFC], // Huawei
    [0x48, 0x46, 0xFB], // Huawei
    [0x64, 0x09, 0x80], // Xiaomi
    [0x28, 0x6C, 0x07], // Xiaomi
    [0xF0, 0x18, 0x98], // Apple
    [0x3C, 0x07, 0x54], // Apple
    [0xA4, 0x5E, 0x60], // Apple
    [0x5C, 0x0A, 0x5B], // Samsung
    [0x00, 0x16, 0x32], // Samsung
    [0x50, 0xC7, 0xBF], // TP-Link
    [0xEC, 0x08, 0x6B], // TP-Link
    [0x2C, 0x5B, 0xB8], // OPPO
    [0x88, 0x6A, 0xB1], // vivo
    [0xD8, 0x63, 0x75], // Xiaomi
    [0xDA, 0xA1, 0x19], // randomised (locally administered)
    [0x9E, 0x3B, 0x2F], // randomised (locally administered)
];
pub(super) const ID_REGIONS: [u32; 16] = [
    110101, 110105, 120101, 310101, 310115, 320102, 330106, 350203, 370202, 420106, 440103, 440106,
    440305, 500103, 510107, 610113,
];
/// 1950-01-01, in days since 1970-01-01.
pub(super) const ID_FIRST_DAY: i64 = -7305;
/// Birth dates 1950-01-01 ..= 2007-12-31.
pub(super) const ID_DAYS: u64 = 21_184;
pub(super) const UID_SPACE: u64 = 9_000_000_000; // 10-digit numeric ids
pub(super) const DEVICE_SPACE: u64 = u64::MAX;
pub(super) const CUSTOM_SPACE: u64 = 10_000_000_000; // 10-digit unique suffix
/// Single IPv6 addresses: under these /20s (China Telecom, Unicom, Mobile, CERNET2).
pub(super) const V6_SINGLE_PREFIXES: [u128; 4] = [0x240e0, 0x24088, 0x24098, 0x2402f];
/// IPv6 ranges: inside 3fff::/20.
pub(super) const V6_RANGE_BLOCK: u128 = 0x3fff0;
/// IPv4 ranges: inside 10.0.0.0/8.
pub(super) const V4_RANGE_BLOCK: u32 = 10;
pub(super) const V4_RANGE_PREFIXES: [(u8, u64); 13] = [
    (16, 3),
    (17, 1),
    (18, 1),
    (19, 2),
    (20, 4),
    (21, 3),
    (22, 8),
    (23, 5),
    (24, 45),
    (25, 5),
    (26, 7),
    (27, 6),
    (28, 10),
];
pub(super) const V6_RANGE_PREFIXES: [(u8, u64); 9] = [
    (32, 4),
    (36, 3),
    (40, 5),
    (44, 6),
    (48, 35),
    (52, 5),
    (56, 20),
    (60, 7),
    (64, 15),
];
pub(super) const MERCHANT_BRANDS: &str =
    "华鑫达盛源泰恒信诚德福瑞祥隆兴安康乐美佳新金宏丰永汇嘉创天宇博通明阳光辉海云星";
pub(super) const MERCHANT_TRADES: [&str; 16] = [
    "超市",
    "餐饮",
    "科技",
    "贸易",
    "便利店",
    "药房",
    "数码",
    "服饰",
    "物流",
    "网络",
    "文化",
    "传媒",
    "建材",
    "家居",
    "电器",
    "汽修",
];
pub(super) const CJK_COMMON: &str = "张王李赵刘陈杨黄周吴徐孙马朱胡郭何林罗高北京上海广州深圳杭州成都南京武汉西安重庆天津苏州长沙郑州东南西中山水火木金土花园小大明华文";
pub(super) const REASONS: [&str; 12] = [
    "chargeback",
    "欺诈交易",
    "盗卡",
    "账户盗用",
    "营销作弊 (薅羊毛)",
    "信用卡套现",
    "风控人工复核",
    "多头借贷",
    "设备农场",
    "代理IP",
    "manual review",
    "police notice",
];

pub(super) const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";
pub(super) const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Writes `n` as exactly `dst.len()` zero-padded decimal digits.
pub(super) fn put_digits(dst: &mut [u8], mut n: u64) {
    for d in dst.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

pub(super) fn push_ascii(buf: &mut String, bytes: &[u8]) {
    buf.push_str(std::str::from_utf8(bytes).expect("ASCII"));
}

pub(super) fn push_u64(buf: &mut String, n: u64) {
    let mut b = [0u8; 20];
    push_ascii(buf, fmt_u64(n, &mut b));
}

/// The Luhn check digit of `body` (ASCII digits), as used by IMEIs.
pub fn luhn_check_digit(body: &[u8]) -> u8 {
    let sum: u32 = body
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &c)| {
            let d = u32::from(c - b'0');
            if i % 2 == 0 {
                let d2 = d * 2;
                if d2 > 9 { d2 - 9 } else { d2 }
            } else {
                d
            }
        })
        .sum();
    b'0' + ((10 - sum % 10) % 10) as u8
}

/// The check character of a mainland resident id card (GB 11643) for its first 17 digits:
/// the service's own (rules 2 refuse a card without it).
pub use namelist::domain::rules::id_card_check as id_card_check_char;

/// (year, month, day) of a day number since 1970-01-01 (proleptic Gregorian).
pub(super) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

pub(super) fn write_phone(buf: &mut String, rng: &mut Prng, v: u64) {
    let mut d = [0u8; 11];
    d[0] = b'1';
    d[1] = b'3' + (v / 1_000_000_000) as u8;
    put_digits(&mut d[2..], v % 1_000_000_000);
    let (a, b, c) = (&d[..3], &d[3..7], &d[7..]);
    // plain, +86 3-4-4, 3 4 4, +86plain, +86 3 4 4, (+86) 3-4-4, 3-4-4
    const STYLES: [u64; 7] = [60, 12, 10, 10, 4, 2, 2];
    let mut r = below(rng, 100);
    let mut style = 0;
    while r >= STYLES[style] {
        r -= STYLES[style];
        style += 1;
    }
    let (prefix, sep) = match style {
        0 => ("", ""),
        1 => ("+86 ", "-"),
        2 => ("", " "),
        3 => ("+86", ""),
        4 => ("+86 ", " "),
        5 => ("(+86) ", "-"),
        _ => ("", "-"),
    };
    buf.push_str(prefix);
    push_ascii(buf, a);
    buf.push_str(sep);
    push_ascii(buf, b);
    buf.push_str(sep);
    push_ascii(buf, c);
}

pub(super) fn write_imei(buf: &mut String, rng: &mut Prng, v: u64) {
    let mut d = [0u8; 15];
    put_digits(&mut d[..2], IMEI_PREFIXES[(v / IMEI_PER_PREFIX) as usize]);
    put_digits(&mut d[2..14], v % IMEI_PER_PREFIX);
    d[14] = luhn_check_digit(&d[..14]);
    if chance(rng, 0.1) {
        // The 2-6-6-1 grouping printed on boxes: 35-209900-176148-1.
        push_ascii(buf, &d[..2]);
        buf.push('-');
        push_ascii(buf, &d[2..8]);
        buf.push('-');
        push_ascii(buf, &d[8..14]);
        buf.push('-');
        push_ascii(buf, &d[14..]);
    } else {
        push_ascii(buf, &d);
    }
}

pub(super) fn write_mac(buf: &mut String, rng: &mut Prng, v: u64) {
    let oui = MAC_OUIS[(v >> 24) as usize];
    let bytes = [
        oui[0],
        oui[1],
        oui[2],
        (v >> 16) as u8,
        (v >> 8) as u8,
        v as u8,
    ];
    let style = below(rng, 100);
    let (sep, group, hex) = match style {
        0..35 => (':', 1, HEX_LOWER),
        35..70 => ('-', 1, HEX_UPPER),
        70..85 => ('.', 2, HEX_LOWER),
        85..95 => (':', 1, HEX_UPPER),
        _ => ('\0', 6, HEX_UPPER),
    };
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 && i % group == 0 {
            buf.push(sep);
        }
        buf.push(hex[usize::from(b >> 4)] as char);
        buf.push(hex[usize::from(b & 15)] as char);
    }
}

pub(super) fn write_id_card(buf: &mut String, rng: &mut Prng, v: u64) {
    let per_region = ID_DAYS * 1000;
    let region = ID_REGIONS[(v / per_region) as usize];
    let rem = v % per_region;
    let (y, m, day) = civil_from_days(ID_FIRST_DAY + (rem / 1000) as i64);
    let mut d = [0u8; 18];
    put_digits(&mut d[..6], u64::from(region));
    put_digits(&mut d[6..10], y as u64);
    put_digits(&mut d[10..12], u64::from(m));
    put_digits(&mut d[12..14], u64::from(day));
    put_digits(&mut d[14..17], rem % 1000);
    d[17] = id_card_check_char(&d[..17]);
    if d[17] == b'X' && chance(rng, 0.2) {
        d[17] = b'x';
    }
    push_ascii(buf, &d);
}

pub(super) fn write_uid(buf: &mut String, v: u64) {
    push_u64(buf, 1_000_000_000 + v);
}

pub(super) fn write_device(buf: &mut String, rng: &mut Prng, v: u64) {
    let nib = |x: u64, i: u32| ((x >> (60 - 4 * i)) & 15) as usize;
    if chance(rng, 0.55) {
        // Android ID: 16 lower-case hex digits.
        for i in 0..16 {
            buf.push(HEX_LOWER[nib(v, i)] as char);
        }
    } else {
        // IDFV-style upper-case UUID v4: the index's 16 nibbles at fixed places, random rest.
        let r = rng.next_u64();
        let mut h = [0u8; 32];
        for i in 0..12 {
            h[i as usize] = HEX_UPPER[nib(v, i)];
        }
        h[12] = b'4';
        for i in 0..3 {
            h[13 + i as usize] = HEX_UPPER[nib(r, i)];
        }
        h[16] = b"89AB"[nib(r, 3) & 3];
        for i in 0..3 {
            h[17 + i as usize] = HEX_UPPER[nib(r, 4 + i)];
        }
        for i in 0..4 {
            h[20 + i as usize] = HEX_UPPER[nib(v, 12 + i)];
        }
        for i in 0..8 {
            h[24 + i as usize] = HEX_UPPER[nib(r, 7 + i)];
        }
        push_ascii(buf, &h[..8]);
        buf.push('-');
        push_ascii(buf, &h[8..12]);
        buf.push('-');
        push_ascii(buf, &h[12..16]);
        buf.push('-');
        push_ascii(buf, &h[16..20]);
        buf.push('-');
        push_ascii(buf, &h[20..]);
    }
}

pub(super) fn write_custom(
    buf: &mut String,
    rng: &mut Prng,
    v: u64,
    merchant: bool,
    cjk: &CjkPools,
) {
    if merchant {
        buf.push_str("商户-");
        for _ in 0..2 {
            buf.push(cjk.brands[below(rng, cjk.brands.len() as u64) as usize]);
        }
        buf.push_str(MERCHANT_TRADES[below(rng, MERCHANT_TRADES.len() as u64) as usize]);
    } else {
        for _ in 0..2 + below(rng, 3) {
            buf.push(cjk.common[below(rng, cjk.common.len() as u64) as usize]);
        }
    }
    // The unique part: no CJK character above is a digit or `-`, so it is unambiguous.
    buf.push('-');
    let mut d = [0u8; 10];
    put_digits(&mut d, v);
    push_ascii(buf, &d);
}

pub(super) fn push_v4(buf: &mut String, a: u32) {
    for (i, o) in a.to_be_bytes().iter().enumerate() {
        if i > 0 {
            buf.push('.');
        }
        push_u64(buf, u64::from(*o));
    }
}

pub(super) fn write_v4_single(buf: &mut String, rng: &mut Prng, v: u64, octets: &[u8]) {
    let a = (u32::from(octets[(v >> 24) as usize]) << 24) | (v as u32 & 0x00FF_FFFF);
    if chance(rng, 0.03) {
        buf.push_str("::ffff:");
    }
    push_v4(buf, a);
}

pub(super) fn write_v6_single(buf: &mut String, rng: &mut Prng, v: u64) {
    let prefix = V6_SINGLE_PREFIXES[(v >> 60) as usize];
    let low = u128::from(v & ((1 << 60) - 1));
    let r = u128::from(rng.next_u64());
    let bits = (prefix << 108)
        | ((low >> 32) << 80) // 28 bits of the index under the /20
        | ((r & 0xFFFF) << 64) // random subnet
        | ((r >> 32) << 32) // random upper half of the interface id
        | (low & 0xFFFF_FFFF);
    let start = buf.len();
    write!(buf, "{}", Ipv6Addr::from(bits)).expect("writing to a String");
    if chance(rng, 0.15) {
        buf[start..].make_ascii_uppercase();
    }
}

/// Networks of one prefix length inside a range block.
#[derive(Debug, Clone)]
pub(super) struct RangeClass {
    pub(super) prefix: u8,
    pub(super) seq: Seq,
}

#[derive(Debug, Clone)]
pub(super) struct IpGen {
    pub(super) v4_octets: Vec<u8>,
    pub(super) v4: Seq,
    pub(super) v6: Seq,
    pub(super) v4_ranges: Vec<RangeClass>,
    pub(super) v6_ranges: Vec<RangeClass>,
    pub(super) v4_pick: Picker,
    pub(super) v6_pick: Picker,
}

impl IpGen {
    pub(super) fn new(seed: u64) -> Self {
        let v4_octets: Vec<u8> = (1..=223u8).filter(|&o| o != 10 && o != 127).collect();
        let classes = |block_bits: u8, table: &[(u8, u64)], fam: &str| -> Vec<RangeClass> {
            table
                .iter()
                .map(|&(prefix, _)| RangeClass {
                    prefix,
                    seq: Seq::new(
                        1u64 << (prefix - block_bits),
                        seed,
                        &format!("ip/{fam}/{prefix}"),
                    ),
                })
                .collect()
        };
        Self {
            v4: Seq::new((v4_octets.len() as u64) << 24, seed, "ip/v4"),
            v6: Seq::new((V6_SINGLE_PREFIXES.len() as u64) << 60, seed, "ip/v6"),
            v4_octets,
            v4_ranges: classes(8, &V4_RANGE_PREFIXES, "v4"),
            v6_ranges: classes(20, &V6_RANGE_PREFIXES, "v6"),
            v4_pick: Picker::new(V4_RANGE_PREFIXES.iter().map(|p| p.1)),
            v6_pick: Picker::new(V6_RANGE_PREFIXES.iter().map(|p| p.1)),
        }
    }

    pub(super) fn single(
        &mut self,
        buf: &mut String,
        rng: &mut Prng,
        v6: bool,
    ) -> anyhow::Result<()> {
        if v6 {
            let v = self.v6.take("IPv6 address")?;
            write_v6_single(buf, rng, v);
        } else {
            let v = self.v4.take("IPv4 address")?;
            write_v4_single(buf, rng, v, &self.v4_octets);
        }
        Ok(())
    }

    /// A range, or `false` when every prefix length of the family is used up.
    pub(super) fn range(
        &mut self,
        buf: &mut String,
        rng: &mut Prng,
        v6: bool,
    ) -> anyhow::Result<bool> {
        let (classes, pick) = if v6 {
            (&mut self.v6_ranges, &self.v6_pick)
        } else {
            (&mut self.v4_ranges, &self.v4_pick)
        };
        let first = pick.pick(rng);
        let n = classes.len();
        let Some(c) = (0..n)
            .map(|k| (first + k) % n)
            .find(|&c| classes[c].seq.has_next())
        else {
            return Ok(false);
        };
        let class = &mut classes[c];
        let prefix = class.prefix;
        let net = class.seq.take("IP range")?;
        let host_bits = chance(rng, 0.2);
        if v6 {
            let host_len = 128 - u32::from(prefix);
            let mut bits = (V6_RANGE_BLOCK << 108) | (u128::from(net) << host_len);
            if host_bits {
                let r = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
                bits |= r & ((1u128 << host_len) - 1);
            }
            write!(buf, "{}/{prefix}", Ipv6Addr::from(bits)).expect("writing to a String");
        } else {
            let host_len = 32 - u32::from(prefix);
            let mut bits = (V4_RANGE_BLOCK << 24) | ((net as u32) << host_len);
            if host_bits {
                bits |= rng.next_u32() & ((1u32 << host_len) - 1);
            }
            push_v4(buf, bits);
            buf.push('/');
            push_u64(buf, u64::from(prefix));
        }
        Ok(true)
    }
}

/// Phone segments: per total digit count (4..=8, all under `12`), its own sequence.
#[derive(Debug, Clone)]
pub(super) struct SegmentGen {
    by_len: Vec<(usize, Seq)>,
}

impl SegmentGen {
    pub(super) fn new(seed: u64) -> Self {
        let by_len = (2..=6u32)
            .map(|more| {
                let digits = 2 + more as usize;
                (
                    digits,
                    Seq::new(10u64.pow(more), seed, &format!("segment/{digits}")),
                )
            })
            .collect();
        Self { by_len }
    }

    /// Writes the next segment (`12…*`, spelt with or without `+86`); `false` when every
    /// length is used up.
    pub(super) fn next(&mut self, buf: &mut String, rng: &mut Prng) -> anyhow::Result<bool> {
        let open: Vec<usize> = (0..self.by_len.len())
            .filter(|&i| self.by_len[i].1.has_next())
            .collect();
        if open.is_empty() {
            return Ok(false);
        }
        let (digits, seq) = &mut self.by_len[open[below(rng, open.len() as u64) as usize]];
        let v = seq.take("phone segment")?;
        let mut d = vec![b'0'; *digits];
        d[..2].copy_from_slice(b"12");
        put_digits(&mut d[2..], v);
        match below(rng, 4) {
            0 => buf.push_str("+86 "),
            1 => buf.push_str("+86"),
            _ => {}
        }
        push_ascii(buf, &d);
        buf.push('*');
        Ok(true)
    }
}

/// The domains of generated addresses: real providers, never under `.example`.
const EMAIL_DOMAINS: [&str; 10] = [
    "qq.com",
    "163.com",
    "126.com",
    "gmail.com",
    "sina.com",
    "foxmail.com",
    "outlook.com",
    "yahoo.com.cn",
    "aliyun.com",
    "sohu.com",
];
pub(super) const EMAIL_SPACE: u64 = 10_000_000_000;
const EMAIL_NAMES: [&str; 16] = [
    "wei", "fang", "lei", "jing", "min", "jun", "yan", "tao", "li", "hua", "ming", "xin", "ying",
    "chen", "zhang", "wang",
];
/// Domain entries `d<n>.example` with 0-2 more labels in front.
pub(super) const DOMAIN_SPACE: u64 = 3_000_000_000;

/// An address from index `v`: a name and `v`'s number (so distinct `v`, distinct
/// normalised addresses), at one of `EMAIL_DOMAINS`, spelt with random case, a `+tag`, and at
/// gmail a dot (which gmail ignores).
fn write_email(buf: &mut String, rng: &mut Prng, v: u64) {
    let domain = EMAIL_DOMAINS[(v % EMAIL_DOMAINS.len() as u64) as usize];
    let n = v / EMAIL_DOMAINS.len() as u64;
    let name = EMAIL_NAMES[(n % EMAIL_NAMES.len() as u64) as usize];
    let upper = below(rng, 4) == 0;
    let push = |buf: &mut String, s: &str| {
        if upper {
            buf.push_str(&s.to_ascii_uppercase());
        } else {
            buf.push_str(s);
        }
    };
    push(buf, name);
    if domain == "gmail.com" && below(rng, 2) == 0 {
        buf.push('.');
    }
    push_u64(buf, n);
    if below(rng, 5) == 0 {
        buf.push_str("+promo");
    }
    buf.push('@');
    push(buf, domain);
}

/// A domain entry from index `v`: `@d<n>.example`, `@mx.d<n>.example` or `@a.mx.d<n>.example`.
pub(super) fn write_email_domain(buf: &mut String, rng: &mut Prng, v: u64) {
    buf.push('@');
    buf.push_str(["", "mx.", "a.mx."][(v % 3) as usize]);
    buf.push(if below(rng, 4) == 0 { 'D' } else { 'd' });
    push_u64(buf, v / 3);
    buf.push_str(".example");
}

#[derive(Debug, Clone)]
pub(super) enum Kind {
    Phone,
    Email,
    IdCard,
    Imei,
    WifiMac,
    Uid,
    Device,
    Ip(Box<IpGen>),
    Custom { merchant: bool },
}

#[derive(Debug, Clone)]
pub(super) struct CjkPools {
    pub(super) brands: Vec<char>,
    pub(super) common: Vec<char>,
}

pub(super) fn write_value(buf: &mut String, rng: &mut Prng, kind: &Kind, v: u64, cjk: &CjkPools) {
    match kind {
        Kind::Phone => write_phone(buf, rng, v),
        Kind::Email => write_email(buf, rng, v),
        Kind::IdCard => write_id_card(buf, rng, v),
        Kind::Imei => write_imei(buf, rng, v),
        Kind::WifiMac => write_mac(buf, rng, v),
        Kind::Uid => write_uid(buf, v),
        Kind::Device => write_device(buf, rng, v),
        Kind::Custom { merchant } => write_custom(buf, rng, v, *merchant, cjk),
        Kind::Ip(_) => unreachable!("ip values are written by IpGen"),
    }
}
