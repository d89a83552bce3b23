"""Binary bodies of the HTTP API: the produce envelope and the records answer
(docs/http-api.md, Binary bodies). Encoders and decoders of both sides live here, so the
broker, the benchmarks and the tests share one definition."""
