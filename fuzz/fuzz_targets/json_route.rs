//! The routing-field reader (`kvgate::proxy::parse::parse`) on arbitrary bytes, against
//! serde_json and the reference extraction in `kvgate_fuzz::json` (see `fuzz/dict/json.dict`).
#![no_main]

use kvgate_fuzz::json::{check_route, endpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    check_route(endpoint(sel), body);
});
