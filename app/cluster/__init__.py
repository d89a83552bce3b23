"""Brokers as a cluster: membership, preferred appenders and forwarding."""
