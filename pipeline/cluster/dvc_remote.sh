#!/usr/bin/env bash
# The DVC remote of a run, one path for the cluster job (job.sh) and the tests
# (tests/pipeline/test_dvc_s3_remote.py), run in the DVC project's root:
#   dvc_remote.sh add              the remote "job" = $CAPSNET_DVC_REMOTE (s3://bucket/prefix
#                                  or a directory), the default, in .dvc/config.local; with
#                                  $CAPSNET_DVC_ENDPOINT (http://host:port) an S3-compatible
#                                  server instead of AWS (MinIO, Ceph, moto)
#   dvc_remote.sh push [STAGE...]  add, then the stages' DVC-cached outputs with their
#                                  dependencies' and the run cache (stages without outputs,
#                                  such as the sweep, restore from it) go to the remote
# S3 credentials come from the usual AWS variables or ~/.aws (dvc-s3, the cluster extra).
set -euo pipefail

fail() { echo "pipeline/cluster/dvc_remote.sh: $*" >&2; exit 2; }
[ -n "${CAPSNET_DVC_REMOTE:-}" ] \
  || fail "set CAPSNET_DVC_REMOTE to the DVC remote for the outputs (s3://bucket/prefix)"

add() {
  dvc remote add --local --default --force job "$CAPSNET_DVC_REMOTE"
  if [ -n "${CAPSNET_DVC_ENDPOINT:-}" ]; then
    dvc remote modify --local job endpointurl "$CAPSNET_DVC_ENDPOINT"
  fi
}

case "${1:-}" in
  add) add ;;
  push) shift; add; dvc push --run-cache --with-deps "$@" ;;
  *) fail "usage: dvc_remote.sh add | push [STAGE...]" ;;
esac
