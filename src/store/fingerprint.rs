//! Keyed fingerprints: the secret fingerprint key, and the one place where a value (or any
//! bytes derived from one) is hashed into something that leaves the process: a bucket number
//! and field in Redis, the fingerprint in logs and the audit trail, a velocity entity's key, a
//! COUNT_DISTINCT member, an event-id hash.
//!
//! Invariant: in a keyed keyspace (layout format 2) none of those can be computed without the
//! key. An unkeyed hash of a phone number *is* the phone number: ~10^11 candidates (minutes on
//! one core), and 10^4 once the audit trail's mask (`138****5678`) is known. With the key,
//! each is a pseudo-random function of its input, and a dump of Redis, a log file or an audit
//! record gives nothing back to someone who lacks the key. The unkeyed format 1 (xxh3-64,
//! crc32, xxh3-128) is still read, so existing keyspaces keep working (said loudly at every
//! start-up), and still created where `NAMELIST_ALLOW_UNKEYED=true` permits it.
//!
//! # The key file
//! `NAMELIST_FINGERPRINT_KEY_FILE` names a file holding at least 32 random bytes as hex text
//! (64+ hex digits; surrounding whitespace ignored), as `namelist-tools keygen --out FILE`
//! writes it (mode 0600, never overwriting) or `openssl rand -hex 32` prints it. A file that
//! every user of the machine may read is refused (0600, or 0440 with a dedicated group as a
//! Kubernetes Secret mounted with `fsGroup` gives, are fine), and so is a key of one repeated
//! byte (a placeholder, not a key).
//!
//! # Derivation
//! The file's bytes are never used directly: each use has its own 128-bit subkey, the first
//! 16 bytes of `SHA-256("namelist fingerprint v1" 0x00 label 0x00 key)`, so the uses are
//! independent (equal outputs in two of them say nothing about their inputs) and the key id
//! recorded in `<prefix>meta` (labelled `key-id`, 64 bits in hex) identifies the key without
//! revealing anything about the others.
//!
//! | label | PRF | input | output |
//! |---|---|---|---|
//! | `entry` | SipHash-2-4, 128-bit | canonical entry bytes (`layout`) | low 64 bits: the field (and fingerprint); high 64 bits mod N: the bucket |
//! | `metric-entity` | SipHash-2-4, 128-bit | metric id, version, group-by values | 96 bits: the entity key `<prefix>v{…}` |
//! | `distinct-member` | SipHash-2-4, 64-bit | the counted value | the COUNT_DISTINCT member |
//! | `event` | SipHash-2-4, 64-bit | event type and id | what an entity remembers of an applied event |
//! | `import-input` | SipHash-2-4, 64-bit | the first MiB of an import's input | its identity in the import checkpoint (a small input is a few rows) |
//! | `audit-value` | SipHash-2-4, 64-bit | dimension and normalised value (`layout::Layout::audit_value`), without list or sandbox | an audit record's `vfp`, the term the trail's index finds a value by |
//!
//! # Why SipHash-2-4
//! It is a PRF with a 128-bit key designed for short inputs, which these are (30–70 bytes).
//! Measured over the canonical bytes of a 7-dimension subject (`benches/normalise.rs`,
//! `fingerprint/*`; docs/performance.md, *Latency*): SipHash-2-4 with 128-bit output 206–252 ns, keyed
//! BLAKE3 647–709 ns, the unkeyed xxh3-64 + crc32 of format 1 110–126 ns. BLAKE3 pays for a
//! 64-byte block compression per input; its speed shows on long inputs only.

use std::path::Path;
use std::sync::Arc;

use secrecy::zeroize::Zeroize;
use sha2::{Digest, Sha256};
use siphasher::sip::SipHasher24 as Sip64;
use siphasher::sip128::SipHasher24 as Sip128;
use xxhash_rust::xxh3::{xxh3_64, xxh3_128};

/// The layout format of an unkeyed keyspace (xxh3-64 fields, crc32 buckets).
pub const FORMAT_UNKEYED: u32 = 1;
/// The layout format of a keyed keyspace (SipHash-2-4 under the fingerprint key).
pub const FORMAT_KEYED: u32 = 2;
/// The least key material accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;
/// The key material `keygen` writes, in bytes.
pub const NEW_KEY_BYTES: usize = 32;

/// Why a fingerprint key could not be read or written. The key itself is never in a message.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("fingerprint key file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "fingerprint key file {path} is readable by every user of this machine (mode {mode:03o}): \
         chmod 600 it (or 0440 with a dedicated group, as a Kubernetes Secret mounted with fsGroup)"
    )]
    Exposed { path: String, mode: u32 },
    #[error(
        "fingerprint key file {path}: {reason}; it must hold at least {} hex digits ({MIN_KEY_BYTES} random bytes), \
         as `namelist-tools keygen --out FILE` writes",
        2 * MIN_KEY_BYTES
    )]
    Malformed { path: String, reason: String },
    #[error(
        "{path} already exists: refusing to overwrite a fingerprint key (a keyspace can never be read again without the key it was made with)"
    )]
    Exists { path: String },
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

/// The secret fingerprint key, as the subkeys derived from it (see the module docs). Cheap to
/// clone; `Debug` shows its id and where it came from, never the key.
#[derive(Clone)]
pub struct FingerprintKey(Arc<Subkeys>);

struct Subkeys {
    entry: [u8; 16],
    metric: [u8; 16],
    member: [u8; 16],
    event: [u8; 16],
    input: [u8; 16],
    audit_value: [u8; 16],
    /// 16 hex digits: what `<prefix>meta` records.
    id: String,
    /// Where the key came from, for messages (a path, or how it was made).
    source: String,
}

impl Drop for Subkeys {
    fn drop(&mut self) {
        for k in [
            &mut self.entry,
            &mut self.metric,
            &mut self.member,
            &mut self.event,
            &mut self.input,
            &mut self.audit_value,
        ] {
            k.zeroize();
        }
    }
}

fn derive(key: &[u8], label: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"namelist fingerprint v1\0");
    h.update(label.as_bytes());
    h.update([0]);
    h.update(key);
    h.finalize().into()
}

fn subkey(key: &[u8], label: &str) -> [u8; 16] {
    let mut full = derive(key, label);
    let mut out = [0; 16];
    out.copy_from_slice(&full[..16]);
    full.zeroize();
    out
}

fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl FingerprintKey {
    /// The key made of `material` (at least [`MIN_KEY_BYTES`] bytes); `source` says where it
    /// came from in messages.
    pub fn from_bytes(material: &[u8], source: impl Into<String>) -> Result<Self, KeyError> {
        let source = source.into();
        if material.len() < MIN_KEY_BYTES {
            return Err(KeyError::Malformed {
                path: source,
                reason: format!("{} bytes of key", material.len()),
            });
        }
        if material.iter().all(|b| *b == material[0]) {
            return Err(KeyError::Malformed {
                path: source,
                reason: "one byte repeated, a placeholder rather than a random key".into(),
            });
        }
        let mut id = derive(material, "key-id");
        let key = Self(Arc::new(Subkeys {
            entry: subkey(material, "entry"),
            metric: subkey(material, "metric-entity"),
            member: subkey(material, "distinct-member"),
            event: subkey(material, "event"),
            input: subkey(material, "import-input"),
            audit_value: subkey(material, "audit-value"),
            id: to_hex(&id[..8]),
            source,
        }));
        id.zeroize();
        Ok(key)
    }

    /// The key written as hex text (whitespace around it ignored).
    pub fn from_hex(text: &str, source: impl Into<String>) -> Result<Self, KeyError> {
        let source = source.into();
        let malformed = |reason: &str| KeyError::Malformed {
            path: source.clone(),
            reason: reason.to_owned(),
        };
        let text = text.trim();
        if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed(
                "not hex text (an even number of the digits 0-9, a-f)",
            ));
        }
        let mut material: Vec<u8> = (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("checked hex digits"))
            .collect();
        let key = Self::from_bytes(&material, source.clone());
        material.zeroize();
        key
    }

    /// Reads a key file (see the module docs for its format and permissions).
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let io = |source| KeyError::Io {
            path: shown.clone(),
            source,
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
            if mode & 0o004 != 0 {
                return Err(KeyError::Exposed { path: shown, mode });
            }
        }
        let mut text = std::fs::read_to_string(path).map_err(io)?;
        let key = Self::from_hex(&text, shown.clone());
        text.zeroize();
        key
    }

    /// A new random key, kept in memory only (the embedded store without a snapshot).
    pub fn generate(source: impl Into<String>) -> Result<Self, KeyError> {
        let mut material = random_material()?;
        let key = Self::from_bytes(&material, source);
        material.zeroize();
        key
    }

    /// Makes a new random key and writes it to `path` as hex text, mode 0600; never replaces
    /// an existing file.
    pub fn create_file(path: &Path) -> Result<Self, KeyError> {
        use std::io::Write;
        let shown = path.display().to_string();
        let mut material = random_material()?;
        let mut text = to_hex(&material);
        text.push('\n');
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let written = options
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()));
        let key = match written {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(KeyError::Exists { path: shown })
            }
            Err(source) => Err(KeyError::Io {
                path: shown,
                source,
            }),
            Ok(()) => Self::from_bytes(&material, shown),
        };
        material.zeroize();
        text.zeroize();
        key
    }

    /// The key's identity: 16 hex digits of a keyed hash of a fixed label. Safe to show and
    /// store; says nothing about the key.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Where the key came from (a path, or how it was made).
    pub fn source(&self) -> &str {
        &self.0.source
    }
}

fn random_material() -> Result<Vec<u8>, KeyError> {
    use rand::TryRng;
    let mut material = vec![0; NEW_KEY_BYTES];
    rand::rngs::SysRng
        .try_fill_bytes(&mut material)
        .map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(material)
}

impl std::fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintKey")
            .field("id", &self.0.id)
            .field("source", &self.0.source)
            .finish_non_exhaustive()
    }
}

/// Keys are equal when their ids are (ids are public: no need for constant time).
impl PartialEq for FingerprintKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for FingerprintKey {}

/// How a keyspace turns values into what it stores: its layout format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hashing {
    /// Format 1: unkeyed xxh3 and crc32. Anyone can recompute every field from a candidate
    /// value.
    Unkeyed,
    /// Format 2: SipHash-2-4 under subkeys of the fingerprint key.
    Keyed(FingerprintKey),
}

impl Hashing {
    /// The layout format recorded in `<prefix>meta`.
    pub fn format(&self) -> u32 {
        match self {
            Hashing::Unkeyed => FORMAT_UNKEYED,
            Hashing::Keyed(_) => FORMAT_KEYED,
        }
    }

    /// The key's id, for a keyed keyspace.
    pub fn key_id(&self) -> Option<&str> {
        match self {
            Hashing::Unkeyed => None,
            Hashing::Keyed(k) => Some(k.id()),
        }
    }

    /// The (bucket in `0..buckets`, field) of an entry's canonical bytes.
    #[inline]
    pub fn entry(&self, canonical: &[u8], buckets: u32) -> (u32, i64) {
        match self {
            Hashing::Unkeyed => (
                crc32fast::hash(canonical) % buckets,
                xxh3_64(canonical) as i64,
            ),
            Hashing::Keyed(k) => {
                let h = Sip128::new_with_key(&k.0.entry).hash(canonical);
                ((h.h2 % u64::from(buckets)) as u32, h.h1 as i64)
            }
        }
    }

    /// 96 bits identifying a velocity entity (metric, version, group-by values).
    pub fn metric_entity(&self, bytes: &[u8]) -> u128 {
        match self {
            Hashing::Unkeyed => xxh3_128(bytes) >> 32,
            Hashing::Keyed(k) => u128::from(Sip128::new_with_key(&k.0.metric).hash(bytes)) >> 32,
        }
    }

    /// A COUNT_DISTINCT member: 64 bits standing for the counted value.
    pub fn distinct_member(&self, value: &[u8]) -> i64 {
        match self {
            Hashing::Unkeyed => xxh3_64(value) as i64,
            Hashing::Keyed(k) => Sip64::new_with_key(&k.0.member).hash(value) as i64,
        }
    }

    /// What an entity remembers of an applied event: 64 bits of its type and id.
    pub fn event(&self, bytes: &[u8]) -> i64 {
        match self {
            Hashing::Unkeyed => xxh3_64(bytes) as i64,
            Hashing::Keyed(k) => Sip64::new_with_key(&k.0.event).hash(bytes) as i64,
        }
    }

    /// The identity of an import's input (its first bytes) in the import checkpoint.
    pub fn import_input(&self, head: &[u8]) -> u64 {
        match self {
            Hashing::Unkeyed => xxh3_64(head),
            Hashing::Keyed(k) => Sip64::new_with_key(&k.0.input).hash(head),
        }
    }

    /// An audit record's value fingerprint (`vfp`): 64 bits of the dimension and normalised
    /// value alone, so the same value has the same one in every list and sandbox.
    pub fn audit_value(&self, bytes: &[u8]) -> u64 {
        match self {
            Hashing::Unkeyed => xxh3_64(bytes),
            Hashing::Keyed(k) => Sip64::new_with_key(&k.0.audit_value).hash(bytes),
        }
    }
}

/// What a keyspace's meta (or an embedded snapshot) records about its hashing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedHashing {
    pub format: u32,
    /// The key id, in format 2.
    pub key_id: Option<String>,
}

/// How an existing keyspace is opened with the configured key (`None`: none configured).
/// `Ok((hashing, loud))`: `loud` is the line to log at ERROR at every start-up (an unkeyed
/// keyspace). `Err`: why it must not be opened, for an operator. `place` names the keyspace
/// (`keyspace nl:`, `snapshot /x/lists.snapshot`).
pub fn open_recorded(
    recorded: &RecordedHashing,
    key: Option<&FingerprintKey>,
    place: &str,
) -> Result<(Hashing, Option<String>), String> {
    match (recorded.format, recorded.key_id.as_deref(), key) {
        (FORMAT_UNKEYED, _, key) => {
            let ignored = key.map_or(String::new(), |k| {
                format!(
                    " The configured fingerprint key ({}, key id {}) is NOT used: entries already stored unkeyed cannot be re-keyed in place.",
                    k.source(),
                    k.id()
                )
            });
            Ok((
                Hashing::Unkeyed,
                Some(format!(
                    "UNKEYED FINGERPRINTS: {place} is layout format 1, whose fields, buckets and fingerprints are unkeyed hashes: \
                     anyone with a Redis dump, a log or the audit trail can recover phone and ID card numbers by brute force.{ignored} \
                     Rebuild it keyed: docs/operations.md, *Rotating the key* (import into a new key prefix with a key)"
                )),
            ))
        }
        (FORMAT_KEYED, None | Some(""), _) => Err(format!(
            "{place} is keyed (layout format 2) but records no key id"
        )),
        (FORMAT_KEYED, Some(recorded_id), None) => Err(format!(
            "{place} is keyed (layout format 2, key id {recorded_id}) and no fingerprint key is configured: \
             set NAMELIST_FINGERPRINT_KEY_FILE to the key file it was created with"
        )),
        (FORMAT_KEYED, Some(recorded_id), Some(k)) if recorded_id != k.id() => Err(format!(
            "{place} was created with the fingerprint key of id {recorded_id}, but the configured key ({}) has id {}: \
             key ids differ. Configure the key the keyspace was made with; to change keys, import into a new key \
             prefix with the new key (docs/operations.md, *Rotating the key*)",
            k.source(),
            k.id()
        )),
        (FORMAT_KEYED, Some(_), Some(k)) => Ok((Hashing::Keyed(k.clone()), None)),
        (other, _, _) => Err(format!(
            "{place} records layout format {other}; this build knows formats {FORMAT_UNKEYED} and {FORMAT_KEYED} only: \
             use a matching build or another key prefix"
        )),
    }
}

/// The hashing of a keyspace about to be created: keyed with the configured key; without
/// one, unkeyed only if `allow_unkeyed` (with its loud line), else `Err` with how to make a key.
pub fn for_new_keyspace(
    key: Option<&FingerprintKey>,
    allow_unkeyed: bool,
    place: &str,
) -> Result<(Hashing, Option<String>), String> {
    match key {
        Some(k) => Ok((Hashing::Keyed(k.clone()), None)),
        None if allow_unkeyed => Ok((
            Hashing::Unkeyed,
            Some(format!(
                "UNKEYED FINGERPRINTS: {place} is created in layout format 1 because NAMELIST_ALLOW_UNKEYED=true: \
                 its fields, buckets and fingerprints are unkeyed hashes from which phone and ID card numbers can be \
                 recovered by brute force. For development only; see docs/operations.md, *Fingerprint key*"
            )),
        )),
        None => Err(no_key_for_new(place)),
    }
}

/// Why a new keyspace is not created without a key, and how to make one.
pub fn no_key_for_new(place: &str) -> String {
    format!(
        "{place} holds no keyspace yet and no fingerprint key is configured: a new keyspace is keyed, so that nothing \
         stored or logged can be turned back into a phone or ID card number. Make a key with \
         `namelist-tools keygen --out /etc/namelist/fingerprint.key` (32 random bytes, mode 0600; keep a copy in \
         your secret store: the keyspace can never be read without it) and set \
         NAMELIST_FINGERPRINT_KEY_FILE=/etc/namelist/fingerprint.key for the service and the tools. For development \
         only, NAMELIST_ALLOW_UNKEYED=true creates an unkeyed keyspace"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn key() -> FingerprintKey {
        FingerprintKey::from_hex(HEX, "test").unwrap()
    }

    #[test]
    fn hex_keys_are_parsed_and_bad_ones_refused() {
        let k = key();
        assert_eq!(k.id().len(), 16);
        assert_eq!(
            FingerprintKey::from_hex(&format!("  {}\n", HEX.to_uppercase()), "x").unwrap(),
            k,
            "case and surrounding whitespace do not matter"
        );
        for (bad, why) in [
            (&HEX[..62], "31 bytes"),
            ("zz", "hex"),
            (&HEX[..63], "odd"),
            (&"ab".repeat(32), "repeated"),
        ] {
            let e = FingerprintKey::from_hex(bad, "f").unwrap_err().to_string();
            assert!(e.contains("64 hex digits"), "{why}: {e}");
        }
    }

    #[test]
    fn the_key_never_shows_in_debug_or_errors() {
        let k = key();
        let shown = format!("{k:?} {:?}", Hashing::Keyed(k.clone()));
        assert!(!shown.contains("0102030405"), "{shown}");
        assert!(shown.contains(k.id()));
    }

    #[test]
    fn subkeys_are_independent_and_keyed() {
        let k = Hashing::Keyed(key());
        let other =
            Hashing::Keyed(FingerprintKey::from_hex(&HEX.replace("1f", "20"), "other").unwrap());
        let bytes = b"black\nphone\nloan\n13812345678";
        assert_ne!(k.entry(bytes, 1000), other.entry(bytes, 1000));
        assert_ne!(k.entry(bytes, 1000), Hashing::Unkeyed.entry(bytes, 1000));
        assert_ne!(
            k.distinct_member(bytes),
            k.event(bytes),
            "one subkey per use"
        );
        assert_ne!(
            k.distinct_member(bytes),
            Hashing::Unkeyed.distinct_member(bytes)
        );
        assert_ne!(
            k.audit_value(bytes),
            Hashing::Unkeyed.audit_value(bytes),
            "the value fingerprint is keyed"
        );
        assert_ne!(k.audit_value(bytes), k.distinct_member(bytes) as u64);
        assert_ne!(k.audit_value(bytes), other.audit_value(bytes));
        assert_ne!(
            k.metric_entity(bytes),
            Hashing::Unkeyed.metric_entity(bytes)
        );
        assert_eq!(k.metric_entity(bytes) >> 96, 0, "96 bits");
        let (bucket, _) = k.entry(bytes, 7);
        assert!(bucket < 7);
    }

    #[test]
    fn unkeyed_is_format_1_exactly() {
        let bytes = b"black\nuid\ndefault\nu1";
        assert_eq!(
            Hashing::Unkeyed.entry(bytes, 5000),
            (crc32fast::hash(bytes) % 5000, xxh3_64(bytes) as i64)
        );
    }

    #[test]
    fn start_up_outcomes() {
        let k = key();
        let keyed = RecordedHashing {
            format: FORMAT_KEYED,
            key_id: Some(k.id().to_owned()),
        };
        let unkeyed = RecordedHashing {
            format: FORMAT_UNKEYED,
            key_id: None,
        };
        assert_eq!(
            open_recorded(&keyed, Some(&k), "ks").unwrap(),
            (Hashing::Keyed(k.clone()), None)
        );
        let e = open_recorded(&keyed, None, "ks").unwrap_err();
        assert!(e.contains("NAMELIST_FINGERPRINT_KEY_FILE"), "{e}");
        let wrong = FingerprintKey::from_hex(&HEX.replace("00", "ff"), "/k2").unwrap();
        let e = open_recorded(&keyed, Some(&wrong), "ks").unwrap_err();
        assert!(
            e.contains("key ids differ") && e.contains(wrong.id()),
            "{e}"
        );
        let (h, loud) = open_recorded(&unkeyed, Some(&k), "ks").unwrap();
        assert_eq!(h, Hashing::Unkeyed);
        assert!(loud.unwrap().contains("NOT used"));
        let e = open_recorded(
            &RecordedHashing {
                format: 99,
                key_id: None,
            },
            None,
            "ks",
        )
        .unwrap_err();
        assert!(e.contains("format 99"), "{e}");

        assert_eq!(
            for_new_keyspace(Some(&k), false, "ks").unwrap().0,
            Hashing::Keyed(k)
        );
        let (h, loud) = for_new_keyspace(None, true, "ks").unwrap();
        assert_eq!(h, Hashing::Unkeyed);
        assert!(loud.unwrap().contains("NAMELIST_ALLOW_UNKEYED"));
        let e = for_new_keyspace(None, false, "ks").unwrap_err();
        assert!(e.contains("namelist-tools keygen --out"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn key_files_are_created_private_and_never_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        let made = FingerprintKey::create_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(FingerprintKey::from_file(&path).unwrap(), made);
        let e = FingerprintKey::create_file(&path).unwrap_err();
        assert!(matches!(e, KeyError::Exists { .. }), "{e}");
        assert_eq!(FingerprintKey::from_file(&path).unwrap(), made, "unchanged");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = FingerprintKey::from_file(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o440)).unwrap();
        assert!(
            FingerprintKey::from_file(&path).is_ok(),
            "group-readable is fine"
        );
        let e = FingerprintKey::from_file(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(e, KeyError::Io { .. }), "{e}");
    }
}
