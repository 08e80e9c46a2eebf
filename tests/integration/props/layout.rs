//! Sections 2 and 3 of the properties: the field of an entry is a signed decimal i64; its
//! bucket is in 0..N, and N = ceil(entries / 200) (the layout's mean fill; the issue allows at
//! most 400). Both as the layout formats document them: format 2 (keyed, `store::fingerprint`)
//! and format 1 (unkeyed xxh3_64 field, crc32 bucket).

use namelist::store::layout::{Layout, canonical};
use namelist::store::{FingerprintKey, Hashing};
use proptest::prelude::*;

use super::config;
use super::forms::random_entry;

/// Key material of the keyed layout (as hex in a key file).
const KEY: &str = "00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210";

/// Format 2's (bucket, field), from the documented derivation alone: subkey = the first 16
/// bytes of SHA-256("namelist fingerprint v1" 0 "entry" 0 key); SipHash-2-4-128 of the
/// canonical bytes; field = the low 64 bits, bucket = the high 64 bits mod N.
fn keyed_oracle(bytes: &[u8], buckets: u32) -> (u32, i64) {
    use sha2::Digest;
    let material: Vec<u8> = (0..KEY.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&KEY[i..i + 2], 16).unwrap())
        .collect();
    let mut h = sha2::Sha256::new();
    h.update(b"namelist fingerprint v1\0entry\0");
    h.update(&material);
    let digest = h.finalize();
    let mut k = [0u8; 16];
    k.copy_from_slice(&digest[..16]);
    let out = siphasher::sip128::SipHasher24::new_with_key(&k).hash(bytes);
    ((out.h2 % u64::from(buckets)) as u32, out.h1 as i64)
}

/// Format 1's (bucket, field): crc32 % N, xxh3_64.
fn unkeyed_oracle(bytes: &[u8], buckets: u32) -> (u32, i64) {
    (
        crc32fast::hash(bytes) % buckets,
        xxhash_rust::xxh3::xxh3_64(bytes) as i64,
    )
}

type Oracle = fn(&[u8], u32) -> (u32, i64);

/// Both layouts of `buckets` buckets, each with its oracle.
fn layouts(prefix: &str, buckets: u32) -> [(Layout, Oracle); 2] {
    let key = FingerprintKey::from_hex(KEY, "props").unwrap();
    [
        (
            Layout::new(prefix, buckets, Hashing::Keyed(key)),
            keyed_oracle as Oracle,
        ),
        (
            Layout::new(prefix, buckets, Hashing::Unkeyed),
            unkeyed_oracle as Oracle,
        ),
    ]
}

/// The mean bucket fill the bucket count is sized for.
const FILL: u64 = 200;

fn bucket_count() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(1u32),
        Just(2),
        Just(u32::MAX),
        1u32..=16,
        1u32..=100_000,
        1u32..=u32::MAX,
    ]
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn field_is_the_format_hash_as_a_signed_decimal_i64(
        (list, dim, sandbox, value) in random_entry(),
        buckets in bucket_count(),
    ) {
        let bytes = canonical(&list, &dim, &sandbox, &value);
        let expected = format!("{list}\n{dim}\n{sandbox}\n{value}");
        prop_assert_eq!(
            bytes.as_slice(),
            expected.as_bytes(),
            "canonical bytes are <list> \\n <dimension> \\n <sandbox> \\n <value>"
        );
        for (layout, oracle) in layouts("nl:", buckets) {
        let key = layout.entry_key(&list, &dim, &sandbox, &value);
        let hash = oracle(&bytes, buckets).1 as u64;
        prop_assert_eq!(key.field, hash as i64, "field of {:?} in format {} is the format's 64-bit hash as i64", expected, layout.format());

        let args = redis::ToRedisArgs::to_redis_args(&key.field);
        prop_assert_eq!(args.len(), 1, "field {} should be one Redis argument, got {:?}", key.field, args);
        let arg = &args[0];
        let text = std::str::from_utf8(arg);
        prop_assert!(text.is_ok(), "field {} argument {:?} is not UTF-8", key.field, arg);
        let text = text.unwrap_or_default();
        let digits = text.strip_prefix('-').unwrap_or(text);
        prop_assert!(
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
            "field argument {:?} should be -?[0-9]+", text
        );
        prop_assert!(
            digits == "0" || !digits.starts_with('0'),
            "field argument {:?} has a leading zero (Redis would keep it a string)", text
        );
        prop_assert!(text != "-0", "field argument is -0");
        prop_assert!(text.len() <= 20, "field argument {:?} is longer than 20 bytes", text);
        prop_assert_eq!(text.parse::<i64>().ok(), Some(key.field), "field argument {:?} parses back", text);

        let fingerprint = key.fingerprint();
        prop_assert_eq!(fingerprint.len(), 16, "fingerprint {:?} is 16 hex digits", fingerprint);
        prop_assert_eq!(
            u64::from_str_radix(&fingerprint, 16).ok(),
            Some(hash),
            "fingerprint {:?} is the unsigned hash in hex", fingerprint
        );
        }
    }

    #[test]
    fn bucket_is_the_format_hash_mod_n_and_in_range(
        (list, dim, sandbox, value) in random_entry(),
        buckets in bucket_count(),
    ) {
        let bytes = canonical(&list, &dim, &sandbox, &value);
        for (layout, oracle) in layouts("nl:", buckets) {
            let key = layout.entry_key(&list, &dim, &sandbox, &value);
            prop_assert!(key.bucket < buckets, "bucket {} out of range for N = {}", key.bucket, buckets);
            prop_assert_eq!(
                key.bucket,
                oracle(&bytes, buckets).0,
                "bucket of {:?} with N = {} in format {}", String::from_utf8_lossy(&bytes), buckets, layout.format()
            );
            prop_assert_eq!(layout.key_of(&bytes), key, "key_of(canonical) == entry_key");
            prop_assert_eq!(layout.bucket_key(key.bucket), format!("nl:b:{}", key.bucket), "bucket key name");
        }
    }

    #[test]
    fn key_of_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300), buckets in bucket_count()) {
        for (layout, oracle) in layouts("p:", buckets) {
            let key = layout.key_of(&bytes);
            prop_assert!(key.bucket < buckets, "bucket {} out of range for N = {}", key.bucket, buckets);
            prop_assert_eq!((key.bucket, key.field), oracle(&bytes, buckets), "format {}", layout.format());
        }
    }

    #[test]
    fn buckets_for_keeps_mean_fill_at_most_the_fill(
        expected in prop_oneof![
            Just(0u64),
            Just(FILL),
            Just(401),
            Just(FILL * u64::from(u32::MAX)),
            Just(FILL * u64::from(u32::MAX) + 1),
            Just(u64::MAX),
            0u64..=5_000,
            0u64..=FILL * u64::from(u32::MAX),
            any::<u64>(),
        ],
    ) {
        let n = Layout::buckets_for(expected);
        let ceil = u128::from(expected).div_ceil(u128::from(FILL)).max(1);
        if ceil <= u128::from(u32::MAX) {
            prop_assert_eq!(u128::from(n), ceil, "buckets_for({}) == max(1, ceil({} / 200))", expected, expected);
            prop_assert!(
                u128::from(expected) <= u128::from(FILL) * u128::from(n),
                "buckets_for({}) = {}: mean fill {} > 200", expected, n, expected / u64::from(n)
            );
            prop_assert!(
                n == 1 || u128::from(expected) > u128::from(FILL) * u128::from(n - 1),
                "buckets_for({}) = {} is not the fewest buckets", expected, n
            );
        } else {
            prop_assert_eq!(n, u32::MAX, "buckets_for({}) saturates at u32::MAX", expected);
        }
    }
}
