#!/usr/bin/env bash
# shellcheck shell=bash
# Save what the restore drops as a patch, then restore the paths to the ref. $1 `check` only looks: it says
# whether the repo can be restored (nothing is written), so a recovery can ask before it stops the run.
# A repo in the middle of a rebase, merge, cherry-pick, revert or `git am` is refused (exit 40): a checkout
# of the paths would silently reset a conflicted file to the ref, losing the person's half-done resolution.
mode=$1 repo=$2 ref=$3 patch=$4; shift 4
set -e
cd -- "$repo"
op='' how=''
gitpath() { git rev-parse --git-path "$1"; }
if [ -d "$(gitpath rebase-merge)" ]; then op=rebase how="git rebase --continue"
elif [ -d "$(gitpath rebase-apply)" ]; then
  if [ -e "$(gitpath rebase-apply)/applying" ]; then op=am how="git am --continue"; else op=rebase how="git rebase --continue"; fi
elif [ -e "$(gitpath MERGE_HEAD)" ]; then op=merge how="git commit"
elif [ -e "$(gitpath CHERRY_PICK_HEAD)" ]; then op=cherry-pick how="git cherry-pick --continue"
elif [ -e "$(gitpath REVERT_HEAD)" ]; then op=revert how="git revert --continue"
fi
conflicted=$(git diff --name-only --diff-filter=U | paste -sd ' ' -)
if [ -n "$op" ]; then
  echo "$repo is in the middle of a git $op${conflicted:+, with conflicts in: $conflicted}; nothing was restored"
  echo "finish it (resolve, git add, $how) or abort it (git $op --abort), then recover again"
  exit 40
fi
if [ -n "$conflicted" ]; then
  echo "$repo has unmerged files (a conflict left in the index): $conflicted; nothing was restored"
  echo "resolve them (edit, git add) or drop the conflict (git checkout -m FILE / git reset FILE), then recover again"
  exit 40
fi
[ "$mode" = check ] && { echo "restorable"; exit 0; }
# Everything that differs from the ref, committed later or not: exactly what the restore drops.
if ! git diff --quiet "$ref" -- "$@"; then
  mkdir -p "$(dirname "$patch")"
  git diff --binary "$ref" -- "$@" > "$patch.tmp" && mv -f "$patch.tmp" "$patch"
  echo "saved $patch"
fi
git checkout "$ref" -- "$@"
echo "ref $(git rev-parse "$ref^{commit}")"
echo "head $(git rev-parse HEAD)"
