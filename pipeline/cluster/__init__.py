"""Several hosts, one program: joining the run, global arrays, and the leader/follower protocol."""
