# Sourced: `earlier_tree <repo-root> <commit>` checks an earlier release out into a temporary
# git worktree, sets `tree` to its path, and removes it (and its directory) when the shell exits.

earlier_tree() {
    local root=$1 commit=$2
    _earlier_work=$(mktemp -d)
    _earlier_root=$root
    trap 'git -C "$_earlier_root" worktree remove --force "$_earlier_work/tree" >/dev/null 2>&1 || true; rm -rf "$_earlier_work"' EXIT
    git -C "$root" worktree add --detach "$_earlier_work/tree" "$commit" >/dev/null
    tree="$_earlier_work/tree"
}
