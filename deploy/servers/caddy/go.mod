module llog.local/caddy-server

go 1.26.0

require github.com/caddyserver/caddy/v2 v2.11.9
