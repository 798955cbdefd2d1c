//! Bad input never panics and never gets a 5xx: the config parser and the
//! decision API under random input (proptest-driven fuzzing, bounded so it
//! runs in CI).

use axum::body::Body;
use proptest::prelude::*;
use tower::ServiceExt;
use weir_server::{AppState, Shared, app, config};

const CONFIG: &str = "[policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate = \"1/s\"\n\n[policies.log]\nalgorithm = \"sliding-log\"\nlimit = 3\nwindow = \"1s\"\n";

/// Pieces a config is made of, to build plausible broken ones.
fn config_text() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        Just("[server]".to_owned()),
        Just("[store]".to_owned()),
        Just("[[routes]]".to_owned()),
        Just("[[descriptors]]".to_owned()),
        "\\[policies\\.[a-z-]{0,6}\\]",
        "(listen|grpc|admin_token|url|timeout|max_keys|fallback_share|algorithm|capacity|rate|limit|window|queue|burst|on_store_error|on_state_loss|match|identity|policies|upstream|max_wait|domain|entries|policy) = (\"[ -~]{0,12}\"|-?[0-9]{1,20}|\\[\"[a-z=]{0,6}\"\\]|true|1\\.5|0\\.25)",
        "[ -~]{0,20}",
    ];
    prop::collection::vec(line, 0..20).prop_map(|lines| lines.join("\n"))
}

fn json_body() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("\"api\"".to_owned()),
        Just("\"log\"".to_owned()),
        "\"[ -~]{0,10}\"",
        "-?[0-9]{1,22}",
        Just("null".to_owned()),
        Just("[]".to_owned()),
        Just("[{\"policy\":\"api\",\"key\":\"k\"},{\"policy\":\"log\",\"key\":\"k\"}]".to_owned()),
    ];
    let field = ("(policy|key|cost|checks|other)", value).prop_map(|(k, v)| format!("\"{k}\":{v}"));
    prop_oneof![
        prop::collection::vec(field, 0..5).prop_map(|fields| format!("{{{}}}", fields.join(","))),
        "[ -~]{0,40}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_config_parser_never_panics(text in config_text()) {
        match config::parse(&text, &Default::default()) {
            Ok(config) => prop_assert!(!config.policies.is_empty()),
            Err(errors) => prop_assert!(!errors.0.is_empty() && errors.0.iter().all(|e| !e.message.is_empty())),
        }
    }

    #[test]
    fn the_decision_api_answers_every_body_with_a_decision_or_a_4xx(body in json_body()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let status = runtime.block_on(async {
            let state = AppState::new(Shared::new(config::parse(CONFIG, &Default::default()).unwrap(), None).unwrap());
            let request = http::Request::post("/v1/check").body(Body::from(body.clone())).unwrap();
            app(state, weir_server::Face::All).oneshot(request).await.unwrap().status().as_u16()
        });
        prop_assert!(status == 200 || (400..500).contains(&status), "{status} for {body}");
    }
}
