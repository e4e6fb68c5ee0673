//! The documented config file, unknown keys and validation messages.

use kvgate::config::Config;

#[test]
fn documented_default_file_is_exactly_the_default() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/kvgate.toml");
    let c = Config::from_file(std::path::Path::new(path)).unwrap();
    assert_eq!(c, Config::default());
    c.validate().unwrap();
}

#[test]
fn unknown_keys_fail_naming_the_key() {
    let e = Config::from_toml_str(
        "[server]\nlisten = \"127.0.0.1:1\"\nlisten_port = 3\n",
        "t.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("listen_port"), "{e}");
    let e = Config::from_toml_str("[sever]\n", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("sever"), "{e}");
    let e = Config::from_toml_str(
        "[[pools]]\nmodel = \"m\"\ninstances = [{ url = \"http://h:1\", weight = 2 }]\n",
        "t.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("weight"), "{e}");
}

#[test]
fn wrong_types_and_invalid_values_name_the_key() {
    let e = Config::from_toml_str("[upstream]\nmax_attempts = \"three\"\n", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_attempts"), "{e}");
    let c = Config::from_toml_str("[upstream]\nmax_attempts = 0\n", "t.toml").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("upstream.max_attempts"), "{e}");
    let c = Config::from_toml_str(
        "[[pools]]\nmodel = \"m\"\ninstances = [{ url = \"https://h:1\" }]\n",
        "t.toml",
    )
    .unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("pools[0].instances[0].url"), "{e}");
    let c = Config::from_toml_str("[[pools]]\nmodel = \"m\"\ninstances = []\n", "t.toml").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("pools[0].instances"), "{e}");
}

#[test]
fn env_overrides_win_over_the_file() {
    let mut c = Config::from_toml_str("[server]\nlisten = \"127.0.0.1:1\"\n", "t.toml").unwrap();
    c.apply_env(|k| match k {
        "KVGATE_LISTEN" => Some("127.0.0.1:2".into()),
        "KVGATE_SHUTDOWN_GRACE_MS" => Some("7".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:2");
    assert_eq!(c.server.shutdown_grace_ms, 7);
}

#[test]
fn default_round_trips_through_toml() {
    let text = toml::to_string(&Config::default()).unwrap();
    if std::env::var_os("KVGATE_PRINT_DEFAULT").is_some() {
        println!("{text}");
    }
    assert_eq!(
        Config::from_toml_str(&text, "rt").unwrap(),
        Config::default()
    );
}
