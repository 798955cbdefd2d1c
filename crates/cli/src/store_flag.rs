//! `--store URL`, shared by `weir bench` and `weir simulate`.

/// A Redis store for `--store URL` (`weir bench`, `weir simulate`): the
/// password from `WEIR_REDIS_PASSWORD` where set, as `weir serve` takes it,
/// and the URL shown with its password hidden in any error.
pub(crate) async fn redis_store(url: &str) -> anyhow::Result<weir_redis::RedisStore> {
    let access = weir_redis::Access {
        password: std::env::var("WEIR_REDIS_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty()),
        ..weir_redis::Access::default()
    };
    weir_redis::RedisStore::connect_with(url, &access)
        .await
        .map_err(|e| anyhow::anyhow!("--store {}: {e}", weir_redis::redacted(url)))
}
