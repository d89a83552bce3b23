module llog.local/promtool

go 1.26.0

require github.com/prometheus/prometheus v0.303.0
