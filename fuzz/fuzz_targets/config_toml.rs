//! Configuration loading (`kvgate::config::Config`): parsing any TOML text and validating what
//! parses never panics, and a configuration that validates yields the derived settings without
//! panicking either.
#![no_main]

use kvgate::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(config) = Config::from_toml_str(text, "fuzz.toml") else {
        return;
    };
    if config.validate().is_ok() {
        let _ = config.routing.router_config();
        let _ = config.routing.index.to_core();
    }
});
