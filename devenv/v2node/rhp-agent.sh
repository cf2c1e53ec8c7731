#!/bin/bash
# The v2 node's command agent (rhp-agent.service). The host shares a directory over virtio-9p
# (mount tag "xfer") and, when it shares the repository, that too (tag "repo", mounted at the
# path the kernel command line names with rhp.repo=). The host writes jobs/<id>.sh (atomically,
# by rename); the agent runs each with bash in the background and writes <id>.out, <id>.err and,
# last, <id>.rc. "ready" says the agent is up. No network is involved.
set -u
mkdir -p /mnt/xfer
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 xfer /mnt/xfer
repo=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^rhp\.repo=//p')
if [[ -n $repo ]]; then
  mkdir -p "$repo"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 repo "$repo"
fi
J=/mnt/xfer/jobs
mkdir -p "$J"
date +%s.%N >/mnt/xfer/ready.tmp && mv /mnt/xfer/ready.tmp /mnt/xfer/ready
while :; do
  for f in "$J"/*.sh; do
    [[ -e $f ]] || continue
    id=${f%.sh}
    mv "$f" "$id.run" || continue
    (
      cd / && setsid bash "$id.run" >"$id.out" 2>"$id.err" </dev/null
      echo $? >"$id.rc.tmp"
      mv "$id.rc.tmp" "$id.rc"
    ) &
  done
  sleep 0.1
done
