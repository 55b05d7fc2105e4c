"""Ray clusters: GPU workers, the Ray process reaper, and the cluster configs beside them."""
