# Sourced: `earlier_tree <repo-root> <commit> [<dir>]` checks an earlier release out into a git
# worktree (in <dir>, else a temporary directory), sets `tree` to its path, and removes it when
# the shell exits or `earlier_tree_remove` is called.

earlier_tree() {
    local root=$1 commit=$2
    _earlier_root=$root
    if [[ -n ${3:-} ]]; then
        _earlier_work=""
        tree=$3
    else
        _earlier_work=$(mktemp -d)
        tree="$_earlier_work/tree"
    fi
    trap earlier_tree_remove EXIT
    # A checkout left by an interrupted run is replaced.
    git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true
    rm -rf "$tree"
    git -C "$root" worktree prune
    git -C "$root" worktree add --detach "$tree" "$commit" >/dev/null
}

earlier_tree_remove() {
    if [[ -n ${tree:-} ]]; then
        git -C "$_earlier_root" worktree remove --force "$tree" >/dev/null 2>&1 || true
        rm -rf "$tree"
    fi
    if [[ -n ${_earlier_work:-} ]]; then rm -rf "$_earlier_work"; fi
    tree=""
}
