"""Load tests: scenarios, orchestrator, routing, collector, summary and report (`llog loadtest`)."""
