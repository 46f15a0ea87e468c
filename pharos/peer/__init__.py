"""Peers and availability: the peer site, deltas, snapshots, membership, the state file."""
