//! `weir simulate` as other tools use it: every shared vector, the output
//! contract, and errors that name the line or flag and exit 2.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/vectors")
}

fn weir(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weir runs");
    // weir may exit (on a bad flag) before reading its input.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The table of testdata/vectors/README.md.
const VECTORS: [(&str, &str, &str); 16] = [
    (
        "token-bucket.expected.csv",
        "token-bucket.csv",
        "--algorithm token-bucket --capacity 10 --rate 2/s",
    ),
    (
        "gcra.expected.csv",
        "token-bucket.csv",
        "--algorithm gcra --burst 10 --rate 2/s",
    ),
    (
        "token-bucket-cost.expected.csv",
        "token-bucket-cost.csv",
        "--algorithm token-bucket --capacity 10 --rate 2/s",
    ),
    (
        "fixed-window.expected.csv",
        "fixed-window.csv",
        "--algorithm fixed-window --limit 120 --window 60s",
    ),
    (
        "sliding-log-boundary.expected.csv",
        "fixed-window.csv",
        "--algorithm sliding-log --limit 120 --window 60s",
    ),
    (
        "sliding-log.expected.csv",
        "sliding-log.csv",
        "--algorithm sliding-log --limit 3 --window 60s",
    ),
    (
        "sliding-counter.expected.csv",
        "sliding-counter.csv",
        "--algorithm sliding-counter --limit 120 --window 60s",
    ),
    (
        "leaky-bucket.expected.csv",
        "leaky-bucket.csv",
        "--algorithm leaky-bucket --rate 2/s --queue 10",
    ),
    (
        "token-bucket-report.expected.csv",
        "usage-report.csv",
        "--algorithm token-bucket --capacity 10 --rate 2/s",
    ),
    (
        "leaky-bucket-report.expected.csv",
        "usage-report.csv",
        "--algorithm leaky-bucket --rate 2/s --queue 10",
    ),
    (
        "fixed-window-report.expected.csv",
        "usage-report-window.csv",
        "--algorithm fixed-window --limit 120 --window 60s",
    ),
    (
        "sliding-log-report.expected.csv",
        "usage-report-window.csv",
        "--algorithm sliding-log --limit 120 --window 60s",
    ),
    (
        "sliding-counter-report.expected.csv",
        "usage-report-window.csv",
        "--algorithm sliding-counter --limit 120 --window 60s",
    ),
    (
        "concurrency.expected.csv",
        "concurrency.csv",
        "--algorithm concurrency --limit 3 --lease 30s",
    ),
    (
        "token-bucket-penalty.expected.csv",
        "penalty.csv",
        "--algorithm token-bucket --capacity 1 --rate 1/s --ban 2s --ban-factor 3 --ban-max 10s --ban-memory 30s",
    ),
    (
        "calendar-month.expected.csv",
        "calendar-month.csv",
        "--algorithm fixed-window --limit 3 --calendar month --zone Europe/Paris --anchor 15",
    ),
];

#[test]
fn every_shared_vector_matches() {
    for (expected, trace, flags) in VECTORS {
        let trace = vectors().join(trace);
        let mut args: Vec<&str> = vec!["simulate"];
        args.extend(flags.split(' '));
        args.extend(["--trace", trace.to_str().unwrap()]);
        let out = weir(&args, "");
        assert!(out.status.success(), "{expected}: {}", text(&out.stderr));
        let want = std::fs::read_to_string(vectors().join(expected)).unwrap();
        assert_eq!(text(&out.stdout), want, "{expected}");
    }
}

/// The same vectors, reports included, decided by the Redis store's script
/// on a real `redis-server` (started here on a free port).
#[test]
fn every_shared_vector_matches_on_redis() {
    let redis = weir_testkit::RedisServer::start(&[]);
    every_vector_on(&redis.url());
}

/// The same on a three-node Redis Cluster: keys on every node.
#[test]
fn every_shared_vector_matches_on_a_cluster() {
    let cluster = weir_testkit::Cluster::start();
    every_vector_on(&cluster.url());
}

/// A trace of checks, probes and reports (with leases, releases among
/// them, for a concurrency policy), from a fixed seed: at most a few
/// seconds apart, on two keys, costs 0 to 2.
fn mixed_trace(seed: u64, leases: bool) -> String {
    let mut x = seed;
    let mut next = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut out = String::from("time,cost,op,key,lease\n");
    let (mut tenths, mut taken) = (0u64, 0u64);
    for _ in 0..300 {
        tenths += [0, 0, 1, 3, 7, 13, 29, 70][next(8) as usize];
        let key = ["a", "b"][next(2) as usize];
        let time = format!("{}.{}", tenths / 10, tenths % 10);
        let row = match (leases, next(7)) {
            (true, 0) => format!("{time},1,release,{key},l{}", next(taken.max(1))),
            (true, n) => {
                taken += 1;
                let op = if n < 4 { "check" } else { "probe" };
                format!("{time},1,{op},{key},l{taken}")
            }
            (false, n) => {
                let op = [
                    "check", "check", "check", "probe", "probe", "report", "check",
                ][n as usize];
                format!("{time},{},{op},{key},", [0, 1, 1, 2][next(4) as usize])
            }
        };
        out.push_str(&row);
        out.push('\n');
    }
    out
}

/// `weir FLAGS` on `trace` in process and with `--store url`: the same
/// output, which it returns.
fn same_on(url: &str, flags: &str, trace: &str) -> String {
    let args: Vec<&str> = flags.split_whitespace().collect();
    let here = weir(&args, trace);
    assert!(here.status.success(), "{flags}: {}", text(&here.stderr));
    let on_store = [&args[..], &["--store", url]].concat();
    let there = weir(&on_store, trace);
    assert!(there.status.success(), "{flags}: {}", text(&there.stderr));
    let here = text(&here.stdout);
    assert_eq!(here, text(&there.stdout), "{flags}");
    here
}

/// Probes and penalties on every algorithm: the Redis script decides every
/// row of long mixed traces as the core does, bans growing and forgotten.
#[test]
fn probes_and_penalties_agree_in_process_and_on_redis() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let url = redis.url();
    let penalties = [
        "",
        "--ban 1s --ban-factor 2 --ban-max 9s --ban-memory 30s",
        "--ban 3s",
    ];
    for policy in [
        "--algorithm token-bucket --capacity 3 --rate 1/s",
        "--algorithm gcra --burst 3 --rate 2/3s",
        "--algorithm fixed-window --limit 3 --window 5s",
        "--algorithm sliding-log --limit 3 --window 5s",
        "--algorithm sliding-counter --limit 3 --window 5s",
        "--algorithm leaky-bucket --rate 1/s --queue 3",
        "--algorithm concurrency --limit 2 --lease 5s",
    ] {
        let trace = mixed_trace(7, policy.contains("concurrency"));
        for penalty in penalties {
            let flags = format!("simulate {policy} {penalty} --trace -");
            let here = same_on(&url, &flags, &trace);
            if !penalty.is_empty() {
                let refused = |l: &&str| l.contains(",probe,") && l.contains(",false,");
                assert!(
                    here.lines().any(|l| refused(&l)),
                    "{flags}: a probe refused"
                );
            }
        }
    }
}

/// Calendar windows across month ends and daylight-saving changes (a
/// midnight that does not exist, one that exists twice), on every period:
/// the Redis script, handed each window's boundaries, decides every row as
/// the core does — years included, whose windows are longer than a double
/// holds in nanoseconds.
#[test]
fn calendar_windows_agree_in_process_and_on_redis() {
    let redis = weir_testkit::RedisServer::start(&[]);
    let url = redis.url();
    // Around 2026-03-29 (Europe: summer time; the Azores' midnight missing),
    // 2026-09-06 (Santiago's midnight missing), 2026-10-25 (the Azores'
    // midnight twice) and month and year ends.
    let centres: [u64; 5] = [
        1_774_742_400,
        1_788_667_200,
        1_792_886_400,
        1_798_675_200,
        1_772_236_800,
    ];
    let mut x: u64 = 11;
    let mut next = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut trace = String::from("time,cost,op,key\n");
    for &centre in &centres {
        let mut t = centre - 2 * 86_400;
        for _ in 0..60 {
            t += [0, 60, 3_600, 7_200, 21_600, 43_200][next(6) as usize];
            let op = ["check", "check", "check", "report", "probe"][next(5) as usize];
            let key = ["a", "b"][next(2) as usize];
            trace.push_str(&format!("{t}.{},{},{op},{key}\n", next(10), 1 + next(2)));
        }
    }
    for calendar in [
        "--calendar day --zone Europe/Paris",
        "--calendar day --zone Atlantic/Azores",
        "--calendar day --zone America/Santiago",
        "--calendar week --zone America/New_York",
        "--calendar month --zone Europe/Paris --anchor 31",
        "--calendar month --zone Australia/Sydney --anchor 15",
        "--calendar year --zone Asia/Tokyo",
    ] {
        let flags = format!("simulate --algorithm fixed-window --limit 5 {calendar} --trace -");
        same_on(&url, &flags, &trace);
    }
}

fn every_vector_on(url: &str) {
    let url = url.to_owned();
    for (expected, trace, flags) in VECTORS {
        let trace = vectors().join(trace);
        let mut args: Vec<&str> = vec!["simulate", "--store", &url];
        args.extend(flags.split(' '));
        args.extend(["--trace", trace.to_str().unwrap()]);
        let out = weir(&args, "");
        assert!(out.status.success(), "{expected}: {}", text(&out.stderr));
        let want = std::fs::read_to_string(vectors().join(expected)).unwrap();
        assert_eq!(text(&out.stdout), want, "{expected} on {url}");
    }
}

#[test]
fn reads_stdin_and_prints_json_lines() {
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "leaky-bucket",
            "--rate",
            "3/s",
            "--queue",
            "1",
            "--trace",
            "-",
            "--format",
            "json",
        ],
        "time,key\n0,\"a,b\"\n0,\"a,b\"\n0,\"a,b\"\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<_> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [
            r#"{"time":0,"key":"a,b","cost":1,"allowed":true,"remaining":1,"retry_after":0.000000000,"reset":0.333333334,"delay":0.000000000}"#,
            r#"{"time":0,"key":"a,b","cost":1,"allowed":true,"remaining":0,"retry_after":0.000000000,"reset":0.666666667,"delay":0.333333334}"#,
            r#"{"time":0,"key":"a,b","cost":1,"allowed":false,"remaining":0,"retry_after":0.333333334,"reset":0.666666667,"delay":0.000000000}"#,
        ]
    );
}

#[test]
fn csv_output_quotes_keys_and_echoes_times() {
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "fixed-window",
            "--limit",
            "1",
            "--window",
            "1500ms",
            "--trace",
            "-",
        ],
        "time,key,cost\n1.500000000,\"x,\"\"y\"\"\",1\n0.1,plain,\n",
    );
    assert_eq!(
        text(&out.stdout),
        "time,key,cost,allowed,remaining,retry_after,reset,delay\n\
         1.500000000,\"x,\"\"y\"\"\",1,true,0,0.000000000,1.500000000,0.000000000\n\
         0.1,plain,1,true,0,0.000000000,1.400000000,0.000000000\n"
    );
}

#[test]
fn bad_rows_exit_2_naming_the_line_and_print_nothing_after() {
    let flags = [
        "simulate",
        "--algorithm",
        "token-bucket",
        "--capacity",
        "10",
        "--rate",
        "2/s",
        "--trace",
        "-",
    ];
    for (trace, message, rows) in [
        (
            "time,cost\n0,1\n0,11\n1,1\n",
            "line 3: cost 11 can never be admitted: it is larger than the policy's capacity (10)",
            1,
        ),
        ("time\n0\n-1\n1\n", "line 3: `time` \"-1\"", 1),
        (
            "time\n0\n0.1234567891\n",
            "line 3: `time` \"0.1234567891\": at most 9 digits",
            1,
        ),
        (
            "time,cost\n0,1\n0,1.5\n",
            "line 3: `cost` \"1.5\": expected a whole number",
            1,
        ),
        (
            "time,colour\n0,red\n",
            "line 1: unknown column `colour` (valid columns: time, cost, key, op, lease)",
            0,
        ),
        (
            "time\n0\n0,1\n",
            "line 3: expected 1 fields as in the header, found 2",
            1,
        ),
    ] {
        let out = weir(&flags, trace);
        assert_eq!(out.status.code(), Some(2), "{trace}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(message), "{trace}: {stderr}");
        let stdout = text(&out.stdout);
        assert_eq!(stdout.lines().count(), 1 + rows, "{trace}: {stdout}");
    }
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    for (args, message) in [
        (
            vec![
                "--algorithm",
                "token-bucket",
                "--capacity",
                "0",
                "--rate",
                "2/s",
            ],
            "--capacity: `0` is not valid",
        ),
        (
            vec![
                "--algorithm",
                "token-bucket",
                "--capacity",
                "10",
                "--rate",
                "2/x",
            ],
            "--rate: `2/x` is not valid: `x` is not a unit",
        ),
        (
            vec!["--algorithm", "token-bucket", "--capacity", "10"],
            "--rate: missing (token-bucket takes capacity, rate)",
        ),
        (
            vec![
                "--algorithm",
                "fixed-window",
                "--limit",
                "5",
                "--window",
                "1s",
                "--queue",
                "2",
            ],
            "--queue: not a parameter of fixed-window",
        ),
        (
            vec![
                "--algorithm",
                "sliding-counter",
                "--limit",
                "100000",
                "--window",
                "400d",
            ],
            "--window: 400d is longer than 366d",
        ),
        (
            vec!["--algorithm", "bucket"],
            "invalid value 'bucket' for '--algorithm <ALG>'",
        ),
        (vec!["--capacity", "3"], "--capacity needs --algorithm"),
    ] {
        let mut all = vec!["simulate"];
        all.extend(&args);
        all.extend(["--trace", "-"]);
        let out = weir(&all, "time\n0\n");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains(message),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty());
    }
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--burst",
            "1",
            "--rate",
            "1/s",
            "--trace",
            "/nonexistent.csv",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--trace: cannot read /nonexistent.csv"));
}

#[test]
fn compare_prints_a_table_and_draws_a_plot() {
    let dir = std::env::temp_dir().join(format!("weir-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("lanes.svg");
    let policies = dir.join("policies.toml");
    std::fs::write(
        &policies,
        "[policies.per-minute]\nalgorithm = \"sliding-log\"\nlimit = 120\nwindow = \"60s\"\n",
    )
    .unwrap();
    let trace = vectors().join("fixed-window.csv");
    let out = weir(
        &[
            "simulate",
            "--compare",
            "--policy",
            "fixed-window limit=120 window=60s",
            "--policies",
            policies.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap()
            .split_whitespace()
            .next_back()
            .unwrap()
            .to_owned()
    };
    assert_eq!(row("fixed-window"), "240", "{table}");
    assert_eq!(row("per-minute"), "120", "{table}");
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg"));
    assert!(
        picture.contains("per-minute: admitted 120, rejected 121"),
        "lane caption"
    );
    // Labelled axes, a legend with the window boundaries, a close-up.
    for text in [
        "requests per ",
        "window boundary",
        "close-up of the busiest",
        "time (s)",
    ] {
        assert!(picture.contains(text), "{text} in the plot");
    }
    // A `.png` is a PNG of the same picture; another name is refused.
    let plot = |name: &str| {
        let file = dir.join(name);
        let args = [
            "simulate",
            "--compare",
            "--policy",
            "fixed-window limit=120 window=60s",
        ];
        let more = [
            "--trace",
            trace.to_str().unwrap(),
            "--plot",
            file.to_str().unwrap(),
        ];
        (weir(&[&args[..], &more[..]].concat(), ""), file)
    };
    let (out, png) = plot("lanes.png");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let (out, _) = plot("lanes.jpg");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(".svg or .png"),
        "{}",
        text(&out.stderr)
    );
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[policies.a]\nalgorithm = \"gcra\"\nburst = 0\nrate = \"1/s\"\n",
    )
    .unwrap();
    let out = weir(
        &[
            "simulate",
            "--compare",
            "--policies",
            bad.to_str().unwrap(),
            "--scenario",
            "boundary-burst",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.toml:line 3: [policies.a] burst:"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn scenarios_run_without_a_trace() {
    let out = weir(
        &["simulate", "--compare", "--scenario", "boundary-burst"],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("fixed-window limit=120 window=1m"));
    let out = weir(
        &[
            "simulate",
            "--algorithm",
            "gcra",
            "--burst",
            "5",
            "--rate",
            "1/s",
            "--scenario",
            "steady-overload",
        ],
        "",
    );
    assert_eq!(text(&out.stdout).lines().count(), 241);
    let out = weir(&["simulate", "--compare", "--scenario", "nope"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("boundary-burst"),
        "lists the scenarios"
    );
}
