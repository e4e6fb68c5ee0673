#!/usr/bin/env bash
# A rolling upgrade's middle, for real: builds the kvgate binary of an earlier release from git
# history and runs tests/gossip_upgrade.rs, where that binary gossips with this release's gateway
# in front of the same engines.
#
#   tests/gossip_upgrade.sh [<git-ref>]       (default: the release before load_sized, 0d86d74)
#
# The earlier binary is cached under target/earlier/ by commit. Not run by CI: building an
# earlier release takes minutes and needs the history of the clone.
set -euo pipefail

ref=${1:-0d86d74}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$(git -C "$root" rev-parse --verify "$ref^{commit}")
bin="$root/target/earlier/kvgate-$commit"

if [[ ! -x $bin ]]; then
    # shellcheck source=lib/earlier_tree.sh
    source "$root/tests/lib/earlier_tree.sh"
    earlier_tree "$root" "$commit"
    # Its own target directory: the earlier lock file may pin other versions, and its binary
    # must not replace this tree's.
    CARGO_TARGET_DIR="${KVGATE_EARLIER_TARGET_DIR:-$root/target/earlier/build}" \
        cargo build --quiet --manifest-path "$tree/Cargo.toml" --bin kvgate
    mkdir -p "$(dirname "$bin")"
    cp "${KVGATE_EARLIER_TARGET_DIR:-$root/target/earlier/build}/debug/kvgate" "$bin"
fi

# Releases before `server.admin_listen` serve the admin API on the main listener and refuse the
# key; later ones need it, or they would bind their own fixed admin port.
if git -C "$root" grep -q 'admin_listen' "$commit" -- src/config; then admin_key=1; else admin_key=0; fi

echo "earlier release: $commit ($bin)"
cd "$root"
KVGATE_EARLIER_BIN="$bin" KVGATE_EARLIER_ADMIN_LISTEN=$admin_key \
    cargo test --test gossip_upgrade -- --ignored --nocapture
