"""Peers and availability (spec §12): the peer site, deltas, snapshots, membership, the state
file."""
