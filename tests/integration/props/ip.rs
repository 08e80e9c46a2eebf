//! Section 5 of the properties, IP ranges: a network holds exactly the addresses under its
//! prefix; IPv4-mapped IPv6 addresses probe IPv4 ranges.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use namelist::domain::{Dimension, IpValue, Value};
use proptest::prelude::*;

use super::forms::{ipv4, ipv4_mapped_spellings, ipv6, mask_v4, mask_v6};
use super::{check, config, entry};

/// An address (IPv4 or non-mapped IPv6), a prefix length for its family and random host bits.
fn addr_prefix_host() -> impl Strategy<Value = (IpAddr, u8, u128)> {
    prop_oneof![
        (ipv4(), 0u8..=32, any::<u128>()).prop_map(|(a, p, h)| (IpAddr::V4(a), p, h)),
        (ipv6(), 0u8..=128, any::<u128>()).prop_map(|(a, p, h)| (IpAddr::V6(a), p, h)),
    ]
}

/// The address with the top `p` bits of `addr` and the rest from `host`.
fn inside(addr: IpAddr, p: u8, host: u128) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let net = mask_v4(u32::from(a), p);
            IpAddr::V4(Ipv4Addr::from(net | (host as u32 & !mask_v4(u32::MAX, p))))
        }
        IpAddr::V6(a) => {
            let net = mask_v6(u128::from(a), p);
            IpAddr::V6(Ipv6Addr::from(net | (host & !mask_v6(u128::MAX, p))))
        }
    }
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn ip_networks((addr, p, host) in addr_prefix_host()) {
        let net = IpValue::network(addr, p);
        prop_assert_eq!(net.prefix(), p, "network({}, {}) keeps the prefix", addr, p);
        prop_assert_eq!(IpValue::network(net.addr(), p), net, "network({}, {}) is idempotent", addr, p);
        prop_assert_eq!(net.within(p), net, "network({}, {}).within({}) is itself", addr, p, p);
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        prop_assert_eq!(net.is_range(), p < max, "network({}, {}) is a range iff p < {}", addr, p, max);
        let expected_addr = match addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(mask_v4(u32::from(a), p))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(mask_v6(u128::from(a), p))),
        };
        prop_assert_eq!(net.addr(), expected_addr, "network({}, {}) clears the host bits", addr, p);

        let raw = format!("{addr}/{p}");
        prop_assert_eq!(
            entry(&Dimension::Ip, &raw),
            Ok(Value::Ip(net)),
            "entry {:?} is network({}, {})", raw, addr, p
        );

        // Any address inside the network probes to it.
        let a = inside(addr, p, host);
        let probe = check(&Dimension::Ip, &a.to_string());
        prop_assert!(probe.is_ok(), "check {} should be Ok: {:?}", a, probe);
        let probe = probe.ok().and_then(|v| v.as_ip().copied());
        prop_assert_eq!(
            probe.map(|ip| ip.within(p)),
            Some(net),
            "{} is inside {}, so within({}) should give it", a, net, p
        );
        prop_assert_eq!(
            probe.map(|ip| (ip.is_range(), ip.prefix())),
            Some((false, max)),
            "a checked address is a single address"
        );
    }

    #[test]
    fn ipv4_mapped_addresses_probe_ipv4_ranges(a in ipv4(), p in 0u8..=32, host in any::<u32>()) {
        let net = IpValue::network(IpAddr::V4(a), p);
        let mapped_range = format!("::ffff:{a}/{}", u16::from(p) + 96);
        prop_assert_eq!(
            entry(&Dimension::Ip, &mapped_range),
            Ok(Value::Ip(net)),
            "entry {:?} is the IPv4 range {}", mapped_range, net
        );
        let b = inside(IpAddr::V4(a), p, u128::from(host));
        let IpAddr::V4(b4) = b else {
            return Err(TestCaseError::fail("inside() of an IPv4 address is IPv4"));
        };
        for spelling in ipv4_mapped_spellings(&b4) {
            let probe = check(&Dimension::Ip, &spelling).ok().and_then(|v| v.as_ip().copied());
            prop_assert_eq!(
                probe.map(|ip| ip.within(p)),
                Some(net),
                "check {:?} ({} inside {}) should probe the IPv4 range", spelling, b, net
            );
        }
    }
}
