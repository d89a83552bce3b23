module llog.local/loadtest/hammer

go 1.24

require llog.local/loadtest/latency v0.0.0

require github.com/HdrHistogram/hdrhistogram-go v1.1.2 // indirect

replace llog.local/loadtest/latency => ../latency
