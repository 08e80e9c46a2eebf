//! The generator's behaviour: defaults, check digits, bijections, values that normalise and
//! look real, distinct members, non-members never listed, expiries, determinism, the file
//! formats, bad flags.

use std::collections::{HashMap, HashSet};
use std::io::Read;

use super::generator::*;
use super::output::HEADER;
use super::perm::*;
use super::values::*;
use super::*;
use namelist::domain::{IpValue, ListName, Sandbox, Value};

const NOW: i64 = 1_780_000_000_000;

fn opts(rows: u64) -> Args {
    Args {
        rows,
        now_ms: Some(NOW),
        quiet: true,
        ..Args::default()
    }
}

fn members(opts: &Args) -> Vec<(String, Dimension, String, String, RowExpiry)> {
    let mut g = Generator::new(opts).unwrap();
    (0..opts.rows)
        .map(|_| {
            let r = g.member().unwrap();
            (
                r.list.to_owned(),
                r.dimension.clone(),
                r.value.to_owned(),
                r.sandbox.to_owned(),
                r.expiry,
            )
        })
        .collect()
}

#[test]
fn defaults_match_the_cli() {
    let a = Args::default();
    assert_eq!(a.rows, 1000);
    assert_eq!(a.seed, DEFAULT_SEED);
    assert_eq!(a.lists, ["black", "grey"]);
    assert_eq!(a.sandboxes, ["default", "loan", "pay"]);
    assert_eq!(a.mix, DEFAULT_MIX);
    assert_eq!(a.non_member_rows, 100_000);
    assert_eq!(a.format, Format::Csv);
}

#[test]
fn luhn_and_id_card_check_digits() {
    assert_eq!(luhn_check_digit(b"49015420323751"), b'8');
    assert_eq!(luhn_check_digit(b"35209900176148"), b'1');
    assert_eq!(luhn_check_digit(b"0000000000000"), b'0');
    assert_eq!(id_card_check_char(b"11010519491231002"), b'X');
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(ID_FIRST_DAY), (1950, 1, 1));
    assert_eq!(civil_from_days(ID_FIRST_DAY + ID_DAYS as i64), (2008, 1, 1));
}

#[test]
fn perm_is_a_bijection() {
    for size in [1u64, 2, 3, 7, 64, 100, 1000, 4097] {
        let p = Perm::new(size, key_for(7, "x"));
        let seen: HashSet<u64> = (0..size).map(|i| p.apply(i)).collect();
        assert_eq!(seen.len() as u64, size);
        assert!(seen.iter().all(|&v| v < size));
    }
}

#[test]
fn every_value_normalises_and_looks_real() {
    let o = Args {
        mix: "phone=1,device=1,uid=1,imei=1,ip=3,wifi_mac=1,id_card=1,merchant=1,shop=1".into(),
        cidr_share: 0.3,
        ..opts(30_000)
    };
    let mut g = Generator::new(&o).unwrap();
    let mut seen = HashSet::new();
    let mut check = |d: &Dimension, raw: &str, member: bool| {
        let v = if member {
            Value::parse_entry(d, raw)
        } else {
            Value::parse_check(d, raw)
        }
        .unwrap_or_else(|e| panic!("{d} {raw:?}: {e}"));
        let n = v.to_string();
        match d {
            Dimension::Phone => {
                let digits = n.strip_prefix("+86").unwrap_or(&n);
                assert_eq!(digits.len(), 11, "{raw}");
                assert!(digits.starts_with('1') && (b'3'..=b'9').contains(&digits.as_bytes()[1]));
            }
            Dimension::Imei => {
                // Rules 2 key an IMEI by its 14-digit body, once its Luhn digit passed.
                assert_eq!(n.len(), 14, "{raw}");
                let digits: Vec<u8> = raw.bytes().filter(u8::is_ascii_digit).collect();
                assert_eq!(luhn_check_digit(&digits[..14]), digits[14], "{raw}");
            }
            Dimension::IdCard => {
                assert_eq!(n.len(), 18, "{raw}");
                assert_eq!(id_card_check_char(&n.as_bytes()[..17]), n.as_bytes()[17]);
            }
            Dimension::WifiMac => assert_eq!(n.len(), 17),
            Dimension::Ip => {
                let ip = v.as_ip().unwrap();
                if ip.is_range() {
                    let p = ip.prefix();
                    match ip.family() {
                        namelist::domain::IpFamily::V4 => assert!((16..=28).contains(&p)),
                        namelist::domain::IpFamily::V6 => assert!((32..=64).contains(&p)),
                    }
                }
            }
            Dimension::Custom(_) => assert!(!n.is_ascii(), "{raw}"),
            _ => {}
        }
        seen.insert(d.clone());
    };
    for _ in 0..o.rows {
        let r = g.member().unwrap();
        check(r.dimension, r.value, true);
    }
    for _ in 0..10_000 {
        let r = g.non_member().unwrap();
        check(r.dimension, r.value, false);
    }
    // Every dimension came up.
    assert_eq!(seen.len(), 9);
}

#[test]
fn members_are_distinct() {
    let o = Args {
        cidr_share: 0.5,
        ..opts(200_000)
    };
    let rows = members(&o);
    let mut distinct = HashSet::with_capacity(rows.len());
    for (_, d, raw, _, _) in &rows {
        let v = Value::parse_entry(d, raw).unwrap();
        // Distinct per dimension, whatever the list and sandbox.
        assert!(distinct.insert((d.clone(), v)), "{d} {raw:?} repeated");
    }
    assert_eq!(distinct.len(), 200_000);
}

#[test]
fn non_members_are_never_listed() {
    let o = Args {
        mix: "ip=60,phone=10,imei=10,wifi_mac=10,merchant=10".into(),
        cidr_share: 0.5,
        non_member_rows: 60_000,
        ..opts(60_000)
    };
    let mut g = Generator::new(&o).unwrap();
    let mut listed = HashSet::new();
    let mut ranges: HashSet<IpValue> = HashSet::new();
    let mut singles = Vec::new();
    for _ in 0..o.rows {
        let r = g.member().unwrap();
        let v = Value::parse_entry(r.dimension, r.value).unwrap();
        if let Some(ip) = v.as_ip() {
            if ip.is_range() {
                ranges.insert(*ip);
            } else {
                singles.push(*ip);
            }
        }
        listed.insert((r.dimension.clone(), v));
    }
    assert!(ranges.len() > 10_000, "{}", ranges.len());
    let prefixes: HashSet<_> = ranges.iter().map(|r| (r.family(), r.prefix())).collect();
    let in_range = |ip: &IpValue| {
        prefixes
            .iter()
            .any(|&(f, p)| f == ip.family() && ranges.contains(&ip.within(p)))
    };
    // Single-address members stay out of the range blocks too.
    assert!(!singles.iter().any(in_range));
    for _ in 0..o.non_member_rows {
        let r = g.non_member().unwrap();
        let v = Value::parse_check(r.dimension, r.value).unwrap();
        assert!(
            !listed.contains(&(r.dimension.clone(), v.clone())),
            "{} {:?} is a member",
            r.dimension,
            r.value
        );
        if let Some(ip) = v.as_ip() {
            assert!(!in_range(ip), "{} is inside a member range", r.value);
        }
    }
    assert!(g.member().is_err(), "members after non-members");
}

#[test]
fn no_non_member_is_in_a_segment_or_at_a_domain() {
    let o = Args {
        mix: "phone=1,email=1".into(),
        segment_share: 0.3,
        domain_share: 0.3,
        non_member_rows: 60_000,
        ..opts(60_000)
    };
    let mut g = Generator::new(&o).unwrap();
    let mut listed = HashSet::new();
    let (mut segments, mut domains) = (HashSet::new(), HashSet::new());
    for _ in 0..o.rows {
        let r = g.member().unwrap();
        let v = Value::parse_entry(r.dimension, r.value)
            .unwrap_or_else(|e| panic!("{} {:?}: {e}", r.dimension, r.value));
        match &v {
            Value::PhoneSegment(s) => {
                let digits = s.strip_prefix("+86").unwrap_or(s);
                assert!(
                    digits.starts_with("12") && (4..=8).contains(&digits.len()),
                    "{s}"
                );
                segments.insert(v.clone());
            }
            Value::EmailDomain(d) => {
                assert!(d.ends_with(".example") && d.split('.').count() <= 4, "{d}");
                domains.insert(v.clone());
            }
            Value::Text(t) if *r.dimension == Dimension::Email => {
                assert!(!t.ends_with(".example"), "{t}");
            }
            _ => {}
        }
        assert!(
            listed.insert((r.dimension.clone(), v)),
            "{} {:?} repeated",
            r.dimension,
            r.value
        );
    }
    assert!(segments.len() > 5_000, "{}", segments.len());
    assert!(domains.len() > 5_000, "{}", domains.len());
    let seg_lens: HashSet<usize> = segments.iter().map(|s| s.to_string().len() - 1).collect();
    // 4 to 8 digits after `12`; under rules 2 a segment spelt with or without `+86` is one
    // value (`+8612…*`), so one length per digit count.
    assert!(
        seg_lens.len() >= 5,
        "several segment lengths in use: {seg_lens:?}"
    );
    for _ in 0..o.non_member_rows {
        let r = g.non_member().unwrap();
        let v = Value::parse_check(r.dimension, r.value).unwrap();
        assert!(
            !listed.contains(&(r.dimension.clone(), v.clone())),
            "{}",
            r.value
        );
        // Every probe a check of it would make, for every length.
        for n in 0..=21 {
            for probe in [v.phone_segment(n), v.email_domain_suffix(n)]
                .into_iter()
                .flatten()
            {
                assert!(
                    !segments.contains(&probe) && !domains.contains(&probe),
                    "{} is listed through {probe}",
                    r.value
                );
            }
        }
    }
}

#[test]
fn expiries_are_at_least_an_hour() {
    let rows = members(&opts(50_000));
    let mut kinds = HashMap::new();
    for (.., e) in &rows {
        match *e {
            RowExpiry::Never => {}
            RowExpiry::TtlSeconds(s) => {
                assert!((MIN_EXPIRY_SECS..=MAX_EXPIRY_SECS).contains(&s))
            }
            RowExpiry::ExpiresAtMs(at) => {
                let after = (at - NOW) as u64;
                assert!((MIN_EXPIRY_SECS * 1000..=MAX_EXPIRY_SECS * 1000).contains(&after))
            }
        }
        *kinds.entry(std::mem::discriminant(e)).or_insert(0u32) += 1;
    }
    assert_eq!(kinds.len(), 3);
}

fn run_to_vecs(o: &Args) -> (Vec<u8>, Vec<u8>, Summary) {
    let mut out = Vec::new();
    let mut nm = Vec::new();
    let s = generate(o, &mut out, Some(&mut nm)).unwrap();
    (out, nm, s)
}

#[test]
fn deterministic_for_a_seed() {
    let o = Args {
        non_member_rows: 2_000,
        ..opts(5_000)
    };
    let (a, an, _) = run_to_vecs(&o);
    let (b, bn, _) = run_to_vecs(&o);
    assert_eq!(a, b);
    assert_eq!(an, bn);
    let (c, _, _) = run_to_vecs(&Args { seed: 1, ..o });
    assert_ne!(a, c);
}

#[test]
fn csv_shape() {
    let o = Args {
        non_member_rows: 500,
        ..opts(2_000)
    };
    let (out, nm, summary) = run_to_vecs(&o);
    assert_eq!(summary.rows, 2_000);
    assert_eq!(summary.non_members, 500);
    assert_eq!(
        summary.per_dimension.iter().map(|d| d.1).sum::<u64>(),
        2_000
    );
    for (bytes, n, member) in [(&out, 2_000, true), (&nm, 500, false)] {
        let text = std::str::from_utf8(bytes).unwrap();
        assert_eq!(text.lines().next().unwrap(), CSV_HEADER);
        let mut rdr = csv::Reader::from_reader(bytes.as_slice());
        let mut count = 0;
        for rec in rdr.records() {
            let rec = rec.unwrap();
            assert_eq!(rec.len(), 7);
            ListName::try_from(rec[0].to_owned()).unwrap();
            Sandbox::try_from(rec[3].to_owned()).unwrap();
            let d: Dimension = rec[1].parse().unwrap();
            Value::parse_entry(&d, &rec[2]).unwrap();
            assert!(rec[4].is_empty() || rec[5].is_empty());
            if !member {
                assert!(rec[4].is_empty() && rec[5].is_empty() && rec[6].is_empty());
            }
            count += 1;
        }
        assert_eq!(count, n);
    }
}

#[test]
fn jsonl_and_gzip() {
    let o = Args {
        format: Format::Jsonl,
        gzip: true,
        non_member_rows: 300,
        ..opts(1_000)
    };
    let (out, nm, _) = run_to_vecs(&o);
    let plain = run_to_vecs(&Args {
        gzip: false,
        ..o.clone()
    });
    for (gz, plain, n) in [(out, plain.0, 1_000), (nm, plain.1, 300)] {
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz.as_slice())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text.as_bytes(), plain.as_slice());
        assert_eq!(text.lines().count(), n);
        for line in text.lines() {
            let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
            for k in v.keys() {
                assert!(HEADER.contains(&k.as_str()), "{k}");
            }
            assert!(!(v.contains_key("expires_at") && v.contains_key("ttl_seconds")));
            let d: Dimension = v["dimension"].as_str().unwrap().parse().unwrap();
            Value::parse_entry(&d, v["value"].as_str().unwrap()).unwrap();
        }
    }
}

#[test]
fn bad_flags_are_refused() {
    for o in [
        Args {
            mix: "phone=x".into(),
            ..opts(1)
        },
        Args {
            mix: "Phone=1".into(),
            ..opts(1)
        },
        Args {
            mix: "phone=0".into(),
            ..opts(1)
        },
        Args {
            mix: "phone=1,phone=2".into(),
            ..opts(1)
        },
        Args {
            expiry_mix: "soon=1".into(),
            ..opts(1)
        },
        Args {
            lists: vec!["Black".into()],
            ..opts(1)
        },
        Args {
            sandboxes: vec!["a b".into()],
            ..opts(1)
        },
        Args {
            cidr_share: 1.5,
            ..opts(1)
        },
    ] {
        assert!(Generator::new(&o).is_err(), "{o:?}");
    }
}
