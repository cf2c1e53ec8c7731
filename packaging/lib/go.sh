# shellcheck shell=bash
# Which Go toolchain the builds use (scripts/build-kube.sh, scripts/build-critest.sh,
# scripts/build-helm.sh, scripts/build-koord.sh, benchmarks/transport/setup.sh). Source it, then:
#   GO=$(rhp_go MIN)   $GO when it is set; else the newest of every `go` on PATH and
#                      /usr/local/go/bin/go, if that is at least MIN (e.g. 1.24); else nothing on
#                      stdout, a reason on stderr and status 1
# The newest of a fixed set, not the first on PATH: Debian's golang-go puts an older Go at
# /usr/bin/go, which a short PATH (a test's, a unit's) finds before /usr/local/go/bin. The build
# caches are keyed by the Go version, so every caller has to pick the same toolchain to find the
# binary another one built.

# go1.26.8 -> 1026008; go1.25rc1 -> 1025000; anything else -> no output, status 1
_rhp_go_number() {
  local major minor patch
  [[ $1 =~ ^go([0-9]{1,3})\.([0-9]{1,3})(\.([0-9]{1,3}))? ]] || return 1
  major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} patch=${BASH_REMATCH[4]:-0}
  printf '%d\n' "$((10#$major * 1000000 + 10#$minor * 1000 + 10#$patch))"
}

rhp_go() {
  local min=${1:-1.24} want best='' best_n=0 candidate n
  if [[ -n ${GO:-} ]]; then
    printf '%s\n' "$GO"
    return 0
  fi
  want=$(_rhp_go_number "go$min") || {
    echo "rhp_go: not a Go version: $min" >&2
    return 2
  }
  for candidate in $(type -ap go) /usr/local/go/bin/go; do
    [[ -x $candidate ]] || continue
    n=$(_rhp_go_number "$(GOTOOLCHAIN=local "$candidate" env GOVERSION 2>/dev/null)") || continue
    if ((n > best_n)); then
      best=$candidate
      best_n=$n
    fi
  done
  if [[ -z $best ]]; then
    echo "no Go toolchain (neither \`go\` on PATH nor /usr/local/go/bin/go): install Go $min or later" >&2
    return 1
  fi
  if ((best_n < want)); then
    echo "the newest Go here ($best, $("$best" env GOVERSION)) is older than $min: install Go $min or later" >&2
    return 1
  fi
  printf '%s\n' "$best"
}
