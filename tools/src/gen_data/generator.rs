//! The row generator: lists, sandboxes and dimensions picked by weight (`--mix`), each
//! dimension's next value from its own sequence, expiries and reasons by their shares; all
//! members first, then non-members, which continue each dimension's sequence past the members
//! (and never use a range), so no non-member is ever listed.

use anyhow::{Context, bail, ensure};
use rand::SeedableRng;

use namelist::domain::{Dimension, ListName, Sandbox, now_ms};

use super::perm::{Picker, Prng, Seq, below, chance};
use super::values::{
    CJK_COMMON, CUSTOM_SPACE, CjkPools, DEVICE_SPACE, DOMAIN_SPACE, EMAIL_SPACE, ID_DAYS,
    ID_REGIONS, IMEI_PER_PREFIX, IMEI_PREFIXES, IpGen, Kind, MAC_OUIS, MERCHANT_BRANDS,
    PHONE_SPACE, REASONS, SegmentGen, UID_SPACE, write_email_domain, write_value,
};
use super::{Args, MAX_EXPIRY_SECS, MIN_EXPIRY_SECS, Row, RowExpiry};

#[derive(Debug, Clone)]
pub(super) struct DimGen {
    pub(super) dimension: Dimension,
    pub(super) kind: Kind,
    /// The value space of every kind but `Ip` (which keeps its own).
    pub(super) seq: Seq,
    pub(super) members: u64,
}

pub(super) fn parse_weights(flag: &str, spec: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((name, weight)) = part.split_once('=') else {
            bail!("--{flag}: expected name=weight, got {part:?}");
        };
        let name = name.trim();
        let weight: u64 = weight
            .trim()
            .parse()
            .with_context(|| format!("--{flag}: bad weight in {part:?}"))?;
        ensure!(
            !out.iter().any(|(n, _)| n == name),
            "--{flag}: {name:?} appears twice"
        );
        out.push((name.to_owned(), weight));
    }
    ensure!(
        out.iter().any(|(_, w)| *w > 0),
        "--{flag}: at least one weight must be positive"
    );
    Ok(out)
}

pub(super) fn check_share(flag: &str, v: f64) -> anyhow::Result<()> {
    ensure!(
        (0.0..=1.0).contains(&v),
        "--{flag} must be between 0 and 1, got {v}"
    );
    Ok(())
}

/// The row generator behind `generate`: all members first, then non-members.
pub struct Generator {
    rng: Prng,
    lists: Vec<String>,
    sandboxes: Vec<String>,
    pub(super) dims: Vec<DimGen>,
    dim_pick: Picker,
    expiry_pick: Picker,
    cidr_share: f64,
    ipv6_share: f64,
    reason_share: f64,
    segment_share: f64,
    domain_share: f64,
    segments_gen: SegmentGen,
    domains_seq: Seq,
    now_ms: i64,
    cjk: CjkPools,
    value: String,
    pub(super) ranges: u64,
    pub(super) segments: u64,
    pub(super) domains: u64,
    in_non_members: bool,
}

impl Generator {
    pub fn new(opts: &Args) -> anyhow::Result<Self> {
        ensure!(!opts.lists.is_empty(), "--lists: give at least one list");
        ensure!(
            !opts.sandboxes.is_empty(),
            "--sandboxes: give at least one sandbox"
        );
        let lists = opts
            .lists
            .iter()
            .map(|l| ListName::try_from(l.trim().to_owned()).map(String::from))
            .collect::<Result<Vec<_>, _>>()
            .context("--lists")?;
        let sandboxes = opts
            .sandboxes
            .iter()
            .map(|s| Sandbox::try_from(s.trim().to_owned()).map(String::from))
            .collect::<Result<Vec<_>, _>>()
            .context("--sandboxes")?;
        check_share("cidr-share", opts.cidr_share)?;
        check_share("ipv6-share", opts.ipv6_share)?;
        check_share("reason-share", opts.reason_share)?;
        check_share("segment-share", opts.segment_share)?;
        check_share("domain-share", opts.domain_share)?;

        let mut dims = Vec::new();
        let mut weights = Vec::new();
        for (name, weight) in parse_weights("mix", &opts.mix)? {
            let dimension: Dimension = name.parse().context("--mix")?;
            if weight == 0 {
                continue;
            }
            let (kind, size) = match &dimension {
                Dimension::Phone => (Kind::Phone, PHONE_SPACE),
                Dimension::IdCard => (Kind::IdCard, ID_REGIONS.len() as u64 * ID_DAYS * 1000),
                Dimension::Imei => (Kind::Imei, IMEI_PREFIXES.len() as u64 * IMEI_PER_PREFIX),
                Dimension::WifiMac => (Kind::WifiMac, (MAC_OUIS.len() as u64) << 24),
                Dimension::Uid => (Kind::Uid, UID_SPACE),
                Dimension::Device => (Kind::Device, DEVICE_SPACE),
                Dimension::Ip => (Kind::Ip(Box::new(IpGen::new(opts.seed))), 1),
                Dimension::Email => (Kind::Email, EMAIL_SPACE),
                Dimension::Custom(n) => (
                    Kind::Custom {
                        merchant: n.starts_with("merchant"),
                    },
                    CUSTOM_SPACE,
                ),
            };
            dims.push(DimGen {
                seq: Seq::new(size, opts.seed, dimension.as_str()),
                dimension,
                kind,
                members: 0,
            });
            weights.push(weight);
        }

        let mut expiry = [0u64; 3];
        for (name, weight) in parse_weights("expiry-mix", &opts.expiry_mix)? {
            let i = match name.as_str() {
                "never" => 0,
                "ttl" => 1,
                "at" => 2,
                other => bail!("--expiry-mix: unknown kind {other:?} (expected never, ttl, at)"),
            };
            expiry[i] = weight;
        }

        Ok(Self {
            rng: Prng::seed_from_u64(opts.seed),
            lists,
            sandboxes,
            dims,
            dim_pick: Picker::new(weights),
            expiry_pick: Picker::new(expiry),
            cidr_share: opts.cidr_share,
            ipv6_share: opts.ipv6_share,
            reason_share: opts.reason_share,
            segment_share: opts.segment_share,
            domain_share: opts.domain_share,
            segments_gen: SegmentGen::new(opts.seed),
            domains_seq: Seq::new(DOMAIN_SPACE, opts.seed, "email domain"),
            now_ms: opts.now_ms.unwrap_or_else(now_ms),
            cjk: CjkPools {
                brands: MERCHANT_BRANDS.chars().collect(),
                common: CJK_COMMON.chars().collect(),
            },
            value: String::with_capacity(128),
            ranges: 0,
            segments: 0,
            domains: 0,
            in_non_members: false,
        })
    }

    /// The next member row.
    pub fn member(&mut self) -> anyhow::Result<Row<'_>> {
        ensure!(
            !self.in_non_members,
            "members must all be generated before the first non-member"
        );
        let (l, s, d) = self.place();
        self.value.clear();
        let rng = &mut self.rng;
        let dim = &mut self.dims[d];
        match &mut dim.kind {
            Kind::Ip(ip) => {
                let v6 = chance(rng, self.ipv6_share);
                let ranged = chance(rng, self.cidr_share) && ip.range(&mut self.value, rng, v6)?;
                if ranged {
                    self.ranges += 1;
                } else {
                    ip.single(&mut self.value, rng, v6)?;
                }
            }
            // Shares of 0 draw nothing, so files made before segments and domains existed
            // come out byte for byte the same.
            Kind::Phone
                if self.segment_share > 0.0
                    && chance(rng, self.segment_share)
                    && self.segments_gen.next(&mut self.value, rng)? =>
            {
                self.segments += 1;
            }
            Kind::Email if self.domain_share > 0.0 && chance(rng, self.domain_share) => {
                let v = self.domains_seq.take("email domain")?;
                write_email_domain(&mut self.value, rng, v);
                self.domains += 1;
            }
            _ => {
                let v = dim.seq.take(dim.dimension.as_str())?;
                write_value(&mut self.value, rng, &dim.kind, v, &self.cjk);
            }
        }
        dim.members += 1;
        let expiry = match self.expiry_pick.pick(rng) {
            0 => RowExpiry::Never,
            1 => RowExpiry::TtlSeconds(
                MIN_EXPIRY_SECS + below(rng, MAX_EXPIRY_SECS - MIN_EXPIRY_SECS + 1),
            ),
            _ => RowExpiry::ExpiresAtMs(
                self.now_ms
                    + (MIN_EXPIRY_SECS * 1000
                        + below(rng, (MAX_EXPIRY_SECS - MIN_EXPIRY_SECS) * 1000 + 1))
                        as i64,
            ),
        };
        let reason = chance(rng, self.reason_share)
            .then(|| REASONS[below(rng, REASONS.len() as u64) as usize]);
        Ok(Row {
            list: &self.lists[l],
            dimension: &self.dims[d].dimension,
            value: &self.value,
            sandbox: &self.sandboxes[s],
            expiry,
            reason,
        })
    }

    /// The next non-member row: a single value (never a range) of a mixed-in dimension that no
    /// member row lists, in any list or sandbox, exactly or through a range.
    pub fn non_member(&mut self) -> anyhow::Result<Row<'_>> {
        self.in_non_members = true;
        let (l, s, d) = self.place();
        self.value.clear();
        let rng = &mut self.rng;
        let dim = &mut self.dims[d];
        match &mut dim.kind {
            Kind::Ip(ip) => {
                let v6 = chance(rng, self.ipv6_share);
                ip.single(&mut self.value, rng, v6)?;
            }
            _ => {
                let v = dim.seq.take(dim.dimension.as_str())?;
                write_value(&mut self.value, rng, &dim.kind, v, &self.cjk);
            }
        }
        Ok(Row {
            list: &self.lists[l],
            dimension: &self.dims[d].dimension,
            value: &self.value,
            sandbox: &self.sandboxes[s],
            expiry: RowExpiry::Never,
            reason: None,
        })
    }

    /// (list, sandbox, dimension) indices of the next row.
    fn place(&mut self) -> (usize, usize, usize) {
        let rng = &mut self.rng;
        let l = below(rng, self.lists.len() as u64) as usize;
        let s = below(rng, self.sandboxes.len() as u64) as usize;
        let d = self.dim_pick.pick(rng);
        (l, s, d)
    }
}
