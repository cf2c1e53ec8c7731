"""Where state lives: the pod and container store rebuilt from the runtime, the node config
(file or cluster) and the node facts read from sysfs."""
