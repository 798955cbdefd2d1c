//! Address lists (`[server] allow` and `deny`, a route's or a policy's
//! `exempt`).
//!
//! A list is its networks merged into disjoint, sorted ranges of integers
//! (IPv4 as its IPv4-mapped IPv6 address): a lookup is one binary search, O(log n)
//! in the number of ranges, whatever the list holds (docs/BENCHMARKS.md
//! measures 10,000 networks), and the list takes 32 bytes a range.

use std::net::IpAddr;

use ipnet::IpNet;

/// Networks, IPv4 and IPv6, as sorted disjoint ranges of IPv6 numbers
/// (IPv4 as its IPv4-mapped IPv6 address, `::ffff:a.b.c.d`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressList {
    ranges: Vec<(u128, u128)>,
    /// The networks as written.
    len: usize,
}

/// An address as a number of the one space both families share.
fn number(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

impl AddressList {
    /// The list of `networks` (an address is its own network).
    pub fn new(networks: &[IpNet]) -> Self {
        let mut ranges: Vec<(u128, u128)> = networks
            .iter()
            .map(|n| (number(n.network()), number(n.broadcast())))
            .collect();
        ranges.sort_unstable();
        // Overlapping or touching ranges merge.
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        Self {
            ranges: merged,
            len: networks.len(),
        }
    }

    /// Reads `text` as a network (`10.0.0.0/8`, `2001:db8::/32`) or an
    /// address (`192.0.2.7`, its own network).
    pub fn parse_network(text: &str) -> Result<IpNet, String> {
        let text = text.trim();
        text.parse::<IpNet>()
            .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| {
                format!("`{text}` is not an address or network (valid: \"10.0.0.0/8\", \"192.0.2.7\", \"2001:db8::/32\")")
            })
    }

    /// Whether `ip` is in one of the networks (an IPv4-mapped IPv6 address
    /// is its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let x = number(ip);
        // The last range starting at or before `x`.
        let after = self.ranges.partition_point(|&(start, _)| start <= x);
        after > 0 && x <= self.ranges[after - 1].1
    }

    /// Whether it lists nothing.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The networks as written.
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(nets: &[&str]) -> AddressList {
        let nets: Vec<IpNet> = nets
            .iter()
            .map(|n| AddressList::parse_network(n).unwrap())
            .collect();
        AddressList::new(&nets)
    }

    #[test]
    fn finds_addresses_in_merged_ranges() {
        let l = list(&[
            "10.0.0.0/8",
            "10.1.0.0/16",
            "192.0.2.7",
            "192.0.2.8/31",
            "2001:db8::/32",
        ]);
        for yes in [
            "10.0.0.0",
            "10.255.255.255",
            "192.0.2.7",
            "192.0.2.9",
            "2001:db8:ffff::1",
            "::ffff:10.2.3.4",
        ] {
            assert!(l.contains(yes.parse().unwrap()), "{yes}");
        }
        for no in [
            "9.255.255.255",
            "11.0.0.0",
            "192.0.2.6",
            "192.0.2.10",
            "2001:db9::",
            "::1",
        ] {
            assert!(!l.contains(no.parse().unwrap()), "{no}");
        }
        assert_eq!(l.ranges.len(), 3, "10/8 holds 10.1/16; .7 and .8/31 touch");
        assert!(AddressList::parse_network("10.0.0.0/33").is_err());
        assert!(AddressList::parse_network("example.com").is_err());
    }

    /// Against a scan of the networks, on random lists and addresses.
    #[test]
    fn agrees_with_a_scan() {
        let mut x: u64 = 42;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            x >> 11
        };
        for _ in 0..50 {
            let nets: Vec<IpNet> = (0..200)
                .map(|_| {
                    let ip = std::net::Ipv4Addr::from((next() as u32) & 0xff0f_ffff);
                    IpNet::new(IpAddr::V4(ip), 8 + (next() % 25) as u8).unwrap()
                })
                .collect();
            let l = AddressList::new(&nets);
            for _ in 0..500 {
                let ip = IpAddr::V4(std::net::Ipv4Addr::from((next() as u32) & 0xff0f_ffff));
                assert_eq!(l.contains(ip), nets.iter().any(|n| n.contains(&ip)), "{ip}");
            }
        }
    }
}
