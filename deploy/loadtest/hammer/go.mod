module llog.local/loadtest/hammer

go 1.24
