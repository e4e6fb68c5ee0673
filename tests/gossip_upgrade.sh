#!/usr/bin/env bash
# A rolling upgrade's middle, for real: builds the kvgate binary of earlier releases from git
# history and runs tests/gossip_upgrade.rs once per release, where that binary gossips with this
# release's gateway in front of the same engines.
#
#   tests/gossip_upgrade.sh [<git-ref>...]
#
# Default releases: 0d86d74, the last before `load_sized`, and ca180e1, the first with usage
# datagrams (the two releases of the wire golden files, crates/gossip/tests/wire_golden).
#
# Each earlier binary is cached under target/earlier/ by commit. It is built in this tree's own
# target directory, so the dependencies already compiled here are reused; that build leaves its
# `kvgate` in target/debug/, where this tree's tests look for theirs, so this tree's binary is
# put back afterwards. CI runs this (.ci/run) unless its clone is shallow: a release is built
# from its commit, which must be in the history.
set -euo pipefail

refs=("$@")
if [[ ${#refs[@]} -eq 0 ]]; then refs=(0d86d74 ca180e1); fi
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
target=${CARGO_TARGET_DIR:-$root/target}
cd "$root"

# shellcheck source=lib/earlier_tree.sh
source "$root/tests/lib/earlier_tree.sh"

own=$target/debug/kvgate
saved=$root/target/earlier/kvgate.this-tree

# Puts this tree's `kvgate` back in target/debug/ (or removes the earlier one if this tree had
# none there), however the build ended.
restore_own() {
    if [[ -e $saved ]]; then mv "$saved" "$own"; elif [[ -n ${building:-} ]]; then rm -f "$own"; fi
    building=""
}

# Builds `$1` (a commit) into target/earlier/kvgate-<commit> unless it is there already.
build_earlier() {
    local commit=$1 bin=$root/target/earlier/kvgate-$1
    [[ -x $bin ]] && return 0
    mkdir -p "$root/target/earlier"
    rm -f "$saved"
    if [[ -e $own ]]; then cp -p "$own" "$saved"; fi
    building=1
    # A fixed checkout path keeps the earlier crates' build hashes, and so their artifacts, the
    # same from one run to the next.
    earlier_tree "$root" "$commit" "$root/target/earlier/src"
    trap 'restore_own; earlier_tree_remove' EXIT
    CARGO_TARGET_DIR="$target" cargo build --quiet --manifest-path "$tree/Cargo.toml" --bin kvgate
    cp "$own" "$bin.partial" && mv "$bin.partial" "$bin"
    restore_own
    earlier_tree_remove
}

for ref in "${refs[@]}"; do
    if ! commit=$(git -C "$root" rev-parse --quiet --verify "$ref^{commit}"); then
        echo "gossip_upgrade: $ref is not in this clone's history" >&2
        exit 1
    fi
    build_earlier "$commit"
    # Releases before `server.admin_listen` serve the admin API on the main listener and refuse
    # the key; later ones need it, or they would bind their own fixed admin port.
    if git -C "$root" grep -q 'admin_listen' "$commit" -- src/config; then admin_key=1; else admin_key=0; fi
    echo "earlier release: $commit"
    # `--workspace`: the features the whole suite resolved, so its build is reused as it is.
    KVGATE_EARLIER_BIN="$root/target/earlier/kvgate-$commit" KVGATE_EARLIER_ADMIN_LISTEN=$admin_key \
        cargo test --quiet --workspace --test gossip_upgrade -- --ignored
done
