//! The config parser on whole files.

use super::*;
use http::Method;

#[test]
fn the_example_is_valid() {
    let config = parse(EXAMPLE, &Env::default()).unwrap();
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.policies.len(), 3);
    assert!(config.server.admin_token.is_none());
}

#[test]
fn the_documented_configs_are_valid() {
    let envoy = parse(
        include_str!("../../../../docs/envoy/weir.toml"),
        &Env::default(),
    )
    .unwrap();
    assert_eq!(
        (envoy.descriptors.len(), envoy.store.fallback_share),
        (4, 250_000)
    );
    let rule = |name| envoy.policies[envoy.policy_id(name).unwrap().0].on_store_error;
    assert_eq!(rule("seller-stock-read"), Some(OnStoreError::Deny));
    assert_eq!(rule("per-ip"), None);
    parse(
        include_str!("../../../../docs/bench/weir.toml"),
        &Env::default(),
    )
    .unwrap();
}

#[test]
fn store_rules_and_descriptors_are_checked() {
    let text = "[store]\nurl = \"redis://:x:y/\"\nfallback_share = 2\n\n[policies.a]\nalgorithm = \"gcra\"\nburst = 2\nrate = \"1/s\"\non_store_error = \"maybe\"\non_state_loss = \"half\"\n\n[[descriptors]]\ndomain = \"d\"\nentries = [\"k=\"]\npolicy = \"b\"\n";
    let errors = parse(text, &Env::default()).unwrap_err().0;
    let places: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.place.as_str())).collect();
    assert_eq!(
        places,
        [
            (2, "[store] url"),
            (3, "[store] fallback_share"),
            (9, "[policies.a] on_store_error"),
            (10, "[policies.a] on_state_loss"),
            (14, "[[descriptors]] #1 entries"),
            (15, "[[descriptors]] #1 policy"),
        ],
        "{errors:?}"
    );
    assert!(
        errors[0].message.starts_with("not a Redis URL"),
        "{errors:?}"
    );
    assert!(
        errors[2].message.contains("\"local\" \"allow\" \"deny\""),
        "{errors:?}"
    );
}

#[test]
fn every_error_is_reported_with_its_line() {
    let text = r#"
[server]
listen = "everywhere"

[store]
url = "mysql://127.0.0.1:6379"

[policies.a]
algorithm = "token-bucket"
capacity = 0
rate = "2/s"

[[routes]]
match = "GET /x/{id}"
identity = "path:nope"
policies = ["a", "b"]
upstream = "ftp://x"
"#;
    let errors = parse(text, &Env::default()).unwrap_err().0;
    let lines: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.place.as_str())).collect();
    assert_eq!(
        lines,
        [
            (3, "[server] listen"),
            (6, "[store] url"),
            (10, "[policies.a] capacity"),
            (15, "[[routes]] #1 identity"),
            (16, "[[routes]] #1 policies"),
            (17, "[[routes]] #1 upstream"),
        ],
        "{errors:?}"
    );
    assert!(errors[4].message.contains("no policy `b` (defined: a)"));
    let syntax = parse("[server\n", &Env::default()).unwrap_err().0;
    assert_eq!(syntax[0].line, 1);
    let unknown = parse(
        "[server]\nlisten = \"127.0.0.1:1\"\nport = 3\n",
        &Env::default(),
    )
    .unwrap_err()
    .0;
    assert_eq!(unknown[0].line, 3, "{unknown:?}");
    assert!(unknown[0].message.contains("unknown key"));
}

#[test]
fn routes_parse() {
    let text = "[policies.a]\nalgorithm = \"gcra\"\nburst = 2\nrate = \"1/s\"\n\n[[routes]]\nmatch = \"GET /s/{seller}/stock\"\nidentity = \"path:seller\"\npolicies = [\"a\"]\nupstream = \"http://127.0.0.1:9\"\n";
    let config = parse(text, &admin_token("from-the-environment")).unwrap();
    let route = &config.routes[0];
    assert_eq!(route.method, Some(Method::GET));
    assert_eq!(
        route.segments,
        [
            Segment::Literal("s".into()),
            Segment::Param("seller".into()),
            Segment::Literal("stock".into())
        ]
    );
    assert_eq!(route.identity, Identity::Path("seller".into()));
    assert_eq!(route.policies, [TableId(0)]);
    assert_eq!(
        config.server.admin_token.as_deref(),
        Some("from-the-environment")
    );
}

#[test]
fn every_unknown_key_and_bad_method_is_reported_at_once() {
    let text = r#"admin_tokn = "x"

[server]
admin_tokn = "0123456789abcdef"

[store]
timout = "1s"

[policies.a]
algorithm = "gcra"
burst = 2
rate = "1/s"

[[routes]]
match = "GETT /x"
identity = "peer"
policies = ["a"]
upstream = "http://127.0.0.1:9"
max_wiat = "1s"
"#;
    let errors = parse(text, &Env::default()).unwrap_err().0;
    let found: Vec<(usize, &str, &str)> = errors
        .iter()
        .map(|e| (e.line, e.place.as_str(), e.message.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (
                1,
                "top level admin_tokn",
                "unknown key (valid: server, store, policies, routes, descriptors, overrides, plans, quota_buckets, telemetry, jwt)"
            ),
            (
                4,
                "[server] admin_tokn",
                "unknown key (did you mean `admin_token`?)"
            ),
            (7, "[store] timout", "unknown key (did you mean `timeout`?)"),
            (
                15,
                "[[routes]] #1 match",
                "`GETT` is not an HTTP method (valid: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS)"
            ),
            (
                19,
                "[[routes]] #1 max_wiat",
                "unknown key (did you mean `max_wait`?)"
            ),
        ],
        "{errors:#?}"
    );
}

#[test]
fn a_short_admin_token_names_its_line() {
    let errors = parse(
        "[server]\nadmin_token = \"short\"\n[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n", &Env::default())
    .unwrap_err()
    .0;
    assert_eq!(
        (errors[0].line, errors[0].place.as_str()),
        (2, "[server] admin_token")
    );
}

#[test]
fn a_token_of_one_repeated_character_is_refused() {
    let errors = parse(
        "[server]\nadmin_token = \"aaaaaaaaaaaaaaaaaaaa\"\n[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n", &Env::default())
    .unwrap_err()
    .0;
    assert!(errors[0].message.contains("repeated"), "{errors:?}");
}

#[test]
fn every_bad_parameter_of_a_policy_is_reported_with_a_hint() {
    let text = "[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = \"x\"\nrate = \"fast\"\nnear_limit_ratio = 0.8\n\n[policies.b]\nalgorithm = \"sliding-log\"\nlimt = 5\n";
    let errors = parse(text, &admin_token("short")).unwrap_err().0;
    let said: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.place.as_str())).collect();
    for expected in [
        (3, "[policies.a] capacity"),
        (4, "[policies.a] rate"),
        (5, "[policies.a] near_limit_ratio"),
        (8, "[policies.b] limit"),
        (8, "[policies.b] window"),
        (9, "[policies.b] limt"),
        (0, "WEIR_ADMIN_TOKEN (the [server] admin_token)"),
    ] {
        assert!(said.contains(&expected), "{expected:?} in {said:?}");
    }
    let misplaced = errors
        .iter()
        .find(|e| e.place.ends_with("near_limit_ratio"))
        .unwrap();
    assert!(misplaced.message.contains("[server]"), "{misplaced}");
    let env = errors.iter().find(|e| e.line == 0).unwrap();
    assert!(!env.to_string().contains("line"), "{env}");
}

/// Every config key the docs show — in TOML blocks, as `[table] key` in
/// the text, and commented out in the example — is one the parser takes.
#[test]
fn every_documented_key_is_accepted() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut docs: Vec<(String, String)> = [
        "README.md",
        "docs/ARCHITECTURE.md",
        "docs/RELIABILITY.md",
        "docs/SECURITY.md",
        "docs/SEMANTICS.md",
        "docs/BENCHMARKS.md",
    ]
    .iter()
    .map(|f| {
        (
            f.to_string(),
            std::fs::read_to_string(format!("{root}/{f}")).unwrap(),
        )
    })
    .collect();
    for entry in std::fs::read_dir(format!("{root}/docs/envoy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            docs.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    // The example with every commented `# key = value` line set, and
    // every commented `# [table]` opened.
    let example: String = EXAMPLE
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(set) if set.split_once(" = ").is_some_and(|(k, _)| !k.contains(' ')) => set,
            Some(table) if table.starts_with('[') && table.ends_with(']') => table,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let mut blocks = vec![("example.toml (uncommented)".to_owned(), example)];
    for (name, text) in &docs {
        if name.ends_with(".toml") {
            blocks.push((name.clone(), text.clone()));
            continue;
        }
        for block in text.split("```toml\n").skip(1) {
            let block = block.split("```").next().unwrap_or_default();
            blocks.push((name.clone(), block.to_owned()));
        }
        // `[server] key` in prose.
        for (table, known) in [
            ("[server] ", keys::server()),
            ("[store] ", keys::store()),
            ("[telemetry] ", keys::telemetry()),
        ] {
            for mention in text.split(&format!("`{table}")).skip(1) {
                let key: String = mention
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                assert!(
                    known.contains(&key.as_str()),
                    "{name}: `{table}{key}` is not a key the parser takes ({known:?})"
                );
            }
        }
    }
    for (name, block) in blocks {
        if let Err(errors) = parse(&block, &Env::default()) {
            for e in errors.0 {
                assert!(!e.message.contains("unknown key"), "{name}: {e}\n{block}");
            }
        }
    }
}

/// An environment that gives `WEIR_ADMIN_TOKEN` only.
fn admin_token(token: &str) -> Env {
    Env {
        admin_token: Some(token.to_owned()),
        ..Env::default()
    }
}

#[test]
fn redis_credentials_come_from_the_file_or_the_environment_and_tls_keys_need_redis() {
    let dir = std::env::temp_dir().join(format!("weir-store-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, "from-the-file\n").unwrap();
    let policy = "\n[policies.api]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n";
    let env = Env {
        redis_password: Some("from-the-environment".into()),
        ..Env::default()
    };
    let store = |extra: &str| {
        let text =
            format!("[store]\nurl = \"redis://:in-the-url@127.0.0.1:6379\"\n{extra}{policy}");
        parse(&text, &env).unwrap().store
    };
    let access = store("").access;
    assert_eq!(access.password.as_deref(), Some("from-the-environment"));
    let with_file = format!(
        "password_file = \"{}\"\nusername = \"weir\"\n",
        file.display()
    );
    let access = store(&with_file).access;
    assert_eq!(
        access.password.as_deref(),
        Some("from-the-file"),
        "no trailing newline"
    );
    assert_eq!(access.username.as_deref(), Some("weir"));
    // Shown, the URL's password is not.
    let shown = store("").url.to_string();
    assert_eq!(shown, "redis://:***@127.0.0.1:6379");
    // TLS keys on the in-process store would be ignored: an error.
    let errors = parse(&format!("[store]\ntls = true\n{policy}"), &env)
        .unwrap_err()
        .0;
    assert!(
        errors[0]
            .to_string()
            .contains("applies to a Redis store only"),
        "{}",
        errors[0]
    );
    // An unknown key of a TLS table is named as such.
    let errors = parse(&format!("[server.tls]\nkey_file = \"x\"\n{policy}"), &env)
        .unwrap_err()
        .0;
    assert!(
        errors
            .iter()
            .any(|e| e.to_string().contains("[server.tls] key_file: unknown key")),
        "{errors:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_concurrency_policy_cannot_serve_envoy_and_routes_say_what_it_holds() {
    let text = "[policies.jobs]\nalgorithm = \"concurrency\"\nlimit = 3\nlease = \"10m\"\n\n[[descriptors]]\ndomain = \"d\"\nentries = [\"k\"]\npolicy = \"jobs\"\n\n[[routes]]\nmatch = \"POST /x\"\nidentity = \"header:x-tenant\"\npolicies = [\"jobs\"]\nupstream = \"http://127.0.0.1:1\"\nconcurrency_cost = 0\n";
    let errors = parse(text, &Env::default()).unwrap_err().0;
    let places: Vec<(usize, &str)> = errors.iter().map(|e| (e.line, e.place.as_str())).collect();
    assert_eq!(
        places,
        [
            (9, "[[descriptors]] #1 policy"),
            (16, "[[routes]] #1 concurrency_cost")
        ],
        "{errors:?}"
    );
    assert!(
        errors[0]
            .message
            .contains("Envoy's rate limit protocol has no release"),
        "{errors:?}"
    );
    let ok = text.replace("concurrency_cost = 0", "concurrency_cost = \"cost\"");
    let ok = [
        &ok[..ok.find("[[descriptors]]").unwrap()],
        &ok[ok.find("[[routes]]").unwrap()..],
    ]
    .concat();
    let config = parse(&ok, &Env::default()).unwrap();
    assert_eq!(config.routes[0].concurrency_cost, None);
    let lease = "[policies.jobs]\nalgorithm = \"concurrency\"\nlimit = 3\nlease = \"8d\"\n";
    let errors = parse(lease, &Env::default()).unwrap_err().0;
    assert!(
        errors[0].message.contains("longer than 7 days"),
        "{errors:?}"
    );
}

#[test]
fn descriptor_rules_say_what_envoyproxy_ratelimit_files_say_and_are_checked() {
    let rule = |body: &str| {
        format!(
            "[policies.a]\nalgorithm = \"gcra\"\nburst = 2\nrate = \"1/s\"\n\n[[descriptors]]\ndomain = \"d\"\n{body}\n"
        )
    };
    let cases = [
        (
            "entries = [\"k\"]\npolicy = \"a\"\nunlimited = true",
            "[[descriptors]] #1 unlimited",
            "give one of",
        ),
        (
            "entries = [\"k\"]\nrefuse = true\nunlimited = true",
            "[[descriptors]] #1 unlimited",
            "give one of",
        ),
        (
            "entries = [\"k\"]",
            "[[descriptors]] #1 policy",
            "or set unlimited = true",
        ),
        (
            "entries = [\"k=v\"]\npolicy = \"a\"\nshare_threshold = true",
            "[[descriptors]] #1 share_threshold",
            "wildcard",
        ),
        (
            "entries = [\"k\"]\npolicy = \"a\"\nname = \"n\"\nreplaces = [\"n\"]",
            "[[descriptors]] #1 replaces",
            "itself",
        ),
        (
            "entries = [\"k\"]\nunlimited = true\nreport = true",
            "[[descriptors]] #1 report",
            "cannot be unlimited",
        ),
        (
            "entries = [\"k=v\"]\npolicy = \"a\"\n\n[[descriptors]]\ndomain = \"d\"\nentries = [\"k=v\"]\nunlimited = true",
            "[[descriptors]] #2 entries",
            "duplicate descriptor composite key 'd.k_v'",
        ),
    ];
    for (body, place, message) in cases {
        let errors = parse(&rule(body), &Env::default()).unwrap_err().0;
        assert_eq!(errors[0].place, place, "{body}: {errors:?}");
        assert!(errors[0].message.contains(message), "{body}: {errors:?}");
    }
    let ok = rule(
        "entries = [\"path=/api/*\", \"method\"]\npolicy = \"a\"\nshare_threshold = true\nname = \"api\"\nreplaces = [\"other\"]",
    );
    let config = parse(&ok, &Env::default()).unwrap();
    assert_eq!(config.descriptors[0].replaces, ["other"]);
}

#[test]
fn an_ipv6_network_is_one_client_for_the_per_address_bounds() {
    use std::net::IpAddr;
    let policy = "[policies.p]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n";
    let limits = parse(policy, &Env::default()).unwrap().server.limits;
    let ip = |text: &str| text.parse::<IpAddr>().unwrap();
    assert_eq!(limits.ipv6_prefix, 64);
    let same = ["2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff"];
    assert_eq!(limits.client(ip(same[0])), limits.client(ip(same[1])));
    assert_eq!(limits.client(ip(same[0])), ip("2001:db8:1:2::"));
    assert_ne!(
        limits.client(ip(same[0])),
        limits.client(ip("2001:db8:1:3::1"))
    );
    // IPv4 whole, and as IPv4 when mapped into IPv6.
    assert_eq!(limits.client(ip("192.0.2.7")), ip("192.0.2.7"));
    assert_eq!(limits.client(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
    let every = parse(
        &format!("[server]\nipv6_prefix = 128\n\n{policy}"),
        &Env::default(),
    );
    let every = every.unwrap().server.limits;
    assert_eq!(every.client(ip(same[1])), ip(same[1]));
    let wrong = parse(
        &format!("[server]\nipv6_prefix = 129\n\n{policy}"),
        &Env::default(),
    );
    let error = wrong.unwrap_err().to_string();
    assert!(
        error.contains("ipv6_prefix") && error.contains("1 to 128"),
        "{error}"
    );
}

#[test]
fn every_value_of_the_wrong_type_is_reported_at_once_with_its_key() {
    let text = "[server]\nmax_connections = \"many\"\nshutdown_timeout = 30\n\n[policies.a]\nalgorithm = \"token-bucket\"\ncapacity = \"ten\"\nrate = 2\n";
    let errors = parse(text, &Env::default()).unwrap_err().to_string();
    for expected in [
        "line 2: [server] max_connections: invalid type: string \"many\"",
        "line 3: [server] shutdown_timeout: invalid type: integer `30`, expected a string (a duration: write shutdown_timeout = \"30s\")",
        "line 7: [policies.a] capacity:",
        "line 8: [policies.a] rate:",
    ] {
        assert!(errors.contains(expected), "{expected}\n{errors}");
    }
}

#[test]
fn tls_settings_without_tls_are_an_error() {
    let ca = std::env::temp_dir().join(format!("weir-ca-{}.pem", std::process::id()));
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = |url: &str| {
        format!(
            "[store]\nurl = \"{url}\"\ntls_ca = \"{}\"\n\n[policies.a]\nalgorithm = \"gcra\"\nburst = 1\nrate = \"1/s\"\n",
            ca.display()
        )
    };
    let error = parse(&text("redis://cache:6379"), &Env::default())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("line 3: [store] tls_ca: is for TLS to Redis"),
        "{error}"
    );
    assert!(parse(&text("rediss://cache:6379"), &Env::default()).is_ok());
    let _ = std::fs::remove_file(&ca);
}
