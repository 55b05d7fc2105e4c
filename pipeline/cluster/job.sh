#!/usr/bin/env bash
# The RayJob's driver (rayjob.yaml), run on the head pod with RAY_ADDRESS set by KubeRay:
# `dvc repro` of the given stages (default: sweep train) on that Ray cluster, then
# everything the run made is saved before KubeRay deletes the cluster:
#   1. the DVC-cached outputs (models/, data/) and the run cache go to the DVC remote
#      $CAPSNET_DVC_REMOTE (s3://bucket/prefix, or a directory; $CAPSNET_DVC_ENDPOINT for an
#      S3-compatible server), through dvc_remote.sh, the path the tests push and pull by;
#   2. dvc.lock and the git-tracked outputs (sweep/results.csv, best.json, plots) are
#      committed on a new branch, $CAPSNET_RUN_NAME (default cluster-run-<UTC time>),
#      and pushed to the git remote $CAPSNET_GIT_REMOTE.
# Elsewhere, `git fetch && git checkout <branch> && dvc pull` restores all of it.
# Both remotes are checked before any stage runs.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "pipeline/cluster/job.sh: $*" >&2; exit 1; }
[ -n "${CAPSNET_DVC_REMOTE:-}" ] \
  || fail "set CAPSNET_DVC_REMOTE to the DVC remote for the outputs (s3://bucket/prefix)"
[ -n "${CAPSNET_GIT_REMOTE:-}" ] \
  || fail "set CAPSNET_GIT_REMOTE to a git URL this job may push its results branch to"
[ -d .git ] || fail "$(pwd) is not a git checkout; build the image from a clone (Dockerfile)"
[ -z "$(git status --porcelain)" ] \
  || fail "the checkout in $(pwd) has uncommitted changes; build the image from a clean clone"
[ $# -gt 0 ] || set -- sweep train

branch="${CAPSNET_RUN_NAME:-cluster-run-$(date -u +%Y%m%dT%H%M%SZ)}"
export GIT_AUTHOR_NAME="${GIT_AUTHOR_NAME:-capsnet RayJob}"
export GIT_AUTHOR_EMAIL="${GIT_AUTHOR_EMAIL:-capsnet-rayjob@localhost}"
export GIT_COMMITTER_NAME="$GIT_AUTHOR_NAME" GIT_COMMITTER_EMAIL="$GIT_AUTHOR_EMAIL"
git push --dry-run --quiet "$CAPSNET_GIT_REMOTE" "HEAD:refs/heads/$branch" \
  || fail "cannot push branch $branch to CAPSNET_GIT_REMOTE (credentials? branch exists?)"
bash pipeline/cluster/dvc_remote.sh add

dvc repro --pull "$@"
bash pipeline/cluster/dvc_remote.sh push "$@"

git checkout --quiet -b "$branch"
git add --all   # a fresh checkout: what is not ignored is dvc.lock and the stage outputs
git diff --cached --quiet || git commit --quiet -m "cluster run $branch: dvc repro $*"
git push --quiet "$CAPSNET_GIT_REMOTE" "HEAD:refs/heads/$branch"
echo "pushed the DVC outputs to $CAPSNET_DVC_REMOTE and branch $branch (dvc.lock, results)"
