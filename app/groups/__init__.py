"""Consumer groups without a coordinator: membership leases, generations and committed
offsets in Oxia, assignment by a deterministic function any broker computes
(docs/protocol.md, Consumer groups)."""
