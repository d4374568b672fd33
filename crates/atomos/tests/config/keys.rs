//! Client request limits, member and client keys, client configuration files, log settings.

use std::time::Duration;

use atomos::config::{load, load_client, write_key_file};

use super::helpers::*;

#[test]
fn client_request_limits_are_read_and_checked() {
    let d = load(None, env(&[])).unwrap();
    assert_eq!(d.client_requests_max, 64);
    assert_eq!(d.client_request_timeout, Duration::from_secs(10));
    let s = load(
        None,
        env(&[
            ("ATOMOS_CLIENT_REQUESTS_MAX", "8"),
            ("ATOMOS_CLIENT_REQUEST_TIMEOUT_MS", "250"),
        ]),
    )
    .unwrap();
    assert_eq!(s.client_requests_max, 8);
    assert_eq!(s.client_request_timeout, Duration::from_millis(250));
    for (var, value) in [
        ("ATOMOS_CLIENT_REQUESTS_MAX", "0"),
        ("ATOMOS_CLIENT_REQUESTS_MAX", "100000"),
        ("ATOMOS_CLIENT_REQUEST_TIMEOUT_MS", "0"),
    ] {
        assert_eq!(key_of(load(None, env(&[(var, value)])).unwrap_err()), var);
    }
}

#[test]
fn member_and_client_keys_are_read_and_checked() {
    let own = key_file(1);
    let base = |extra: &[(&'static str, String)]| {
        let mut vars = vec![
            ("ATOMOS_NODE_ID", "1".to_string()),
            ("ATOMOS_SECRET", SECRET.to_string()),
            ("ATOMOS_KEY_FILE", own.clone()),
            ("ATOMOS_LISTEN", "127.0.0.1:7401".to_string()),
            ("ATOMOS_PEERS", format!("2=127.0.0.1:7402/{}", pk(2))),
        ];
        for (k, v) in extra {
            vars.retain(|(key, _)| key != k);
            vars.push((k, v.clone()));
        }
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        }
    };
    assert!(load(None, base(&[])).is_ok());
    let refused = |extra: &[(&'static str, String)]| {
        let err = load(None, base(extra)).unwrap_err();
        (key_of(err.clone()), err.to_string())
    };
    // No key file, though the node has peers.
    let err = load(
        None,
        env(&[
            ("ATOMOS_NODE_ID", "1"),
            ("ATOMOS_SECRET", SECRET),
            ("ATOMOS_PEERS", &format!("2=127.0.0.1:7402/{}", pk(2))),
        ]),
    )
    .unwrap_err();
    assert_eq!(key_of(err), "key_file");
    // A key file others may read.
    let open = file("open.key", "");
    write_key_file(&open, &keys(1), "a test", true).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (key, text) = refused(&[("ATOMOS_KEY_FILE", open.display().to_string())]);
    assert_eq!(key, "ATOMOS_KEY_FILE");
    assert!(text.contains("chmod 600"), "{text}");
    // Not a key file; a key file whose public key is not its private key's.
    let junk = file("junk.key", "hello");
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        refused(&[("ATOMOS_KEY_FILE", junk.display().to_string())]).0,
        "ATOMOS_KEY_FILE"
    );
    let lying = file(
        "lying.key",
        &format!(
            "public_key = \"{}\"\nprivate_key = \"{}\"\n",
            pk(2),
            keys(1).private_hex().as_str()
        ),
    );
    std::fs::set_permissions(&lying, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (key, text) = refused(&[("ATOMOS_KEY_FILE", lying.display().to_string())]);
    assert_eq!(key, "ATOMOS_KEY_FILE");
    assert!(text.contains("does not belong"), "{text}");
    // A member without a key, a malformed key, one key for two members, this node listed
    // with a key that is not its own.
    let (key, text) = refused(&[("ATOMOS_PEERS", "2=127.0.0.1:7402".into())]);
    assert_eq!(key, "ATOMOS_PEERS");
    assert!(text.contains("member 2 has no public_key"), "{text}");
    assert_eq!(
        refused(&[("ATOMOS_PEERS", "2=127.0.0.1:7402/abc".into())]).0,
        "ATOMOS_PEERS"
    );
    let shared = format!("2=127.0.0.1:7402/{},3=127.0.0.1:7403/{}", pk(2), pk(2));
    assert_eq!(refused(&[("ATOMOS_PEERS", shared)]).0, "ATOMOS_PEERS");
    let not_mine = format!("1=127.0.0.1:7401/{},2=127.0.0.1:7402/{}", pk(5), pk(2));
    assert_eq!(refused(&[("ATOMOS_PEERS", not_mine)]).0, "ATOMOS_PEERS");
    let mine = format!("1=127.0.0.1:7401/{},2=127.0.0.1:7402/{}", pk(1), pk(2));
    assert!(load(None, base(&[("ATOMOS_PEERS", mine)])).is_ok());
    // Clients: a member's key, a name twice, malformed entries.
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", format!("app={}", pk(2)))]).0,
        "ATOMOS_CLIENTS"
    );
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", format!("app={},app={}", pk(8), pk(9)))]).0,
        "ATOMOS_CLIENTS"
    );
    // A node alone that lists clients needs its own key and the secret: otherwise it makes
    // random ones and no client could ever connect.
    let alone = env(&[("ATOMOS_CLIENTS", &format!("app={}", pk(8)))]);
    assert_eq!(key_of(load(None, alone).unwrap_err()), "key_file");
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", "app".into())]).0,
        "ATOMOS_CLIENTS"
    );
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", "app=12".into())]).0,
        "ATOMOS_CLIENTS"
    );
    let path = file(
        "bad-client.toml",
        "[[clients]]\nname = \"app\"\npublic_key = \"zz\"\n",
    );
    let twice = file(
        "twice-client.toml",
        &format!(
            "[[clients]]\nname = \"app\"\npublic_key = \"{}\"\n\
             [[clients]]\nname = \"app\"\npublic_key = \"{}\"\n",
            pk(8),
            pk(9)
        ),
    );
    assert_eq!(
        key_of(load(Some(&twice), base(&[])).unwrap_err()),
        "clients"
    );
    assert_eq!(
        key_of(load(Some(&path), env(&[])).unwrap_err()),
        "clients[0].public_key"
    );
}

#[test]
fn a_client_configuration_file_is_read_and_checked() {
    let client_key = file("client.key", "");
    write_key_file(&client_key, &keys(30), "a test client", true).unwrap();
    let text = format!(
        "cluster = \"prod\"\nsecret = \"{SECRET}\"\nkey_file = \"client.key\"\nlimit_ms = 2500\n\
         [[members]]\nid = 1\naddress = \"127.0.0.1:7401\"\npublic_key = \"{}\"\n\
         [[members]]\nid = 2\naddress = \"127.0.0.1:7402\"\npublic_key = [\"{}\", \"{}\"]\n",
        pk(1),
        pk(2),
        pk(22)
    );
    let cfg = load_client(&file("client.toml", &text)).unwrap();
    assert_eq!(cfg.cluster, "prod");
    assert_eq!(
        cfg.key.public(),
        keys(30).public(),
        "key_file is beside the file"
    );
    assert_eq!(cfg.members.len(), 2);
    assert_eq!(
        cfg.member_keys[&2],
        vec![keys(2).public(), keys(22).public()]
    );
    assert_eq!(cfg.limit, Duration::from_millis(2500));
    let bad = |text: String| key_of(load_client(&file("bad-client-cfg.toml", &text)).unwrap_err());
    assert_eq!(bad(text.replace(&pk(1), "nothex")), "members[0].public_key");
    assert_eq!(bad(text.replace("client.key", "missing.key")), "key_file");
    assert_eq!(bad(text.replace(SECRET, "short")), "secret");
    assert_eq!(bad(text.replace("2500", "0")), "limit_ms");
}

/// Logging: a level or filter directives, text or JSON; anything else names its key.
#[test]
fn log_filters_and_formats_are_read_and_checked() {
    use atomos::config::LogFormat;
    let s = load(None, env(&[])).unwrap();
    assert_eq!(
        (s.log_level.as_str(), s.log_format),
        ("info", LogFormat::Text)
    );
    let s = load(
        None,
        env(&[
            ("ATOMOS_LOG_LEVEL", "info,atomos_order=debug"),
            ("ATOMOS_LOG_FORMAT", "json"),
        ]),
    )
    .unwrap();
    assert_eq!(s.log_level, "info,atomos_order=debug");
    assert_eq!(s.log_format, LogFormat::Json);
    let bad = load(None, env(&[("ATOMOS_LOG_LEVEL", "loud=[")])).unwrap_err();
    assert_eq!(key_of(bad), "ATOMOS_LOG_LEVEL");
    let path = file("bad-format.toml", "log_format = \"xml\"\n");
    assert_eq!(
        key_of(load(Some(&path), env(&[])).unwrap_err()),
        "log_format"
    );
}
