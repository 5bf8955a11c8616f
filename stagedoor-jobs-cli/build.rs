//! Which test servers the tests may reach, as `cfg`s the server-backed tests read
//! (`#[cfg_attr(not(stagedoor_redis), ignore = "needs Redis: run scripts/test-all")]`): a plain
//! `cargo test` on a machine without servers runs everything else and lists each of those as
//! ignored, with the command that runs them.
//!
//! Each cfg is set when its URL is (`REDIS_URL`, `REDIS_CLUSTER_URLS`, `REDIS_TLS_URL`, a
//! `postgres://` `DATABASE_URL`, `STAGEDOOR_CHROMEDRIVER` for the browser), and all of them under
//! `STAGEDOOR_TEST_SERVERS=1` (scripts/test-all), where a missing server is a failure, never a
//! skip. The workspace's root package uses this same file (its `build` key).

fn main() {
    const CFGS: [(&str, &str); 5] = [
        ("stagedoor_redis", "REDIS_URL"),
        ("stagedoor_cluster", "REDIS_CLUSTER_URLS"),
        ("stagedoor_redis_tls", "REDIS_TLS_URL"),
        ("stagedoor_postgres", "DATABASE_URL"),
        ("stagedoor_browser", "STAGEDOOR_CHROMEDRIVER"),
    ];
    println!(
        "cargo::rustc-check-cfg=cfg({})",
        CFGS.map(|(cfg, _)| cfg).join(", ")
    );
    println!("cargo::rerun-if-env-changed=STAGEDOOR_TEST_SERVERS");
    let all = std::env::var("STAGEDOOR_TEST_SERVERS").is_ok_and(|v| !v.is_empty() && v != "0");
    for (cfg, var) in CFGS {
        println!("cargo::rerun-if-env-changed={var}");
        let value = std::env::var(var).unwrap_or_default();
        let set = match var {
            // An SQLite URL there is the examples' business, not a Postgres server.
            "DATABASE_URL" => value.starts_with("postgres"),
            _ => !value.is_empty(),
        };
        if all || set {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}
