"""Access control at the HTTP edge: who is calling (API keys, JWTs), what they may do
(ACLs on topics and consumer groups), how much (quotas). Off unless ``LLOG_AUTH=on``;
docs/operations.md, Security, describes it for operators."""
