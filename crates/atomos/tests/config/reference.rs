//! The generated reference and the effective configuration: both the code's, and the latter
//! loads back to the same settings.

use atomos::config::{load, write_key_file};

use super::helpers::*;

#[test]
fn the_configuration_reference_in_the_guide_is_the_code_s() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/guide/configuration.md"
    );
    let committed = std::fs::read_to_string(path).unwrap();
    let generated = atomos::config::reference_markdown();
    assert!(
        committed == generated,
        "docs/guide/configuration.md differs from the settings table: regenerate it with \
         `cargo run -p atomos-cli -- config-reference > docs/guide/configuration.md`"
    );
    for row in atomos::config::SETTINGS.iter() {
        assert!(
            generated.contains(&format!("### {}\n", row.key)),
            "{}",
            row.key
        );
        assert!(generated.contains(&row.variable()), "{}", row.key);
    }
}

#[test]
fn the_effective_configuration_loads_back_to_the_same_settings() {
    // A key file of its own: other tests rewrite `key_file(1)`'s while they run.
    let own_key = file("round-trip-1.key", "");
    write_key_file(&own_key, &keys(1), "a test", true).unwrap();
    let own_key = own_key.display().to_string();
    let text = format!(
        "cluster = \"prod\"\nnode_id = 1\nlisten = \"127.0.0.1:7501\"\ndata_dir = \"/tmp/x\"\n\
         key_file = {own_key:?}\nprotocol = \"oss\"\ncontention = \"priority\"\n\
         log_level = \"info,atomos_order=debug\"\nlog_format = \"json\"\nmetrics = \"9501\"\n\
         metrics_hot_spot_keys = true\nmax_frame_bytes = 4096\nbusy_poll_us = 0\n\
         answer_poll_us = 7\norder_fsync = \"10ms\"\norder_load_clients = 2\n\
         order_snapshot_every = 50\nbank_load_threads = 3\ncommit_timeout_ms = 1234\n\
         order_rejoin = true\norder_join = false\noperators = [\"app\"]\noss_commit = \"coordinator-token\"\noss_domains = [\"a/\", \"b/\"]\n\
         sched = \"lazy:8\"\nsched_workers = 3\nruntime_threads = 2\nclient_requests_max = 9\n\
         client_request_timeout_ms = 250\n\
         [[peers]]\nid = 2\naddress = \"127.0.0.1:7502\"\npublic_key = [\"{}\", \"{}\"]\n\
         [[clients]]\nname = \"app\"\npublic_key = \"{}\"\n",
        pk(2),
        pk(4),
        pk(3)
    );
    let first = load(
        Some(&file("full.toml", &text)),
        env(&[("ATOMOS_SECRET", SECRET)]),
    )
    .unwrap();
    let shown = atomos::config::effective_toml(&first);
    assert!(!shown.contains(SECRET), "the secret is never written");
    for row in atomos::config::SETTINGS
        .iter()
        .filter(|r| r.key != "secret")
    {
        assert!(
            shown.contains(&format!("{} = ", row.key))
                || shown.contains(&format!("[[{}]]", row.key)),
            "{} missing:\n{shown}",
            row.key
        );
    }
    let again = load(
        Some(&file("effective.toml", &shown)),
        env(&[("ATOMOS_SECRET", SECRET)]),
    )
    .unwrap();
    assert_eq!(first, again);
}
