module llog.local/oxia-server

go 1.24.2

require github.com/oxia-db/oxia v0.14.0
