"""Where plans are applied: the one applier and the cgroup and resctrl file trees it writes."""
