module llog.local/httpload

go 1.22
