#!/usr/bin/env bash
# Writes the golden wire samples of an earlier release: compiles samples.rs against the gossip
# crate at a git ref and seals every sample with that release's encoders.
#
#   crates/gossip/tests/wire_golden/regenerate.sh <git-ref> <out-file>
#
# The current release's file (current.txt) is written by the test itself instead:
#   KVGATE_UPDATE_GOLDEN=1 cargo test -p kvgate-gossip --test wire_golden
set -euo pipefail

ref=${1:?usage: regenerate.sh <git-ref> <out-file>}
out=${2:?usage: regenerate.sh <git-ref> <out-file>}
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
commit=$(git -C "$root" rev-parse --verify "$ref^{commit}")
out=$(realpath -m "$out")

# shellcheck source=../../../../tests/lib/earlier_tree.sh
source "$root/tests/lib/earlier_tree.sh"
earlier_tree "$root" "$commit"
target=$(dirname "$tree")/target
gen="$tree/crates/gossip/tests/golden_generate"
mkdir -p "$gen"
cp "$here/samples.rs" "$gen/samples.rs"
cat >"$gen/main.rs" <<'RS'
mod samples;

#[test]
fn write() {
    let path = std::env::var("GOLDEN_OUT").expect("GOLDEN_OUT names the file to write");
    let commit = std::env::var("GOLDEN_COMMIT").expect("GOLDEN_COMMIT names the release");
    let body = samples::render(&samples::payloads());
    std::fs::write(path, format!("# written by the release at {commit}\n{body}")).expect("writing");
}
RS

# Its own target directory: an earlier release's lock file may pin other versions.
GOLDEN_OUT="$out" GOLDEN_COMMIT="$commit" CARGO_TARGET_DIR="$target" \
    cargo test --quiet --manifest-path "$tree/Cargo.toml" -p kvgate-gossip \
    --test golden_generate -- --exact write
echo "wrote $out from $commit"
