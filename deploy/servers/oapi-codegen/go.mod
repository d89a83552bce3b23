module llog.local/oapi-codegen

go 1.26.0

require github.com/oapi-codegen/oapi-codegen/v2 v2.8.2
