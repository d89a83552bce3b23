module llog.local/loadtest/latency

go 1.22

require github.com/HdrHistogram/hdrhistogram-go v1.1.2
