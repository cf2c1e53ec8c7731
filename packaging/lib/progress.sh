# shellcheck shell=bash
# Progress lines for the long builds (packaging/deb/build.sh, packaging/image/build.sh,
# packaging/wheel/build.sh, scripts/build-kube.sh, scripts/build-critest.sh, scripts/build-helm.sh,
# scripts/build-v2node.sh),
# on stderr so that stdout keeps only what a script prints for machines. Source it, then:
#   rhp_step WHAT          one line: "NAME: [  12s] WHAT", the seconds since the script started
#   rhp_run WHAT CMD...    rhp_step WHAT, run CMD, a line every RHP_PROGRESS_EVERY seconds (30) while
#                          it runs, and one with how long it took; returns CMD's exit code
#   rhp_done               the last line: "NAME: [  95s] done"
# NAME is RHP_PROGRESS_NAME (default: the script's file name).

RHP_PROGRESS_NAME=${RHP_PROGRESS_NAME:-$(basename "$0")}
_rhp_t0=$SECONDS

rhp_step() {
  printf '%s: [%4ds] %s\n' "$RHP_PROGRESS_NAME" "$((SECONDS - _rhp_t0))" "$*" >&2
}

rhp_run() {
  local what=$1 start=$SECONDS every=${RHP_PROGRESS_EVERY:-30} ticker rc=0
  shift
  rhp_step "$what"
  (
    while :; do
      sleep "$every" </dev/null >/dev/null 2>&1  # the sleep holds none of the caller's pipes
      rhp_step "$what: still running after $((SECONDS - start)) s"
    done
  ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if ((rc)); then
    rhp_step "$what: failed after $((SECONDS - start)) s (exit $rc)"
  else
    rhp_step "$what: took $((SECONDS - start)) s"
  fi
  return "$rc"
}

rhp_done() {
  rhp_step "done"
}
