module llog.local/httpload

go 1.22

require llog.local/loadtest/latency v0.0.0

require github.com/HdrHistogram/hdrhistogram-go v1.1.2 // indirect

replace llog.local/loadtest/latency => ../../deploy/loadtest/latency
