//! envoyproxy/ratelimit's documented matching and validation, case by case
//! (their config tests and README, written anew here).

use weir_envoy_ratelimit::{Found, Limits, Unit};

const SHOP: &str = r#"
domain: shop
descriptors:
  # A bare key: the default for any value.
  - key: key1
    descriptors:
      - key: subkey1
        rate_limit: { unit: second, requests_per_unit: 5 }
      - key: subkey1
        value: subvalue1
        rate_limit: { unit: SECOND, requests_per_unit: 10 }
  - key: key2
    rate_limit: { unit: minute, requests_per_unit: 20 }
  - key: key2
    value: value2
    rate_limit: { unit: minute, requests_per_unit: 30 }
  - key: key3
    rate_limit: { unit: hour, requests_per_unit: 1 }
    descriptors:
      - key: subkey3
        rate_limit: { unit: day, requests_per_unit: 2 }
  - key: key4
    value: value4
    descriptors:
      - key: subkey4
        value: subvalue4
        rate_limit: { unit: week, requests_per_unit: 3 }
  - key: key5
    rate_limit: { unlimited: true }
  - key: key6
    value: 1
    rate_limit: { unit: year, requests_per_unit: 4, name: yearly, replaces: [{ name: other }] }
    shadow_mode: true
"#;

fn limit<'a>(limits: &'a Limits, entries: &[(&str, &str)]) -> Option<(u32, Option<Unit>, &'a str)> {
    match limits.find("shop", entries) {
        Found::Limit { limit, .. } => Some((limit.requests_per_unit, limit.unit, &limit.path)),
        _ => None,
    }
}

#[test]
fn a_limit_applies_only_at_the_node_the_last_entry_reaches() {
    let limits = Limits::load([("config/shop.yaml", SHOP)], false).unwrap();
    let second = Some(Unit::Second);
    // key1 has no limit of its own: its subtree decides.
    assert_eq!(limit(&limits, &[("key1", "anything")]), None);
    assert_eq!(
        limit(&limits, &[("key1", "v"), ("subkey1", "x")]),
        Some((5, second, "shop.key1.subkey1"))
    );
    assert_eq!(
        limit(&limits, &[("key1", "v"), ("subkey1", "subvalue1")]),
        Some((10, second, "shop.key1.subkey1_subvalue1"))
    );
    // A value beats the default at its level.
    assert_eq!(limit(&limits, &[("key2", "other")]).map(|l| l.0), Some(20));
    assert_eq!(limit(&limits, &[("key2", "value2")]).map(|l| l.0), Some(30));
    // Deeper than the tree: no limit (not the parent's).
    assert_eq!(limit(&limits, &[("key2", "value2"), ("more", "x")]), None);
    // Shallower than the limit: none; at each depth its own.
    assert_eq!(limit(&limits, &[("key3", "x")]).map(|l| l.0), Some(1));
    assert_eq!(
        limit(&limits, &[("key3", "x"), ("subkey3", "y")]).map(|l| l.0),
        Some(2)
    );
    assert_eq!(limit(&limits, &[("key4", "value4")]), None);
    assert_eq!(
        limit(&limits, &[("key4", "other"), ("subkey4", "subvalue4")]),
        None
    );
    assert_eq!(
        limit(&limits, &[("key4", "value4"), ("subkey4", "subvalue4")]).map(|l| l.1),
        Some(Some(Unit::Week))
    );
    // An unknown key, an empty descriptor.
    assert_eq!(limit(&limits, &[("nope", "x")]), None);
    assert_eq!(limits.find("shop", &[]), Found::None);
    assert_eq!(
        limits.find("elsewhere", &[("key2", "x")]),
        Found::UnknownDomain
    );
    // unlimited, shadow_mode, name and replaces, a numeric value.
    let Found::Limit { limit: five, .. } = limits.find("shop", &[("key5", "x")]) else {
        panic!("key5");
    };
    assert!(five.unlimited && five.unit.is_none());
    let Found::Limit { limit: six, .. } = limits.find("shop", &[("key6", "1")]) else {
        panic!("key6");
    };
    assert!(six.shadow_mode);
    assert_eq!(
        (six.name.as_deref(), six.replaces.as_slice()),
        (Some("yearly"), &["other".to_owned()][..])
    );
    // Nine limits, and two nodes without one (each a rule of its own).
    let leaves = limits.limits();
    assert_eq!(leaves.iter().filter(|l| l.limit.is_some()).count(), 9);
    assert_eq!(leaves.len(), 11);
}

#[test]
fn no_backtracking_once_a_value_matched() {
    let yaml = r#"
domain: d
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        value: only
        rate_limit: { unit: second, requests_per_unit: 1 }
  - key: a
    descriptors:
      - key: b
        rate_limit: { unit: second, requests_per_unit: 2 }
"#;
    let limits = Limits::load([("d.yaml", yaml)], false).unwrap();
    let rpu = |entries: &[(&str, &str)]| match limits.find("d", entries) {
        Found::Limit { limit, .. } => Some(limit.requests_per_unit),
        _ => None,
    };
    assert_eq!(rpu(&[("a", "x"), ("b", "only")]), Some(1));
    // `a=x` matched its value: the default `a`'s subtree is not tried.
    assert_eq!(rpu(&[("a", "x"), ("b", "other")]), None);
    assert_eq!(rpu(&[("a", "y"), ("b", "other")]), Some(2));
}

#[test]
fn wildcards_are_tried_in_file_order_after_the_value_and_before_the_default() {
    let yaml = r#"
domain: w
descriptors:
  - key: path
    value: /api/*
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: path
    value: /api/v1*
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: path
    value: /api/exact
    rate_limit: { unit: second, requests_per_unit: 3 }
  - key: path
    rate_limit: { unit: second, requests_per_unit: 4 }
  - key: file
    value: "*.pdf"
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: mid
    value: bar*b
    rate_limit: { unit: second, requests_per_unit: 6 }
"#;
    let limits = Limits::load([("w.yaml", yaml)], false).unwrap();
    let rpu = |entries: &[(&str, &str)]| match limits.find("w", entries) {
        Found::Limit { limit, .. } => Some(limit.requests_per_unit),
        _ => None,
    };
    assert_eq!(rpu(&[("path", "/api/exact")]), Some(3), "the value first");
    assert_eq!(
        rpu(&[("path", "/api/v1/x")]),
        Some(1),
        "then wildcards, in file order"
    );
    assert_eq!(rpu(&[("path", "/other")]), Some(4), "then the default");
    assert_eq!(rpu(&[("mid", "barb")]), Some(6));
    assert_eq!(rpu(&[("mid", "bara")]), None);
    // share_threshold: the pattern stands for every value in the counter.
    let Found::Limit { shared, .. } = limits.find("w", &[("file", "a.pdf")]) else {
        panic!("a.pdf");
    };
    assert_eq!(shared, vec![Some("*.pdf")]);
    let Found::Limit { shared, .. } = limits.find("w", &[("path", "/api/v1/x")]) else {
        panic!("no share_threshold");
    };
    assert!(shared.iter().all(Option::is_none), "{shared:?}");
}

#[test]
fn domains_merge_only_when_asked() {
    let one = "domain: m\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
    let two = "domain: m\ndescriptors:\n  - key: b\n    rate_limit: { unit: second, requests_per_unit: 2 }\n";
    let error = Limits::load([("one.yaml", one), ("two.yaml", two)], false).unwrap_err();
    assert_eq!(
        error.to_string(),
        "two.yaml: duplicate domain 'm' in config file"
    );
    let merged = Limits::load([("one.yaml", one), ("two.yaml", two)], true).unwrap();
    assert!(matches!(
        merged.find("m", &[("b", "x")]),
        Found::Limit { .. }
    ));
    let again = Limits::load([("one.yaml", one), ("three.yaml", one)], true).unwrap_err();
    assert_eq!(
        again.to_string(),
        "three.yaml: duplicate descriptor composite key 'm.a'"
    );
}

#[test]
fn invalid_files_are_refused_naming_the_file_and_the_descriptor() {
    let cases = [
        ("descriptors: []\n", "config file cannot have empty domain"),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "descriptor d.k: invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: second }\n",
            "descriptor d.k: should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, name: n, replaces: [{ name: n }] }\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, replaces: [{ name: '' }] }\n",
            "should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    ratelimit: { unit: second }\n",
            "config error, unknown key 'ratelimit'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    1: x\n",
            "config error, key is not of type string: 1",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    descriptors: [a, b]\n",
            "config error, yaml file contains list of type other than map: a",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
            "share_threshold can only be used with wildcard values",
        ),
        ("domain: d\ndomain: e\n", "error loading config file"),
        ("domain: [d\n", "error loading config file"),
    ];
    for (yaml, expected) in cases {
        let error = Limits::load([("config/bad.yaml", yaml)], false).unwrap_err();
        assert_eq!(error.file, "config/bad.yaml");
        assert!(
            error.message.contains(expected),
            "{yaml}: {error} (expected: {expected})"
        );
    }
}

/// A tree rebuilt from its limits' paths (as weir's own rules are built)
/// finds what the files find, request by request.
#[test]
fn a_tree_rebuilt_from_its_paths_matches_alike() {
    let wild = "domain: shop\ndescriptors:\n  - key: path\n    value: /api/*\n    share_threshold: true\n    descriptors:\n      - key: method\n        rate_limit: { unit: second, requests_per_unit: 7 }\n  - key: path\n    value: /api/v*\n    rate_limit: { unit: second, requests_per_unit: 8 }\n  - key: remote_address\n    rate_limit: { unit: second, requests_per_unit: 9 }\n  - key: remote_address\n    value: 10.0.0.1\n";
    let limits = Limits::load([("shop.yaml", SHOP), ("wild.yaml", wild)], true).unwrap();
    let mut tree = weir_envoy_ratelimit::Tree::default();
    for leaf in limits.limits() {
        let path: Vec<(&str, Option<&str>)> = leaf.path.iter().map(|&(k, v, _)| (k, v)).collect();
        let shared = leaf.path.iter().any(|&(_, _, s)| s);
        tree.insert(
            leaf.domain,
            &path,
            leaf.limit.map(|l| l.path.clone()),
            shared,
        )
        .unwrap();
    }
    let requests: &[&[(&str, &str)]] = &[
        &[("key1", "v"), ("subkey1", "x")],
        &[("key1", "v"), ("subkey1", "subvalue1")],
        &[("key2", "other")],
        &[("key2", "value2")],
        &[("key2", "value2"), ("more", "x")],
        &[("key3", "x"), ("subkey3", "y")],
        &[("key4", "value4"), ("subkey4", "subvalue4")],
        &[("key4", "other"), ("subkey4", "subvalue4")],
        &[("key5", "x")],
        &[("key6", "1")],
        &[("path", "/api/x"), ("method", "GET")],
        &[("path", "/api/v1")],
        &[("path", "/other")],
        // A value without a limit beside a limited default: exempt.
        &[("remote_address", "10.0.0.1")],
        &[("remote_address", "10.0.0.2")],
    ];
    for entries in requests {
        let from_files = match limits.find("shop", entries) {
            Found::Limit { limit, shared } => Some((limit.path.clone(), shared)),
            _ => None,
        };
        let rebuilt = match tree.find("shop", entries) {
            Found::Limit {
                limit: Some(path),
                shared,
            } => Some((path.clone(), shared)),
            _ => None,
        };
        assert_eq!(rebuilt, from_files, "{entries:?}");
    }
    let mut twice = weir_envoy_ratelimit::Tree::default();
    twice.insert("d", &[("a", None)], 1, false).unwrap();
    assert_eq!(
        twice.insert("d", &[("a", None)], 2, false),
        Err("duplicate descriptor composite key 'd.a'".to_owned())
    );
}
