"""runtime-hook-proxy's node runtime shim: a CRI v1 proxy in front of containerd."""
