module llog.local/minio-server

go 1.24.0

require github.com/minio/minio v0.0.0-20260212201848-7aac2a2c5b7c
