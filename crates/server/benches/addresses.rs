//! An address list's lookup (`[server] deny`, `allow`, `exempt`), with 10,
//! 1,000 and 10,000 networks, beside a scan of the same networks (what a
//! list without merged ranges would cost): addresses in and out of it.
//!
//! `cargo bench -p weir-server --bench addresses`

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ipnet::IpNet;
use weir_server::addresses::AddressList;

/// `n` networks: IPv4 /24s and IPv6 /48s, spread over the space.
fn networks(n: u32) -> Vec<IpNet> {
    (0..n)
        .map(|i| {
            let spread = i.wrapping_mul(2_654_435_761);
            match i % 2 {
                0 => IpNet::new(IpAddr::V4(Ipv4Addr::from(spread & 0xffff_ff00)), 24).unwrap(),
                _ => {
                    let high = u128::from(spread) << 96 | 0x2001 << 112;
                    IpNet::new(IpAddr::V6(Ipv6Addr::from(high)), 48).unwrap()
                }
            }
        })
        .collect()
}

fn lookups(c: &mut Criterion) {
    let mut group = c.benchmark_group("address-list");
    for n in [10, 1_000, 10_000] {
        let nets = networks(n);
        let list = AddressList::new(&nets);
        let probes: Vec<IpAddr> = (0..1024u32)
            .map(|i| match i % 2 {
                0 => IpAddr::V4(Ipv4Addr::from(i.wrapping_mul(2_246_822_519))),
                _ => nets[(i as usize * 7) % nets.len()].network(),
            })
            .collect();
        let mut i = 0;
        group.bench_function(BenchmarkId::new("ranges", n), |b| {
            b.iter(|| {
                i = (i + 1) % probes.len();
                black_box(list.contains(black_box(probes[i])))
            });
        });
        group.bench_function(BenchmarkId::new("scan", n), |b| {
            b.iter(|| {
                i = (i + 1) % probes.len();
                let ip = black_box(probes[i]);
                black_box(nets.iter().any(|n| n.contains(&ip)))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, lookups);
criterion_main!(benches);
